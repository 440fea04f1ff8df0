"""Speeds with one engine per process, for `eval_acceptance.py --isolated K`.

`eval_acceptance.run_modes` keeps every mode's engine in one process and lets the modes take
turns prompt by prompt. A server runs one engine, so here every mode runs in processes of its
own (this script with --one-mode), the modes taking turns process by process in rotated order,
K rounds. On the H200 machine the host's speed differs from process to process and drifts
within a call: the same pure-Python step setup took 0.036 ms in one process and 0.067 ms in
the next, a minute apart (bench/results/h200-2026-11-30i/sp/), and copy's four processes in
one call ran at 5,244-8,044 tokens/s (`fe/`). So besides each mode's median over its K
processes, every later mode gets its speed relative to the first mode's process of the same
round (back to back, so the nearest in time), and the median of those K ratios.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "eval_acceptance.py"


def child_argv(args) -> list[str]:
    """The options of `args` (eval_acceptance's) that a --one-mode child needs."""
    out = ["--engine", str(args.engine), "--per-category", str(args.per_category),
           "--categories", *args.categories, "--humaneval", str(args.humaneval),
           "--max-tokens", str(args.max_tokens), "--max-model-len", str(args.max_model_len),
           "--temperatures", *map(str, args.temperatures), "--template", args.template,
           "--device", args.device, "--drafter-attention", args.drafter_attention,
           "--drafter-gate", args.drafter_gate, "--drafts-on-device", args.drafts_on_device,
           "--drafter-chain", args.drafter_chain,
           "--drafter-stream", args.drafter_stream, "--sampler", args.sampler,
           "--draft-sampling", args.draft_sampling, "--skip", str(args.skip),
           "--prompts-dir", str(args.prompts_dir), "--repeats", str(args.repeats)]
    if args.drafter_depth is not None:
        out += ["--drafter-depth", str(args.drafter_depth)]
    if args.cpu_affinity is not None:
        out += ["--cpu-affinity", args.cpu_affinity]
    return out


def speeds(results: dict) -> dict:
    """run_modes' results of one mode -> {temperature: {category: decode tokens/s}}."""
    return {str(t): {c: r["decode_tokens_per_s"] for c, r in cats.items()}
            for t, cats in results.items()}


def run(args, modes: list[str], rounds: int) -> dict:
    """K = rounds rounds of one process per mode (rotated order). Returns {mode: {temperature:
    {category: {"runs": [decode tokens/s per process], "median": ...}}}}. Raises
    RuntimeError naming the mode when a child fails."""
    got: dict = {m: {} for m in modes}
    base = child_argv(args)
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(rounds):
            for i, m in enumerate(modes[k % len(modes):] + modes[:k % len(modes)]):
                out = Path(tmp) / f"{k}-{i}.json"
                proc = subprocess.run([sys.executable, str(SCRIPT), *base, "--one-mode", m,
                                       "--json", str(out)], capture_output=True, text=True)
                if proc.returncode:
                    raise RuntimeError(f"--isolated: the {m!r} process failed "
                                       f"(rc {proc.returncode}): {proc.stderr[-2000:]}")
                for t, cats in json.loads(out.read_text()).items():
                    for c, v in cats.items():
                        got[m].setdefault(t, {}).setdefault(c, {"runs": []})["runs"].append(v)
    for m in modes:
        for t, cats in got[m].items():
            for c, r in cats.items():
                r["median"] = statistics.median(r["runs"])
                if m != modes[0]:
                    first = got[modes[0]][t][c]["runs"]
                    r["vs_first_per_round"] = [x / y for x, y in zip(r["runs"], first)]
                    r["vs_first_median"] = statistics.median(r["vs_first_per_round"])
    return got


def report(got: dict) -> None:
    modes = list(got)
    for t in got[modes[0]]:
        print(f"\n== temperature {t}: decode tok/s, one engine per process (median of "
              f"{len(next(iter(got[modes[0]][t].values()))['runs'])} processes)")
        print(f"{'category':<15}" + "".join(f"{m:>14}" for m in modes))
        for c in got[modes[0]][t]:
            print(f"{c:<15}" + "".join(f"{got[m][t][c]['median']:14.1f}" for m in modes))
        for m in modes[1:]:
            print(f"{m} against {modes[0]}, process by process in each round (median):")
            for c in got[m][t]:
                r = got[m][t][c]
                print(f"  {c:<13}" + " ".join(f"{x - 1:+7.1%}" for x in r["vs_first_per_round"])
                      + f"   ({r['vs_first_median'] - 1:+.1%})")
