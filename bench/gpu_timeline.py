#!/usr/bin/env python3
"""Where each decode step's GPU time goes, and whether the GPU or the host sets the pace.

    python3 bench/gpu_timeline.py --engine engines/mini-h200 --modes copy copy+drafter \
        --prompts-file engines/prompts/spec_bench_question.jsonl --categories translation \
        [--per-category 4] [--max-tokens 192] [--rounds 2] [--out DIR]

No profiler: CUDA events recorded on the engine's stream around the step's device work
(event timestamps are taken when the GPU reaches them, so `a -> b` is the GPU's time for
what was enqueued between, including any wait for earlier work):
  target   `runner.forward` (the target pass: uploads, graph replay, the deferred drafts put)
  select   from the pass to the chained round: the target's own tokens (`target_choices`) and
           their copy to the host
  chain    the chained drafter round (`Speculator.chain`, enqueued while the host waits)
  launch   a drafter round launched by the prefetch after the step (`drafter.launch`)
  demand   a drafter round launched before the target pass (in the step's proposals)
  idle     from the step's last device work to the next step's first: the GPU waits for
           the host (a step that the GPU paces has idle near 0)
and on the host: `turnaround`, from the step's tokens reaching the host to the next step's
target pass being called (verification, commit, the next proposals, schedule, metadata).
Modes take turns in one process (host speed differs per process on the H200 machine,
bench/paired_split.py). Prints per mode and kind of step (the target pass's tokens, and
whether a drafter round followed it) the mean ms of each segment; writes DIR/gpu_timeline.json.
Event records cost the host a few µs each, so steps run slightly slower than unmeasured.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_generate import _inputs, bench_prompts, build_parser, timed_mode  # noqa: E402

from kolibri_trt.runtime import step_verification  # noqa: E402

SEGMENTS = ("demand", "target", "select", "chain", "launch", "idle")


class Marks:
    """Events and host times of one instrumented generate, step by step."""

    def __init__(self):
        self.steps: list[dict] = []      # per step: name -> Event, "tokens", host times

    def event(self, name: str) -> None:
        """Record event `name` now (`pre_name` before the step's target pass is called)."""
        if self.steps:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            cur = self.steps[-1]
            cur[name if "t_forward" in cur else "pre_" + name] = e

    def host(self, name: str) -> None:
        if self.steps:
            self.steps[-1][name] = time.perf_counter()


def instrument(eng, marks: Marks):
    """Wrap the engine's step, forward, chain, launch and token read; returns an undo."""
    undo = []

    def wrap(obj, name, before, after):
        orig = getattr(obj, name)

        def run(*a, **kw):
            before(a, kw)
            try:
                return orig(*a, **kw)
            finally:
                after()
        setattr(obj, name, run)
        undo.append(lambda: setattr(obj, name, orig))

    def step_start(a, kw):
        running = eng.scheduler.running
        decode = bool(running) and all(q.num_pending == 1 for q in running)
        marks.steps.append({"decode": decode, "t_step": time.perf_counter()})

    def fwd_start(a, kw):
        marks.steps[-1]["tokens"] = int(a[0].num_tokens)
        marks.host("t_forward")
        marks.event("target_a")

    wrap(eng, "step", step_start, lambda: marks.host("t_end"))
    wrap(eng.runner, "forward", fwd_start, lambda: marks.event("target_b"))
    wrap(eng.speculator, "chain", lambda a, kw: marks.event("chain_a"),
         lambda: marks.event("chain_b"))
    drafter = eng.speculator.drafter
    if drafter is not None and hasattr(drafter, "launch"):
        wrap(drafter, "launch", lambda a, kw: marks.event("launch_a"),
             lambda: marks.event("launch_b"))
    read = step_verification.TokenReader.read

    def timed_read(self, values, before=None):
        marks.event("read_a")
        try:
            return read(self, values, before)
        finally:
            marks.host("t_tokens")
    step_verification.TokenReader.read = timed_read
    undo.append(lambda: setattr(step_verification.TokenReader, "read", read))
    return lambda: [u() for u in reversed(undo)]


def _ms(a, b) -> float:
    return a.elapsed_time(b)


def segments(steps: list[dict]) -> list[dict]:
    """Per decode step (followed by another step): ms of each of SEGMENTS, the host's
    turnaround and the step's wall ms (its start to the next step's start)."""
    out = []
    for cur, nxt in zip(steps, steps[1:]):
        if not cur["decode"] or "target_b" not in cur or "target_a" not in nxt:
            continue
        s = {"tokens": cur["tokens"], "chained": "chain_b" in cur,
             "launched": "launch_b" in cur, "target": _ms(cur["target_a"], cur["target_b"])}
        if "pre_launch_b" in cur:
            s["demand"] = _ms(cur["pre_launch_a"], cur["pre_launch_b"])
        last = cur["target_b"]
        if "read_a" in cur:
            s["select"] = _ms(last, cur["read_a"])
            last = cur["read_a"]
        if "chain_b" in cur:
            s["chain"] = _ms(cur["chain_a"], cur["chain_b"])
            last = cur["chain_b"]
        if "launch_b" in cur:
            s["launch"] = _ms(cur["launch_a"], cur["launch_b"])
            last = cur["launch_b"]
        s["idle"] = _ms(last, nxt.get("pre_launch_a", nxt["target_a"]))
        if "t_tokens" in cur:
            s["turnaround"] = (nxt["t_forward"] - cur["t_tokens"]) * 1e3
        s["wall"] = (nxt["t_step"] - cur["t_step"]) * 1e3
        out.append(s)
    return out


def measured_generate(llm, ids, params) -> list[dict]:
    marks = Marks()
    undo = instrument(llm.engine, marks)
    try:
        llm.generate(ids, params)
    finally:
        undo()
    torch.cuda.synchronize()
    return segments(marks.steps)


def summary(rows: list[dict]) -> dict:
    """Mean ms per segment by kind of step: '<tokens>t' + '+chain' / '+launch'."""
    kinds: dict[str, list[dict]] = {}
    for r in rows:
        kind = ("demand+" if "demand" in r else "") + f"{r['tokens']}t" + \
            ("+chain" if r["chained"] else "") + ("+launch" if r["launched"] else "")
        kinds.setdefault(kind, []).append(r)
        kinds.setdefault("all", []).append(r)
    keys = SEGMENTS + ("turnaround", "wall")
    return {k: {"steps": len(v), **{key: statistics.fmean(r.get(key, 0.0) for r in v)
                                     for key in keys}}
            for k, v in sorted(kinds.items())}


def report(mode: str, summ: dict) -> None:
    print(f"== {mode}: mean ms per decode step, by the target pass's tokens and what followed")
    print("   kind                   steps  " + "  ".join(f"{k:>10}" for k in SEGMENTS)
          + "  turnaround        wall")
    for kind, v in summ.items():
        print(f"   {kind:<22} {v['steps']:5d}  " + "  ".join(f"{v[k]:10.3f}" for k in SEGMENTS)
              + f"  {v['turnaround']:10.3f}  {v['wall']:10.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser(__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="measured generates per mode")
    args = ap.parse_args(argv)
    if args.device == "cpu" or not torch.cuda.is_available():
        ap.error("--device: needs CUDA (CUDA events time the GPU)")
    if args.rounds < 1:
        ap.error(f"--rounds: must be >= 1, got {args.rounds}")
    prompts = bench_prompts(args)
    llms = {m: timed_mode(args, m, prompts)[0] for m in args.modes}
    rows: dict[str, list[dict]] = {m: [] for m in args.modes}
    for k in range(args.rounds):
        for m in args.modes[k % len(args.modes):] + args.modes[:k % len(args.modes)]:
            ids, params = _inputs(args, llms[m], prompts)
            rows[m] += measured_generate(llms[m], ids, params)
    result = {m: summary(r) for m, r in rows.items()}
    for m, s in result.items():
        report(m, s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_timeline.json").write_text(json.dumps({"summary": result, "steps": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
