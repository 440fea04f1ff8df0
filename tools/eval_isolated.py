"""Speeds with one engine per process, for `eval_acceptance.py --isolated K`.

`eval_acceptance.run_modes` keeps every mode's engine in one process and lets the modes take
turns prompt by prompt (the H200 host's speed drifts within a call). In one process, though,
the CUDA graph replays of every engine after the first cost more host time: on the H200 the
target's replay took 0.010-0.013 ms per step in the first engine a process built and
0.05-0.12 ms in the later ones, whatever their graphs held
(bench/results/h200-2026-11-30f/za/). A server runs one engine, so here every mode runs in
processes of its own (this script with --one-mode), the modes taking turns process by process
in rotated order, K rounds; a mode's speed is the median over its K processes. (Measured so,
copy+drafter fell further behind copy than in one process: bench/results/h200-2026-11-30f/zb/;
not yet explained.)
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
        for cats in got[m].values():
            for r in cats.values():
                r["median"] = statistics.median(r["runs"])
    return got


def report(got: dict) -> None:
    modes = list(got)
    for t in got[modes[0]]:
        print(f"\n== temperature {t}: decode tok/s, one engine per process (median of "
              f"{len(next(iter(got[modes[0]][t].values()))['runs'])} processes)")
        print(f"{'category':<15}" + "".join(f"{m:>14}" for m in modes))
        for c in got[modes[0]][t]:
            print(f"{c:<15}" + "".join(f"{got[m][t][c]['median']:14.1f}" for m in modes))
