"""The evaluation tools' timing (`tools/eval_acceptance.py`, `tools/eval_isolated.py`):
children that get their parent's options, medians over processes, batched runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import eval_acceptance  # noqa: E402

PROMPTS = eval_acceptance.PROMPTS   # the default --prompts-dir: ../shared/data/prompts


def test_isolated_children_get_the_parents_options():
    """`eval_acceptance --isolated`: a --one-mode child parses back every option that shapes
    what it times (eval_isolated.child_argv); --one-mode needs --json."""
    import eval_acceptance
    import eval_isolated
    ap = eval_acceptance.parser()
    args = ap.parse_args(["--engine", "e", "--per-category", "3", "--categories", "mt_bench",
                          "translation", "--humaneval", "0", "--max-tokens", "50",
                          "--temperatures", "0", "0.8", "--device", "cuda", "--repeats", "2",
                          "--drafter-gate", "adaptive", "--drafter-depth", "2",
                          "--cpu-affinity", "0-3", "--isolated", "3", "--skip", "8",
                          "--draft-sampling", "greedy"])
    child = ap.parse_args(eval_isolated.child_argv(args) + ["--one-mode", "copy", "--json", "x"])
    skip = {"isolated", "isolated_modes", "one_mode", "json"}
    assert {k: v for k, v in vars(child).items() if k not in skip} == \
        {k: v for k, v in vars(args).items() if k not in skip}
    assert child.one_mode == "copy" and child.isolated == 0
    with pytest.raises(SystemExit):
        eval_acceptance.main(["--engine", "e", "--one-mode", "copy"])


def test_isolated_speeds_are_medians_over_processes_in_rotated_order(monkeypatch):
    """`eval_isolated.run`: K rounds of one child per mode, the modes' order rotated per round;
    a mode's speed is the median of its children's, and per round relative to the first
    mode's child; a failing child raises naming its mode."""
    import eval_acceptance
    import eval_isolated
    args = eval_acceptance.parser().parse_args(["--engine", "e", "--temperatures", "0"])
    calls, speeds = [], {"copy": iter([3.0, 1.0, 2.0]), "copy+drafter": iter([5.0, 4.0, 6.0])}

    def fake_run(cmd, capture_output, text):
        mode, out = cmd[cmd.index("--one-mode") + 1], Path(cmd[cmd.index("--json") + 1])
        calls.append(mode)
        out.write_text(json.dumps({"0.0": {"mt_bench": next(speeds[mode])}}))
        return SimpleNamespace(returncode=0, stderr="")
    monkeypatch.setattr(eval_isolated.subprocess, "run", fake_run)
    got = eval_isolated.run(args, ["copy", "copy+drafter"], 3)
    assert calls == ["copy", "copy+drafter", "copy+drafter", "copy", "copy", "copy+drafter"]
    assert got["copy"]["0.0"]["mt_bench"] == {"runs": [3.0, 1.0, 2.0], "median": 2.0}
    cd = got["copy+drafter"]["0.0"]["mt_bench"]
    assert cd["median"] == 5.0      # and per round against copy's process of that round
    assert cd["vs_first_per_round"] == [5 / 3, 4.0, 3.0] and cd["vs_first_median"] == 3.0
    eval_isolated.report(got)
    monkeypatch.setattr(eval_isolated.subprocess, "run",
                        lambda cmd, **kw: SimpleNamespace(returncode=1, stderr="boom"))
    with pytest.raises(RuntimeError, match="'copy' process failed"):
        eval_isolated.run(args, ["copy"], 1)


def test_streams_time_the_batch_over_its_wall(monkeypatch):
    """`eval_acceptance --streams N`: a batch's requests overlap, so no summed decode time
    (the wall-time speed stands instead); one stream keeps the per-request decode time;
    --streams must be >= 1 and cannot go with --isolated."""
    import eval_acceptance

    def fake_llm(seqs):
        out = [SimpleNamespace(token_ids=[1, 2, 3], metrics=SimpleNamespace(
            num_generated_tokens=3, total_time_s=0.5, time_to_first_token_s=0.1))
            for _ in range(2)]
        return SimpleNamespace(engine=SimpleNamespace(args=SimpleNamespace(max_num_seqs=seqs)),
                               generate=lambda ids, params: out[:len(ids)])
    batched = eval_acceptance.timed_run(fake_llm(2), [[1], [2]], None)
    assert batched[1] == 6 and batched[3] == 4 and batched[4] == 0.0
    assert eval_acceptance.merge_runs([batched])[2] is None
    one = eval_acceptance.timed_run(fake_llm(1), [[1]], None)
    assert one[4] == pytest.approx(0.4)
    for bad in (["--streams", "0"], ["--streams", "2", "--isolated", "2"]):
        with pytest.raises(SystemExit):
            eval_acceptance.main(["--engine", "e"] + bad)


@pytest.mark.skipif(not PROMPTS.is_dir(), reason="shared/ prompt sets not beside the checkout")
def test_skip_leaves_out_the_first_prompts_of_each_category():
    """`eval_acceptance --skip N`: each category's prompts start after its first N (held-out
    prompts), then the HumanEval ones."""
    import eval_acceptance
    ap = eval_acceptance.parser()
    base = ["--engine", "e", "--categories", "translation", "mt_bench", "--humaneval", "1",
            "--per-category", "3"]
    first = eval_acceptance.load_eval_prompts(ap.parse_args(base + ["--per-category", "5"]))
    later = eval_acceptance.load_eval_prompts(ap.parse_args(base + ["--skip", "2"]))
    for cat in ("translation", "mt_bench"):
        assert [p.text for p in later if p.category == cat] == \
            [p.text for p in first if p.category == cat][2:5]
    assert len(later) == 7 and later[-1].text == first[-1].text
