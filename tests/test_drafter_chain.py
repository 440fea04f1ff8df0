"""Chained drafter rounds (`spec/drafter_chain.py`): the round enqueued on the device while a
step is verified equals the round `PluginDrafterProposer.launch` stages after the step, in
drafts and in the ring it leaves; in the engine the tokens and every acceptance count stay
those of the unchained engine."""

from __future__ import annotations

import pytest
import torch

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.builder import BuildOptions, build_engine

from test_plugin_drafter import _proposers, make_engines

SEED = 5


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return make_engines(tmp_path_factory.mktemp("drafter-chain"))


def _taps(prop, n, g):
    cfg = prop.drafter.config
    return (torch.randn(n, cfg.num_taps, cfg.target_hidden_size, generator=g) * 3
            ).to(torch.bfloat16)


def _ring(prop):
    return prop.runner.ring.kv.clone(), prop.runner.ring.pos.clone()


def _step(props, tokens, drafts, accepted, g, chain_items=None):
    """One verified decode step of every stream on each proposer: the pass's taps written
    into the history (as the target's taps sink does), `chain` (on the proposers given in
    chain_items) before `observe`, then the committed tokens. drafts[rid]: the step's drafts,
    accepted[rid]: how many the target took. Returns the step's input ids and own tokens."""
    inputs, own, items, row = [], [], [], 0
    for rid, toks in tokens.items():
        d, a = drafts[rid], accepted[rid]
        start = len(toks) - 1
        ins = [toks[-1]] + d
        bonus = int(torch.randint(0, 2000, (1,), generator=g))
        mine = d[:a] + [bonus if a == len(d) else (d[a] + 1) % 2000] + [7] * (len(d) - a)
        inputs += ins
        own += mine
        items.append((rid, row, start, len(d)))
        row += len(ins)
        taps = _taps(props[0], len(ins), g)
        for prop in props:
            st = prop.streams[rid]
            prop.runner.write_history(st.slot, start, taps)
    own_t, in_t = torch.tensor(own), torch.tensor(inputs + [0, 0])
    for prop in props:
        if chain_items is not None and prop in chain_items:
            prop.chain(chain_items[prop] if chain_items[prop] is not None else items, own_t, in_t)
    row = 0
    for rid, toks in list(tokens.items()):
        d, a = drafts[rid], accepted[rid]
        start = len(toks) - 1
        for prop in props:
            prop.observe(rid, start, n=1 + a)
        tokens[rid] = toks + d[:a] + [own[row + a]]
        row += 1 + len(d)


def test_chained_round_equals_launched_round(engines):
    """Three streams, two steps: a launched round (kv_end = start - 1 after it), a verified
    step with 0 / 2 / 3 of 3 drafts accepted, then the next round launched after the step
    (A) or chained while the step is verified and taken by the launch (B): same drafts, same
    ring; a stream not in the chain makes B launch a round of its own, with the same result."""
    for partial in (False, True):
        _, a = _proposers(engines["bf16"], 1)
        _, b = _proposers(engines["bf16"], 1)
        for p in (a, b):
            p.enable_chain(max_drafts=4, max_tokens=32)
        g = torch.Generator().manual_seed(SEED)
        tokens = {f"r{i}": torch.randint(0, 2000, (n + 1,), generator=g).tolist()
                  for i, n in enumerate((5, 9, 14))}
        for rid, t in tokens.items():
            taps = _taps(a, len(t) - 1, g)
            for p in (a, b):
                p.observe(rid, 0, taps)
        items = list(tokens.items())
        first = {p: p.propose_batch(items) for p in (a, b)}
        assert first[a] == first[b]
        drafts = {rid: first[a][rid][:3] for rid in tokens}
        accepted = {"r0": 0, "r1": 2, "r2": 3}
        chain = None
        if partial:   # r2 not chained: B's launch must run a round of its own
            chain = [("r0", 0, len(tokens["r0"]) - 1, 3), ("r1", 4, len(tokens["r1"]) - 1, 3)]
        _step((a, b), tokens, drafts, accepted, g, chain_items={b: chain})
        assert set(b._chain[2]) == ({"r0", "r1"} if partial else set(tokens))
        items = list(tokens.items())
        got_a, got_b = a.propose_batch(items), b.propose_batch(items)
        assert got_a == got_b
        assert b.rounds_chained == (0 if partial else 1)
        for x, y in zip(_ring(a), _ring(b)):
            assert torch.equal(x, y)
        for rid in tokens:
            assert a.streams[rid].kv_end == b.streams[rid].kv_end


def test_chain_skips_streams_whose_last_round_is_not_behind_them(engines):
    """A stream whose last round was not anchored at start - 1 (kv_end lags) is not
    chained; with none left the proposer holds no chained round."""
    _, p = _proposers(engines["bf16"], 1)
    p.enable_chain(max_drafts=4, max_tokens=32)
    g = torch.Generator().manual_seed(SEED)
    toks = torch.randint(0, 2000, (7,), generator=g).tolist()
    p.observe("x", 0, _taps(p, 6, g))       # never drafted: kv_end 0, start 6
    p.chain([("x", 0, 6, 0)], torch.tensor([3]), torch.tensor([toks[-1], 0]))
    assert p._chain is None


