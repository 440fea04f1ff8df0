#!/usr/bin/env python3
"""What the GPU runs inside one replay of each CUDA graph a decode step uses, kernel by kernel.

    python3 bench/graph_kernels.py --engine engines/mini-h200 \
        --prompts-file engines/prompts/spec_bench_question.jsonl [--category translation] \
        [--max-tokens 192] [--replays 200] [--out DIR]

A copy+drafter engine (one stream) generates one prompt of --category, so that its graphs are
captured and its caches and drafter ring hold real rows. Then, per graph that the run used (the
target's one-stream graphs by token bucket, the drafter's chained / merged rounds), with the
engine idle:
- `replay_us`: CUDA-event time of --replays back-to-back replays, per replay (the GPU's time
  for the graph; the host enqueues far ahead, so no host time is in it);
- one torch.profiler run of 20 replays: per kernel name, launches and µs per replay;
  `kernel_us` their sum, and `gap_us` = (replay_us - kernel_us) / launches: what each launch
  costs beyond its kernel's own time (the graph's dependency and launch latency).
Replaying a graph again rewrites what its last replay wrote (caches, ring rows): nothing is
generated afterwards. Prints a table per graph; writes DIR/graph_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_generate import PROMPTS, _dev_us  # noqa: E402

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402

PROFILED = 20     # replays under the profiler


def graphs_used(llm) -> dict[str, torch.cuda.CUDAGraph]:
    """name -> graph: the target's graphs of one stream, the drafter's graphs its run used."""
    eng = llm.engine
    out = {f"target s={k[0]} t={k[1]}": v[0] for k, v in eng.runner.graphs.items() if k[0] == 1}
    prop = eng.speculator.drafter
    runner = getattr(prop, "runner", None)
    if runner is not None:
        for key in sorted(runner.used & set(runner.graphs), key=str):
            out["drafter " + " ".join(map(str, key))] = runner.graphs[key][0]
    return out


def replay_time(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """µs per replay of `replays` back-to-back replays, by CUDA events."""
    graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        graph.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / replays


def graph_kernels(graph: torch.cuda.CUDAGraph, replay_us: float) -> dict:
    """The profiled kernels of PROFILED replays, against replay_us (`replay_time`'s). Run
    after every `replay_time`: once the profiler has run, the process's CUDA calls stay
    slower (bench/results/h200-2026-11-30h/), which could starve back-to-back replays."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(((e.key, e.count / PROFILED, _dev_us(e) / PROFILED)
                      for e in prof.key_averages() if _dev_us(e) > 0), key=lambda r: -r[2])
    launches = sum(c for _, c, _ in kernels)
    kernel_us = sum(t for _, _, t in kernels)
    return {"replay_us": replay_us, "launches": launches, "kernel_us": kernel_us,
            "gap_us": (replay_us - kernel_us) / max(launches, 1),
            "kernels": [{"name": k[:90], "per_replay": c, "us": t} for k, c, t in kernels]}


def report(name: str, r: dict) -> None:
    print(f"== {name}: {r['replay_us']:.1f} µs per replay, {r['launches']:.0f} launches, "
          f"kernels {r['kernel_us']:.1f} µs, {r['gap_us']:.2f} µs per launch beyond its kernel")
    for k in r["kernels"]:
        print(f"   {k['us']:8.2f} µs  {k['per_replay']:5.1f}x  {k['us'] / k['per_replay']:6.2f} "
              f"µs each  {k['name']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS)
    ap.add_argument("--category", default="translation")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs CUDA (it times CUDA graphs)")
    if args.replays < 1:
        ap.error(f"--replays: must be >= 1, got {args.replays}")
    prompts = load_prompts(args.prompts_file, per_category=1, categories=(args.category,))
    if not prompts:
        ap.error(f"--category {args.category!r}: no prompt in {args.prompts_file}")
    llm = LLM(args.engine, speculative="copy+drafter", max_num_seqs=1, device="cuda")
    ids = [llm.tokenizer.encode(prompts[0].text, add_bos=True)]
    llm.generate(ids, SamplingParams(max_tokens=args.max_tokens, temperature=0.0,
                                     ignore_eos=True))
    torch.cuda.synchronize()
    graphs = graphs_used(llm)
    times = {name: replay_time(g, args.replays) for name, g in graphs.items()}
    results = {}
    for name, graph in graphs.items():
        results[name] = graph_kernels(graph, times[name])
        report(name, results[name])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graph_kernels.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
