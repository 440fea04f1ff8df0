"""Drafter rounds overlapped with the host's work (`EngineArgs.drafter_overlap`,
`Speculator.prefetch`) and the drafts left on the device until verification
(`EngineArgs.drafts_on_device`), on CPU through the kernels' torch references: lossless, and
the target sees exactly the input ids of the engine that reads the drafts first. The same
on the H200: bench/gpu_runtime.py."""

from __future__ import annotations

import pytest
import torch

from kolibri_trt import LLM
from kolibri_trt.model.metadata import StepMetadata
from kolibri_trt.spec.plugin_drafter_proposer import PluginDrafterProposer

from test_plugin_drafter import LOSSLESS_PARAMS, make_engines, off_token_ids
from test_runtime import PROMPTS


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return make_engines(tmp_path_factory.mktemp("overlapped-drafter"))


@pytest.fixture(scope="module")
def off_tokens(engines):
    return off_token_ids(engines["fp8-nvfp4"])


@pytest.mark.parametrize("mode", ["drafter", "copy+drafter"])
def test_engine_with_overlapped_drafter_rounds_is_lossless(engines, off_tokens, mode):
    """drafter_overlap: each step's drafter round is launched right after the previous step
    (`Speculator.prefetch`; on CPU it runs at once) and collected where drafts are needed:
    the tokens of "off", and the drafts do come from the prefetched rounds."""
    llm = LLM(engines["fp8-nvfp4"], speculative=mode, model_impl="plugins",
              max_num_batched_tokens=64, drafter_overlap=True)
    spec = llm.engine.speculator
    assert spec.overlap and isinstance(spec.drafter, PluginDrafterProposer)
    collected, synchronous = [], []     # rounds ended (read on the host or with the tokens)
    collect, discard = spec.drafter.collect, spec.drafter.discard
    batch = spec.drafter.propose_batch
    spec.drafter.collect = lambda: collected.append(1) or collect()
    spec.drafter.discard = lambda: collected.append(1) or discard()
    spec.drafter.propose_batch = lambda items: synchronous.append(1) or batch(items)
    for p, want in zip(LOSSLESS_PARAMS, off_tokens):
        assert [o.token_ids for o in llm.generate(PROMPTS, p)] == want
    assert llm.engine.stats.proposed["drafter_row0"] > 0
    prefetched = len(collected) - len(synchronous)     # propose_batch collects once itself
    assert prefetched > len(synchronous)     # most rounds were prefetched, not run on demand
    with pytest.raises(ValueError, match="^drafter_overlap:"):
        LLM(engines["fp8-nvfp4"], speculative=mode, model_impl="reference",
            drafter_overlap=True)


def _generate_recording(llm, params) -> tuple[list, list, list]:
    """Generate PROMPTS with `params`, recording the target model's input ids of every pass
    (the padded step it ran) and what `Speculator.take_deferred` returned per step."""
    model, spec = llm.engine.runner.model, llm.engine.speculator
    ids, deferred = [], []
    forward, take = model.forward, spec.take_deferred
    model.forward = lambda meta, *a, **kw: ids.append(meta.input_ids.clone()) or forward(
        meta, *a, **kw)
    def take_and_record():
        d = take()
        deferred.append(d)
        return d
    spec.take_deferred = take_and_record
    outs = [o.token_ids for o in llm.generate(PROMPTS, params)]
    return outs, ids, deferred