@pytest.fixture(scope="module")
def default_engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("chain-default") / "e"
    engine, _ = build_engine(BuildOptions(target="cpu", weights="fp8-nvfp4", out=out,
                                          progress=False))
    return engine


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_chain_drafts_as_unchained(default_engine, temperature):
    """The trained default on the kernel path (CPU, no graphs), two streams at once: with
    chained rounds the tokens and every stream's accepted drafts per source equal those of
    the same engine launching its rounds after each step; rounds were chained. (Equality
    with `off` needs row-invariant target logits: the GPU kernels' property, checked by
    bench/gpu_runtime.py; the CPU references of the fp8 kernels can flip a near tie between
    a 1-token and a 9-token step.)"""
    prompts = ["Die Datei wird beim Start des Programms gelesen. Wenn sie fehlt,",
               "The parser reads the file line by line and stops at the first error, so"]
    params = SamplingParams(max_tokens=32, temperature=temperature, seed=3, ignore_eos=True)
    runs = {}
    for chain in (False, True):
        llm = LLM(default_engine, speculative="copy+drafter", max_num_seqs=2, max_model_len=256,
                  model_impl="plugins", enforce_eager=True, drafter_overlap=True,
                  drafts_on_device=True, drafter_chain=chain)
        runs["chained" if chain else "unchained"] = (llm, llm.generate(prompts, params))
    assert [o.token_ids for o in runs["chained"][1]] == \
        [o.token_ids for o in runs["unchained"][1]]
    for u, c in zip(runs["unchained"][1], runs["chained"][1]):
        assert u.metrics.spec.accepted == c.metrics.spec.accepted
        assert u.metrics.spec.proposed == c.metrics.spec.proposed
    assert runs["chained"][0].engine.speculator.drafter.rounds_chained > 0
    assert runs["unchained"][0].engine.speculator.drafter.rounds_chained == 0


def test_chain_needs_deferred_drafts(default_engine):
    with pytest.raises(ValueError, match="drafter_chain"):
        LLM(default_engine, speculative="copy+drafter", max_num_seqs=1, max_model_len=256,
            model_impl="plugins", enforce_eager=True, drafter_overlap=True,
            drafts_on_device=False, drafter_chain=True)


def test_chain_reads_bound_inputs_in_place(engines):
    """With `use_inputs` (the target's static input ids under graphs) the chain reads the ids
    there: the same round as from a copy; a step whose ids lie elsewhere (an eager step)
    chains nothing."""
    results = []
    for bind in (False, True):
        _, a = _proposers(engines["bf16"], 1)
        buffer = torch.zeros(40, dtype=torch.long)
        a.enable_chain(max_drafts=4, max_tokens=32, inputs=buffer if bind else None)
        g = torch.Generator().manual_seed(SEED)
        toks = torch.randint(0, 2000, (9,), generator=g).tolist()
        a.observe("x", 0, _taps(a, 8, g))
        a.propose_batch([("x", toks)])                # kv_end = 7 = start - 1
        a.runner.write_history(a.streams["x"].slot, 8, _taps(a, 3, g))
        buffer[:3] = torch.tensor([toks[-1], 11, 12])
        own = torch.tensor([11, 40, 41])              # draft 11 accepted, 12 not: a = 1
        if bind:
            a.chain([("x", 0, 8, 2)], own, torch.zeros(3, dtype=torch.long))
            assert a._chain is None                    # ids elsewhere: nothing chained
        a.chain([("x", 0, 8, 2)], own, buffer)
        a.observe("x", 8, n=2)
        results.append(a.propose_batch([("x", toks + [11, 40])]))
        assert a.rounds_chained == 1
    assert results[0] == results[1]


def test_chain_items_after_copy_or_misses_only():
    """`step_drafts.chain_items`: each stream's (id, first row, start, drafts); after_copy
    False leaves out the streams with copy drafts; a step with a prefill chunk chains none."""
    from kolibri_trt.runtime.scheduler import ScheduledSeq
    from kolibri_trt.runtime.sequence import Sequence
    from kolibri_trt.runtime.step_drafts import chain_items

    seqs = [Sequence(f"r{i}", [1, 2, 3, 4], SamplingParams()) for i in range(3)]
    sched = [ScheduledSeq(q, 3, 1) for q in seqs]
    extra = {"r0": [5, 6], "r1": [7, 8, 9]}
    drafts = {"r0": ([5, 6], ["copy", "copy"]),
              "r1": ([7, 8, 9], ["drafter_row0", "drafter_rows1+", "drafter_rows1+"])}
    every = chain_items(sched, extra, drafts, after_copy=True)
    assert every == [("r0", 0, 3, 2), ("r1", 3, 3, 3), ("r2", 7, 3, 0)]
    assert chain_items(sched, extra, drafts, after_copy=False) == [("r1", 3, 3, 3),
                                                                     ("r2", 7, 3, 0)]
    prefill = [ScheduledSeq(seqs[0], 0, 3)] + sched[1:]
    assert chain_items(prefill, extra, drafts) is None
