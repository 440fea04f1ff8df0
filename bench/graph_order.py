#!/usr/bin/env python3
"""Host time of each engine's CUDA graph replays when several engines are built one after
another in one process (H200; the question came from replays of 50-120 µs in later engines,
bench/results/h200-2026-11-30f/za/).

    python3 bench/graph_order.py --engine engines/mini-h200 [--engines 3] [--iters 200]
        [--modes MODE ...] [--out DIR]

Builds --engines engines (one stream, CUDA graphs) one after another in this process, in the
speculative modes --modes names in build order (default: all copy; the last mode repeats), then
times, per engine, the host time of its one-stream graph with the fewest tokens, `replay()`
(µs, median over --iters, the GPU synchronised before each call) in three ways:
- current: on the current stream, as the engine replays;
- own stream: on a CUDA stream of the engine's own;
- step: as a decode step does it: replay, the argmax of the logits, `.tolist()`.
Then the first engine is deleted and the others timed again. Writes DIR/graph_order.json.
Needs a CUDA device.

2026-11-30g (zi): three copy engines all replay in about 5 µs. 2026-11-30h (zo,
bench/replay_probe.py): in real decode steps too, every engine replays in 8-14 µs; the slow
replays came from bench/profile_generate.py timing later modes after a torch.profiler run.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt import LLM  # noqa: E402


def _us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def time_replays(llm, iters: int, stream: torch.cuda.Stream) -> dict[str, float]:
    """µs per replay() of the engine's (1 stream, 1 token) graph: current stream, `stream`,
    and a decode step's replay + argmax + tolist."""
    graphs = llm.engine.runner.graphs
    key = min((k for k in graphs if k[0] == 1), key=lambda k: k[1])  # (streams, tokens, taps)
    graph, logits, _ = graphs[key]
    out: dict[str, list[float]] = {"current": [], "own stream": [], "step": []}
    for _ in range(iters):
        for case in out:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if case == "own stream":
                with torch.cuda.stream(stream):
                    graph.replay()
            else:
                graph.replay()
            if case == "step":
                logits[:1].argmax(-1).tolist()
            out[case].append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return {case: _us(v) for case, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--modes", nargs="+", default=["copy"],
                    help="speculative mode of each engine in build order (the last repeats)")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("graph_order: needs a CUDA device", file=sys.stderr)
        return 2
    if args.engines < 2:
        ap.error(f"--engines: must be >= 2, got {args.engines}")
    modes = [args.modes[min(i, len(args.modes) - 1)] for i in range(args.engines)]
    llms = [LLM(args.engine, speculative=m, max_num_seqs=1, device="cuda") for m in modes]
    streams = [torch.cuda.Stream() for _ in llms]
    rows = []
    for i, (llm, s) in enumerate(zip(llms, streams)):
        rows.append({"engine": i, "mode": modes[i], "phase": "all alive",
                     **time_replays(llm, args.iters, s)})
    del llms[0], streams[0]
    gc.collect()
    torch.cuda.empty_cache()
    for i, (llm, s) in enumerate(zip(llms, streams), start=1):
        rows.append({"engine": i, "mode": modes[i], "phase": "first deleted",
                     **time_replays(llm, args.iters, s)})
    print(f"{'engine':>6}  {'mode':<14}{'phase':<14}{'current':>10}{'own stream':>12}{'step':>10}"
          "  (µs)")
    for r in rows:
        print(f"{r['engine']:>6}  {r['mode']:<14}{r['phase']:<14}{r['current']:>10}"
              f"{r['own stream']:>12}{r['step']:>10}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graph_order.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
