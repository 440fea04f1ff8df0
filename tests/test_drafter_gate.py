"""DrafterGate (spec/drafter_gate.py): adaptive drafting on copy misses, and the engine with it."""

from __future__ import annotations

import pytest
from runtime_engines import small_drafter, small_target, write_engine
from test_runtime import PROMPTS

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.spec.drafter_gate import PLAIN_EVERY, PLAIN_FIRST, PROBE_EVERY, DrafterGate


def test_always_drafts_and_adaptive_drafts_until_measured():
    always = DrafterGate("always", 4)
    always.record_step(1.0, drafted=True)
    always.record_step(0.1, drafted=False)
    always.record_outcome("a", 0)
    assert all(always.decide(["a", "b"]) == {"a", "b"} for _ in range(40))
    gate = DrafterGate("adaptive", 4)
    assert gate.threshold is None and gate.decide(["a"]) == {"a"}   # nothing measured: draft
    gate.record_outcome("a", 0)
    gate.record_step(0.003, drafted=True)
    assert gate.threshold is None and gate.decide(["a"]) == {"a"}   # no plain step timed yet


def test_adaptive_skips_while_drafts_do_not_pay_and_probes_again():
    gate = DrafterGate("adaptive", 4)
    gate.record_step(0.003, drafted=True)
    gate.record_step(0.001, drafted=False)    # a round costs 2 plain steps: needs > 2 accepted
    assert gate.threshold == pytest.approx(2.0)
    assert gate.decide(["new"]) == {"new"}    # the optimistic start (4 accepted)
    for _ in range(12):
        gate.record_outcome("bad", 0)         # EMA -> 4 * 0.75^12 < 2
        gate.record_outcome("good", 4)
    decisions = [gate.decide(["bad", "good"]) for _ in range(2 * (PROBE_EVERY + 1))]
    assert decisions == ([{"good"}] * PROBE_EVERY + [{"bad", "good"}]) * 2   # probes
    gate.drop("bad")
    # a new stream under the old id starts afresh, at the average of all rounds so far (0 and
    # 4 alternating: about 2.3 >= 2)
    assert gate.start == pytest.approx(gate.accepted_all) and 2.0 < gate.start < 2.7
    assert gate.decide(["bad"]) == {"bad"}


def test_a_new_stream_starts_at_the_average_of_all_rounds():
    """Once rounds were seen, a new stream starts at their average, not at the optimistic
    block size: where every stream accepts little, new streams skip the drafter at once."""
    gate = DrafterGate("adaptive", 4)
    assert gate.start == 4.0
    gate.record_step(0.003, drafted=True)
    gate.record_step(0.001, drafted=False)    # threshold 2
    for _ in range(20):
        gate.record_outcome("old", 0.5)
    assert gate.start < 1.0 and gate.decide(["new"]) == set()


def test_adaptive_measures_plain_steps_when_every_step_drafts():
    """Speculative mode "drafter": every step would draft, so one step in PLAIN_FIRST (then
    in PLAIN_EVERY) drafts nothing and `plain_s` gets measured; an empty call does not use
    the probe up."""
    gate = DrafterGate("adaptive", 4)
    for run in (PLAIN_FIRST, PLAIN_EVERY):
        for _ in range(run):
            assert gate.decide(["a"]) == {"a"}
            gate.record_step(0.002, drafted=True)
        assert gate.decide([]) == set() and gate.decide(["a"]) == set()     # the plain probe
        gate.record_step(0.001, drafted=False)
        assert gate.threshold == pytest.approx(1.0) and gate.decide(["a"]) == {"a"}


def test_copy_only_steps_are_not_timed():
    """A step with copy drafts only is neither a plain nor a drafted step (its pass verifies
    more drafts than a skipped miss would), and does not end a run of drafted steps."""
    gate = DrafterGate("adaptive", 4)
    gate.record_step(0.003, drafted=True)
    gate.record_step(0.009, drafted=False, copy_only=True)
    assert gate.plain_s is None and gate.drafted_run == 1
    gate.record_step(0.001, drafted=False)
    assert gate.threshold == pytest.approx(2.0)


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
    monkeypatch.setattr(gate, "record_step", lambda s, drafted, copy_only: DrafterGate.record_step(
        gate, 1.5 if drafted else 0.5, drafted, copy_only))    # a round costs 2 plain steps
    for p in params:
        want = [o.token_ids for o in off.generate(PROMPTS, p)]
        assert [o.token_ids for o in always.generate(PROMPTS, p)] == want
        assert [o.token_ids for o in adaptive.generate(PROMPTS, p)] == want
    rounds = {name: llm.engine.stats.proposed["drafter_row0"]
              for name, llm in (("always", always), ("adaptive", adaptive))}
    assert 0 < rounds["adaptive"] < rounds["always"] / 2, rounds