def test_drafts_left_on_the_device_reach_the_target(engines, off_tokens):
    """drafts_on_device: the drafter's drafts stay on the device, the host builds the step
    with zeros in their place and reads them only at verification. The target must still see
    exactly the input ids of the engine that reads the drafts first (every pass, every token,
    greedy and sampled), and both give the tokens of "off"."""
    for p, want in zip(LOSSLESS_PARAMS, off_tokens):
        got = {}
        for on in (False, True):
            llm = LLM(engines["fp8-nvfp4"], speculative="copy+drafter", model_impl="plugins",
                      max_num_batched_tokens=64, drafter_overlap=True, drafts_on_device=on)
            assert llm.engine.speculator.defer is on
            got[on] = _generate_recording(llm, p)
            assert got[on][0] == want
        (_, ids_host, d_host), (_, ids_dev, d_dev) = got[False], got[True]
        assert all(d is None for d in d_host)
        assert sum(d is not None for d in d_dev) >= 3       # rounds were left on the device
        assert len(ids_dev) == len(ids_host)
        assert all(torch.equal(a, b) for a, b in zip(ids_dev, ids_host))


def test_rejection_sampling_reads_drafts_left_on_the_device_first(engines):
    """acceptance_method="rejection_sampler" with the drafts on the device: a sampled stream's
    drafts are read on the host before verification (`resolve_deferred`), and the outputs
    equal those of the engine that reads every round's drafts first, greedy and sampled."""
    outs, resolved = {}, []
    for on in (False, True):
        llm = LLM(engines["fp8-nvfp4"], speculative="copy+drafter", model_impl="plugins",
                  max_num_batched_tokens=64, drafter_overlap=True, drafts_on_device=on,
                  acceptance_method="rejection_sampler")
        spec = llm.engine.speculator
        resolve = spec.resolve_deferred
        spec.resolve_deferred = lambda resolve=resolve: resolved.append(on) or resolve()
        outs[on] = [[o.token_ids for o in llm.generate(PROMPTS, p)] for p in LOSSLESS_PARAMS]
    assert outs[True] == outs[False]
    assert resolved and all(resolved)       # only the engine with device drafts resolves


def test_drafts_on_device_needs_the_single_device_kernel_path(engines):
    """drafts_on_device=True on the reference path raises, naming the option."""
    with pytest.raises(ValueError, match="^drafts_on_device:"):
        LLM(engines["fp8-nvfp4"], speculative="copy+drafter", model_impl="reference",
            drafts_on_device=True)


def test_the_target_runner_reads_the_drafters_fixed_buffer(engines):
    """With drafts on the device the target runner takes them from the drafter runner's
    `drafts_out` inside its (bucketed) step; other values, or a source set after a capture,
    are refused, naming the argument."""
    llm = LLM(engines["fp8-nvfp4"], speculative="copy+drafter", model_impl="plugins",
              max_num_batched_tokens=64, drafter_overlap=True, drafts_on_device=True)
    runner, drafter = llm.engine.runner, llm.engine.speculator.drafter
    assert runner.draft_source is drafter.runner.drafts_out
    with pytest.raises(ValueError, match="^values:"):
        runner.use_draft_source(torch.zeros(4))
    step = StepMetadata(                     # a bucketed step: one stream, 2 tokens
        input_ids=torch.tensor([5, 0]), positions=torch.tensor([3, 4]),
        cu_q_lens=torch.tensor([0, 2], dtype=torch.int32),
        seq_lens=torch.tensor([5], dtype=torch.int32),
        full_block_tables=torch.zeros(1, 1, dtype=torch.int32),
        sliding_block_tables=torch.zeros(1, 1, dtype=torch.int32),
        full_slots=torch.tensor([-1, -1]), sliding_slots=torch.tensor([-1, -1]),
        logits_rows=torch.tensor([0, 1]), q_lens=(2,), seq_lens_host=(5,))
    with pytest.raises(ValueError, match="^draft_ids:"):
        runner.forward(step, (), draft_ids=([1], [0], torch.zeros(4, dtype=torch.long)))
    drafter.runner.drafts_out[0] = 77
    runner.forward(step, (), draft_ids=([1], [0], drafter.runner.drafts_out[:4]))
    assert runner.static["input_ids"][:2].tolist() == [5, 77]
    runner.graphs[(1, 2, ())] = None          # as if a graph had been captured
    with pytest.raises(ValueError, match="^use_draft_source:"):
        runner.use_draft_source(drafter.runner.drafts_out)
