"""DrafterGate (spec/drafter_gate.py): adaptive drafting on copy misses, and the engine with it."""

from __future__ import annotations

import pytest
from runtime_engines import small_drafter, small_target, write_engine
from test_runtime import PROMPTS

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.spec.drafter_gate import PROBE_EVERY, DrafterGate


def test_always_drafts_and_adaptive_drafts_until_measured():
    always = DrafterGate("always", 4)
    always.record_round(1.0)
    always.record_pass(0.1)
    always.record_outcome("a", 0)
    assert all(always.wants("a") for _ in range(20))
    gate = DrafterGate("adaptive", 4)
    assert gate.threshold is None and gate.wants("a")      # nothing measured yet: draft
    gate.record_outcome("a", 0)
    assert gate.wants("a")                                 # still no timings


def test_adaptive_skips_while_drafts_do_not_pay_and_probes_again():
    gate = DrafterGate("adaptive", 4)
    gate.record_round(0.002)
    gate.record_pass(0.001)                   # a round costs 2 passes: needs > 2 accepted
    assert gate.threshold == pytest.approx(2.0)
    assert gate.wants("new")                  # the optimistic start (4 accepted)
    for _ in range(12):
        gate.record_outcome("bad", 0)         # EMA -> 4 * 0.75^12 < 2
    decisions = [gate.wants("bad") for _ in range(2 * (PROBE_EVERY + 1))]
    assert decisions == ([False] * PROBE_EVERY + [True]) * 2   # a probe every PROBE_EVERY skips
    for _ in range(12):
        gate.record_outcome("good", 4)
    assert all(gate.wants("good") for _ in range(5))
    gate.drop("bad")
    assert gate.wants("bad")                  # a new stream under the old id starts afresh


def test_unknown_policy_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="^drafter_gate:"):
        DrafterGate("sometimes", 4)
    with pytest.raises(ValueError, match="^drafter_gate:"):
        LLM(tmp_path, speculative="off", drafter_gate="sometimes")


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    target = small_target(window=24)
    return write_engine(tmp_path_factory.mktemp("gate"), target, small_drafter(target))


@pytest.mark.parametrize("mode", ["drafter", "copy+drafter"])
def test_adaptive_gate_is_lossless_and_skips_rounds(engine_dir, mode, monkeypatch):
    """With a drafter that accepts nothing (random weights) and a round measured as costly,
    the adaptive gate skips most drafter rounds; the tokens stay those of "off"."""
    params = [SamplingParams(max_tokens=40, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0.8, seed=3, ignore_eos=True)]
    off = LLM(engine_dir, speculative="off", max_num_batched_tokens=64)
    always = LLM(engine_dir, speculative=mode, max_num_batched_tokens=64)
    adaptive = LLM(engine_dir, speculative=mode, max_num_batched_tokens=64,
                   drafter_gate="adaptive")
    gate = adaptive.engine.speculator.gate
    monkeypatch.setattr(gate, "record_round", lambda s: DrafterGate.record_round(gate, 1.0))
    monkeypatch.setattr(gate, "record_pass", lambda s: DrafterGate.record_pass(gate, 0.5))
    for p in params:
        want = [o.token_ids for o in off.generate(PROMPTS, p)]
        assert [o.token_ids for o in always.generate(PROMPTS, p)] == want
        assert [o.token_ids for o in adaptive.generate(PROMPTS, p)] == want
    rounds = {name: llm.engine.stats.proposed["drafter_row0"]
              for name, llm in (("always", always), ("adaptive", adaptive))}
    assert 0 < rounds["adaptive"] < rounds["always"] / 2, rounds
