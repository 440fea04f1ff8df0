"""The drafter's taps history (`DrafterRunner.history`) on CPU: rows written in pieces wrap
per slot and keep the last context window; the target's passes writing the taps themselves
(`PluginRunner.use_taps_sink`) give the drafts of taps written by `observe`."""

from __future__ import annotations

import pytest
import torch

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.spec.drafter_runner import DrafterRunner

from test_plugin_drafter import CONTEXT_WINDOW, _proposers, make_engines
from test_runtime import PROMPTS


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return make_engines(tmp_path_factory.mktemp("drafter-history"))


def test_taps_history_rows_wrap_and_keep_the_last_context_window(engines):
    """`DrafterRunner`'s taps history: taps written in pieces of 1 .. W + 2 rows (W =
    context_window + step_tokens rows per slot, so the slot's rows wrap several times) leave
    every one of the last context_window + 1 positions at `history_row`, other slots
    untouched; `history_dst` marks -1 the rows a long pass does not keep, and all rows of a
    stream without a slot."""
    _, prop = _proposers(engines["bf16"], 1, max_streams=3)
    runner = DrafterRunner(prop.drafter, 1, 3, use_graphs=False, step_tokens=4)
    cfg, w = prop.drafter.config, runner.history_rows
    assert w == CONTEXT_WINDOW + 4
    g = torch.Generator().manual_seed(3)
    taps = torch.randn(3 * w + 5, cfg.num_taps, cfg.target_hidden_size, generator=g
                       ).to(torch.bfloat16)
    start = 0
    for n in (1, 5, w + 2, 2, w, 3, 7, 4, 1000):
        n = min(n, taps.shape[0] - start)
        runner.write_history(1, start, taps[start:start + n])
        start += n
    assert start == taps.shape[0]
    last = taps.shape[0] - 1
    for q in range(last - CONTEXT_WINDOW, last + 1):
        assert torch.equal(runner.history[runner.history_row(1, q)], taps[q])
    others = torch.cat([runner.history[:w], runner.history[2 * w:]])
    assert (others == 0).all()
    dst = runner.history_dst(2, 30, 20)
    assert dst[:20 - (CONTEXT_WINDOW + 1)] == [-1] * (20 - CONTEXT_WINDOW - 1)
    assert dst[-(CONTEXT_WINDOW + 1):] == [runner.history_row(2, q) for q in range(41, 50)]
    assert runner.history_dst(None, 5, 3) == [-1, -1, -1]


@pytest.mark.parametrize("mode", ["drafter", "copy+drafter"])
def test_taps_written_by_the_target_give_the_drafts_of_observed_taps(engines, mode):
    """The engine's target passes write the taps into the drafter's history themselves
    (`PluginRunner.use_taps_sink`, `PluginDrafterProposer.taps_dst`); with the sink switched
    off the taps come back and `observe` writes them: every round drafts the same tokens
    either way (prefill chunks of 16, streams longer than the history's rows)."""
    logs = []
    for sink in (True, False):
        llm = LLM(engines["fp8-nvfp4"], speculative=mode, model_impl="plugins",
                  max_num_batched_tokens=16)
        prop, log = llm.engine.speculator.drafter, []
        assert llm.engine.runner.taps_sink is prop.runner.history
        if not sink:
            llm.engine.runner.taps_sink = None
        inner = prop.propose_batch
        prop.propose_batch = lambda items, inner=inner, log=log: log.append(inner(items)) \
            or log[-1]
        llm.generate(PROMPTS, SamplingParams(max_tokens=3 * CONTEXT_WINDOW, ignore_eos=True))
        logs.append(log)
    assert len(logs[0]) > 5 and logs[0] == logs[1]
