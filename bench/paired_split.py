#!/usr/bin/env python3
"""The timed split of several speculative modes in one process, the modes taking turns.

    python3 bench/paired_split.py --engine engines/mini-h200 --modes copy copy+drafter \
        --prompts-file engines/prompts/spec_bench_question.jsonl [--rounds 4] \
        [--per-category 4] [--max-tokens 192] [--out DIR]

On the H200 machine the host's speed differs from process to process (the same pure-Python
step setup 0.036 ms in one process, 0.067 ms in the next: bench/results/h200-2026-11-30i/sp/),
so two modes' parts timed in separate processes cannot be told apart by a few µs. Here every
mode's engine lives in this process; round r times each mode once (`profile_generate.
timed_split`, no profiler), in rotated order. Prints, per round, each mode's decode tokens/s
and its ratio to the first mode's; then, per mode, each part's mean ms per decode step over
the rounds and its difference to the first mode's. Writes DIR/paired_split.json. Options as
`bench/profile_generate.py` (its --profiler is ignored: none runs here).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_generate import (PARTS, POLICIES, _inputs, bench_prompts,  # noqa: E402
                              build_parser, timed_mode, timed_split)


def run(args, prompts: list) -> dict:
    """{mode: [the split of each round]}; round 0 is `timed_mode`'s own (after its warm-up)."""
    llms, got = {}, {}
    for mode in args.modes:
        llms[mode], r = timed_mode(args, mode, prompts)
        got[mode] = [r["unprofiled"]]
    for k in range(1, args.rounds):
        for mode in args.modes[k % len(args.modes):] + args.modes[:k % len(args.modes)]:
            ids, params = _inputs(args, llms[mode], prompts)
            got[mode].append(timed_split(llms[mode], ids, params))
    return got


def report(got: dict) -> None:
    modes, keys = list(got), ["step"] + [k for k, _, _ in PARTS]
    speed = {m: [s["decode_tokens"] / s["decode_wall_ms"] * 1e3 for s in got[m]] for m in modes}
    print("decode tokens/s per round" + "".join(f" | {m}" for m in modes))
    for k in range(len(speed[modes[0]])):
        cells = [f"{speed[m][k]:,.0f}" + (f" ({speed[m][k] / speed[modes[0]][k] - 1:+.1%})"
                                          if m != modes[0] else "") for m in modes]
        print(f"  round {k}: " + " | ".join(cells))
    mean = {m: {key: statistics.fmean(s[f"{key}_ms"] for s in got[m]) for key in keys}
            for m in modes}
    print("mean ms per decode step over the rounds" + "".join(f" | {m}" for m in modes))
    for key in keys:
        if max(mean[m][key] for m in modes) >= 0.0005:
            print(f"  {key:<16}" + " | ".join(
                f"{mean[m][key]:.3f}" + (f" ({mean[m][key] - mean[modes[0]][key]:+.3f})"
                                         if m != modes[0] else "") for m in modes))


def main(argv: list[str] | None = None) -> int:
    ap = build_parser(__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="timed splits per mode, in turns")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: must be >= 1, got {args.rounds}")
    if any("/" in m and m.partition("/")[2] not in POLICIES for m in args.modes):
        ap.error(f"--modes: no /variants here but {list(POLICIES)} (bench/profile_generate.py "
                 "takes the others)")
    got = run(args, bench_prompts(args))
    report(got)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paired_split.json").write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
