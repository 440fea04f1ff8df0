"""Speculative decoding: lossless verification, commit and rollback, stops inside draft runs.

Random weights accept almost nothing, so most tests use an oracle proposer that drafts the
true continuation (taken from a plain run) with a planted error: it makes every path of
verification and commit run with long accepted runs.
"""

from __future__ import annotations

import pytest
import torch
from runtime_engines import small_drafter, small_target, write_engine
from test_runtime import PROMPTS

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.sampling import sample
from kolibri_trt.spec.copy_proposer import CopyIndex
from kolibri_trt.spec.verify import rejection_sample, verify, verify_batch

MODES = ["copy", "drafter", "copy+drafter"]


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    target = small_target(window=24)
    return write_engine(tmp_path_factory.mktemp("spec"), target, small_drafter(target))


@pytest.fixture(scope="module")
def llms(engine_dir):
    return {m: LLM(engine_dir, speculative=m, max_num_batched_tokens=64)
            for m in ["off", *MODES]}


PARAMS = [SamplingParams(max_tokens=24, ignore_eos=True),
          SamplingParams(max_tokens=24, temperature=0.8, seed=11, ignore_eos=True),
          SamplingParams(max_tokens=24, temperature=1.2, top_k=50, seed=12, ignore_eos=True)]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_equals_off_in_a_batch_and_alone(llms, mode):
    for params in PARAMS:
        off = llms["off"].generate(PROMPTS, params)
        spec = llms[mode].generate(PROMPTS, params)
        assert [o.token_ids for o in spec] == [o.token_ids for o in off]
        assert [o.text for o in spec] == [o.text for o in off]
    alone = llms[mode].generate(PROMPTS[2], PARAMS[1])[0]
    assert alone.token_ids == llms["off"].generate(PROMPTS[2], PARAMS[1])[0].token_ids
    if "drafter" in mode:
        assert llms[mode].engine.stats.proposed["drafter_row0"] > 0


class Oracle:
    """Drafts the plain run's continuation, wrong at draft index `wrong` (None: never)."""

    def __init__(self, llm, prompts, params, k, wrong=None, every=1):
        self.truth = {}
        for p, out in zip(prompts, llm.generate(prompts, params)):
            self.truth[tuple(out.prompt_token_ids)] = out.token_ids
        self.k, self.wrong, self.every, self.calls = k, wrong, every, 0

    def __call__(self, request_id, tokens, room):
        self.calls += 1
        if self.calls % self.every:
            return []                                       # a step without drafts
        for prompt, out in self.truth.items():
            if tuple(tokens[:len(prompt)]) == prompt:
                n = len(tokens) - len(prompt)
                drafts = list(out[n:n + min(self.k, room)])
                if self.wrong is not None and self.wrong < len(drafts):
                    drafts[self.wrong] = (drafts[self.wrong] + 1) % 2000
                return drafts
        return []


def _run_with(llm, oracle, prompts, params):
    saved = llm.engine.speculator.propose_copy
    llm.engine.speculator.propose_copy = oracle
    try:
        return llm.generate(prompts, params)
    finally:
        llm.engine.speculator.propose_copy = saved


