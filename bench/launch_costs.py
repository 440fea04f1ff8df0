#!/usr/bin/env python3
"""Host cost of the calls a decode step makes, one stream, on a built engine (the H200 question:
why a copy+drafter step's target launch and the drafter's replays cost more host time inside
the engine than alone).

    python3 bench/launch_costs.py --engine engines/mini-h200 [--iters 200] [--out DIR]

Each case times the named calls with perf_counter (µs per call, median over --iters), the GPU
synchronised before each iteration, as after a step's verification:
- target: the target's captured graph replayed (buckets T_b = 1, 8 and 16 of one stream), the
  same bucket every time or alternating 8 and 16;
- round: the drafter's commit and round graphs replayed, on the proposer's own stream or on the
  current one;
- round then target: both, back to back, with no sync between (the deferred drafts' order),
  the round on its own stream (the target's stream waiting for it) or on the current one;
  and after the round's index upload (pinned host -> device), as in the engine;
- the same with the GPU busy (a spin kernel ahead of the calls) or the host's caches cold (64 MiB
  swept before each iteration): is either why the engine's calls cost more than these?
- fill: the target runner's `_fill` (host mirror, one upload) and `_fill_host` alone, on the
  step metadata of a real generate (decode steps of 1, 5 and 9 tokens when they occur).
Writes DIR/launch_costs.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt import LLM, SamplingParams  # noqa: E402


def _median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


BUSY_CYCLES = 400_000     # torch.cuda._sleep: about 0.2 ms of GPU time at the H200's clock
COLD_BYTES = 64 << 20     # host memory swept between iterations: beyond the CPU's caches


def busy_gpu() -> None:
    """Keep the GPU busy while the calls are made (a spin kernel ahead of them)."""
    torch.cuda._sleep(BUSY_CYCLES)


_SWEEP = bytearray(COLD_BYTES)


def cold_host() -> None:
    """Evict the CPU caches, as the Python work between two steps of the engine does."""
    _SWEEP[::64] = bytes(len(_SWEEP[::64]))


def time_calls(calls: dict, iters: int, sync, before=None) -> dict[str, float]:
    """calls: name -> zero-argument callable, run in order each iteration (after `sync` and
    `before`, untimed); µs per call."""
    acc: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(iters):
        sync()
        if before is not None:
            before()
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            acc[name].append(time.perf_counter() - t0)
    sync()
    return {name: _median_us(v) for name, v in acc.items()}


def graph_cases(llm, iters: int, sync) -> dict:
    """The target and drafter graph replays, alone, alternating and back to back."""
    runner, prop = llm.engine.runner, llm.engine.speculator.drafter
    taps = tuple(llm.engine.tap_layers)
    target = {t: runner.graphs[(1, t, taps)][0] for t in (1, 8, 16)}
    d = prop.runner
    commit = d.graphs[("commit", 8)][0]
    rnd = d.graphs[("round", 1, d.round_buckets()[0][1], False)][0]
    own = prop.stream or torch.cuda.Stream()
    cur = torch.cuda.current_stream()

    def on(stream, graph):
        def run():
            if stream is cur:
                graph.replay()
                return
            stream.wait_stream(cur)
            with torch.cuda.stream(stream):
                graph.replay()
        return run

    def target_after(stream, key):
        def run():
            if stream is not cur:
                cur.wait_stream(stream)
            target[key].replay()
        return run

    out = {}
    for t in (1, 8, 16):
        out[f"target T_b={t}"] = time_calls({"replay": target[t].replay}, iters, sync)
    out["target alternating 8, 16"] = time_calls(
        {"replay 8": target[8].replay, "replay 16": target[16].replay}, iters, sync)
    def upload():       # the round's index upload (pinned host -> device), as DrafterRunner does
        d.idx.copy_(d.stage, non_blocking=True)
        d.uploaded.record()

    out["upload, round (current stream)"] = time_calls(
        {"upload": upload, "commit": commit.replay, "round": rnd.replay}, iters, sync)
    step = {"upload": upload, "commit": commit.replay, "round": rnd.replay,
            "target": target[8].replay}
    out["upload, round, target T_b=8, GPU busy"] = time_calls(step, iters, sync, busy_gpu)
    out["upload, round, target T_b=8, host caches cold"] = time_calls(step, iters, sync,
                                                                      cold_host)
    out["upload, round, target T_b=8 (current stream)"] = time_calls(
        {"upload": upload, "commit": commit.replay, "round": rnd.replay,
         "target": target[8].replay}, iters, sync)
    for name, stream in (("own stream", own), ("current stream", cur)):
        out[f"round, {name}"] = time_calls(
            {"commit": on(stream, commit), "round": on(stream, rnd)}, iters, sync)
        out[f"round then target T_b=8, {name}"] = time_calls(
            {"commit": on(stream, commit), "round": on(stream, rnd),
             "target": target_after(stream, 8)}, iters, sync)
    return out


def fill_cases(llm, ids: list[int], iters: int, sync) -> dict:
    """`_fill` and `_fill_host` on the metadata of a real generate's decode steps."""
    runner = llm.engine.runner
    seen: dict[int, object] = {}
    fill = runner._fill

    def record(meta, s_b, t_b, *a):
        seen.setdefault(int(meta.num_tokens), (meta, s_b, t_b, *a))
        return fill(meta, s_b, t_b, *a)
    runner._fill = record
    try:
        llm.generate([ids], SamplingParams(max_tokens=64, ignore_eos=True))
    finally:
        runner._fill = fill
    out = {}
    for t in (1, 5, 9):
        if t in seen:
            meta, s_b, t_b, *a = seen[t]     # a: the drafts on the device, if deferred
            args = (meta, s_b, t_b)
            out[f"fill T={t}{' + drafts' if a and a[0] else ''}"] = time_calls(
                {"_fill": lambda args=args, a=a: fill(*args, *a),
                 "_fill_host": lambda args=args: runner._fill_host(*args)}, iters, sync)
    if 9 in seen:     # the whole runner.forward of a copy step, with and without taps
        meta = seen[9][0]
        taps = tuple(llm.engine.tap_layers)
        for name, layers in (("taps", taps), ("no taps", ())):
            runner.forward(meta, layers)                 # captures the bucket on first use
            out[f"forward T=9, {name}"] = time_calls(
                {"forward": lambda layers=layers: runner.forward(meta, layers)}, iters, sync)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the fill cases only")
    args = ap.parse_args()
    cuda = args.device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    llm = LLM(args.engine, speculative="copy+drafter", max_num_seqs=1, device=args.device,
              model_impl="plugins", drafter_overlap=True)
    ids = llm.tokenizer.encode("Übersetze ins Deutsche: The weather is nice today, and "
                               "the children are playing in the park.", add_bos=True)
    llm.generate([ids], SamplingParams(max_tokens=8))          # compile, warm
    results = {**(graph_cases(llm, args.iters, sync) if cuda else {}),
               **fill_cases(llm, ids, args.iters, sync)}
    for case, calls in results.items():
        print(f"{case:<40} " + ", ".join(f"{k} {v:.1f} us" for k, v in calls.items()),
              flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "launch_costs.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