@pytest.mark.parametrize("wrong, every", [(None, 1), (0, 1), (3, 1), (2, 2)])
def test_oracle_drafts_long_runs_stay_lossless(llms, wrong, every):
    llm = llms["copy"]
    for params in PARAMS[:2]:
        plain = llms["off"].generate(PROMPTS, params)
        oracle = Oracle(llms["off"], PROMPTS, params, k=6, wrong=wrong, every=every)
        outs = _run_with(llm, oracle, PROMPTS, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
        acc = sum(o.metrics.spec.accepted["copy"] for o in outs)
        if wrong is None:
            assert acc > 0 and max(o.metrics.spec.acceptance_length for o in outs) > 3
        if wrong == 0:
            assert acc == 0


def test_streams_with_different_draft_lengths_in_one_pass(llms):
    llm, params = llms["copy"], PARAMS[1]
    lengths = {}

    def ragged(request_id, tokens, room):
        k = lengths.setdefault(request_id, len(lengths) % 4)   # 0, 1, 2, 3 drafts
        return oracle(request_id, tokens, min(room, k))
    oracle = Oracle(llms["off"], PROMPTS, params, k=8)
    outs = _run_with(llm, ragged, PROMPTS, params)
    alone = [llms["off"].generate(p, params)[0].token_ids for p in PROMPTS]
    assert [o.token_ids for o in outs] == alone


def test_eos_and_max_tokens_inside_an_accepted_run(llms):
    llm, params = llms["copy"], PARAMS[0]
    plain = llms["off"].generate(PROMPTS[0], params)[0]
    stop_id = plain.token_ids[7]
    cut = plain.token_ids.index(stop_id)
    stop_params = SamplingParams(max_tokens=24, stop_token_ids=[stop_id], ignore_eos=True)
    oracle = Oracle(llms["off"], [PROMPTS[0]], params, k=8)
    out = _run_with(llm, oracle, [PROMPTS[0]], stop_params)[0]
    assert out.token_ids == plain.token_ids[:cut + 1] and out.finish_reason == "stop"
    short = SamplingParams(max_tokens=5, ignore_eos=True)
    out = _run_with(llm, Oracle(llms["off"], [PROMPTS[0]], params, k=8), [PROMPTS[0]], short)[0]
    assert out.token_ids == plain.token_ids[:5] and out.finish_reason == "length"


def test_two_stop_strings_later_listed_completes_earlier(llms):
    llm, params = llms["copy"], PARAMS[0]
    plain = llms["off"].generate(PROMPTS[6], params)[0]
    text = plain.text
    early, late = text[4:7], text[10:14]
    sp = SamplingParams(max_tokens=24, stop=[late, early], ignore_eos=True)
    out = _run_with(llm, Oracle(llms["off"], [PROMPTS[6]], params, k=8), [PROMPTS[6]], sp)[0]
    assert out.text == text[:min(text.find(early), text.find(late))]
    assert out.finish_reason == "stop"


def test_draft_bursts_cross_the_sliding_window(llms):
    # window 24 in these engines: 60 tokens with bursts of 7 cross it several times
    llm = llms["copy"]
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    plain = llms["off"].generate(PROMPTS[3], params)[0]
    out = _run_with(llm, Oracle(llms["off"], [PROMPTS[3]], params, k=7), [PROMPTS[3]], params)[0]
    assert out.token_ids == plain.token_ids
    assert out.metrics.spec.target_passes < 20


def test_multibyte_character_completed_inside_a_run_streams_whole(llms):
    # Tekken ids 1000..1255 are the 256 single bytes: "ß" = C3 9F as two tokens. Commit
    # "a", C3, 9F, "!" as one accepted run: the character appears whole, once, in the delta.
    from kolibri_trt.runtime.output import OutputProcessor
    llm = llms["copy"]
    proc = OutputProcessor(llm.tokenizer, SamplingParams(max_tokens=10), (2,), 10)
    deltas = [proc.append(1000 + b) for b in (ord("a"), 0xC3, 0x9F, ord("!"))]
    assert deltas == ["a", "", "ß", "!"] and proc.text == "aß!"
    # and end to end: streamed pieces of an oracle-drafted run join to the final text
    prompt, params = "Grüße aus Köln", SamplingParams(max_tokens=24, temperature=1.0, seed=5,
                                                         ignore_eos=True)
    text = llm.generate(prompt, params)[0].text
    oracle = Oracle(llms["off"], [prompt], params, k=5)
    llm.engine.speculator.propose_copy, saved = oracle, llm.engine.speculator.propose_copy
    try:
        pieces = list(llm.stream(prompt, params))
    finally:
        llm.engine.speculator.propose_copy = saved
    assert "".join(pieces) == text and oracle.calls > 0


def test_verify_is_a_pure_function_of_logits():
    logits = torch.randn(4, 50)
    g = SamplingParams(max_tokens=4)
    own = [int(i) for i in logits.argmax(-1)]
    v = verify(logits, own[:3], g, 0)
    assert v.tokens == own and v.num_accepted == 3
    v = verify(logits, [own[0], (own[1] + 1) % 50, own[2]], g, 0)
    assert v.tokens == own[:2] and v.num_accepted == 1
    with pytest.raises(ValueError, match="logits"):
        verify(logits, own[:2], g, 0)


def test_verify_batch_equals_one_call_per_stream():
    """Streams verified together (one sampling call) get the verdicts of separate calls."""
    torch.manual_seed(3)
    params = [SamplingParams(max_tokens=4), SamplingParams(temperature=0.8, seed=11),
              SamplingParams(temperature=1.2, seed=2, top_k=5), SamplingParams(max_tokens=9)]
    ks, firsts = [3, 0, 2, 1], [0, 7, 2, 40]
    logits = torch.randn(sum(k + 1 for k in ks), 50)
    drafts, r = [], 0
    for i, k in enumerate(ks):   # drafts: the first one right, then (stream 0) right or wrong
        own = sample(logits[r:r + k + 1], [params[i]] * (k + 1),
                     list(range(firsts[i], firsts[i] + k + 1))).tolist()
        drafts.append((own[:1] + [(t + i) % 50 for t in own[1:k]])[:k])
        r += k + 1
    single, r = [], 0
    for d, p, n in zip(drafts, params, firsts):
        single.append(verify(logits[r:r + len(d) + 1], d, p, n))
        r += len(d) + 1
    assert verify_batch(logits, drafts, params, firsts) == single
    assert [v.num_accepted for v in single] == [3, 0, 1, 1]
    with pytest.raises(ValueError, match="logits"):
        verify_batch(logits[1:], drafts, params, firsts)
    with pytest.raises(ValueError, match="lengths"):
        verify_batch(logits, drafts, params[:3], firsts)


def test_copy_index_cases():
    short = CopyIndex(2, 4)
    short.extend([7])
    assert short.propose(4) == []                              # shorter than any n-gram
    rep = CopyIndex(2, 4)
    rep.extend([5] * 30)
    assert rep.propose(8) == [5] * 8                           # every suffix matches: max drafts
    idx = CopyIndex(2, 3)
    idx.extend([1, 2, 3, 4, 9, 1, 2, 3])
    assert idx.propose(3) == [4, 9, 1]                         # longest suffix (1 2 3) wins
    idx.extend([8])
    assert idx.propose(3) == []                                # 2 3 8 / 3 8 never seen before
    with pytest.raises(ValueError):
        CopyIndex(3, 2)


def test_rejection_sampling_keeps_the_target_distribution():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    q = torch.tensor([[0.2, 0.2, 0.6]])
    counts = torch.zeros(3)
    n = 6000
    for _ in range(n):
        x = int(torch.multinomial(q[0], 1, generator=g))
        counts[rejection_sample(p, q, [x], g).tokens[0]] += 1
    # first token must follow p[0]; binomial s.e. <= 0.0065 at n=6000, 4 sigma
    assert torch.allclose(counts / n, p[0], atol=0.026)


def test_rejection_sampling_with_deterministic_drafts_keeps_the_target_distribution():
    """Copy and drafter proposals are deterministic (q one-hot): a draft x is kept with
    probability p(x), else the residual p without x is sampled; the first token follows p."""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    q = torch.tensor([[0.0, 0.0, 1.0]])
    counts = torch.zeros(3)
    n = 6000
    for _ in range(n):
        counts[rejection_sample(p, q, [2], g).tokens[0]] += 1
    # binomial s.e. <= 0.0065 at n=6000, 4 sigma
    assert torch.allclose(counts / n, p[0], atol=0.026)


def test_engine_rejection_sampler_option(engine_dir, llms):
    """acceptance_method="rejection_sampler": greedy stays identical to off; sampled output is
    reproducible for a seed, and at a low temperature the greedy continuation as drafts (an
    oracle) is mostly accepted, each draft with probability p(draft)."""
    rs = LLM(engine_dir, speculative="copy", acceptance_method="rejection_sampler")
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    oracle = Oracle(llms["off"], PROMPTS[:2], greedy, k=4)
    plain = llms["off"].generate(PROMPTS[:2], greedy)
    outs = _run_with(rs, oracle, PROMPTS[:2], greedy)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    cold = SamplingParams(max_tokens=16, temperature=0.05, seed=3, ignore_eos=True)
    a = _run_with(rs, Oracle(llms["off"], PROMPTS[:2], greedy, k=4), PROMPTS[:2], cold)
    b = _run_with(rs, Oracle(llms["off"], PROMPTS[:2], greedy, k=4), PROMPTS[:2], cold)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert sum(o.metrics.spec.accepted["copy"] for o in a) > 0
    with pytest.raises(ValueError, match="acceptance_method"):
        LLM(engine_dir, speculative="copy", acceptance_method="typical")
