#!/usr/bin/env python3
"""In which conditions a target CUDA graph's replay() is slow on the host (H200: 5-10 µs in some
engines' decode steps, 50-120 µs in others': every engine built after the first in a process,
bench/results/h200-2026-11-30f/za/; while three copy engines replayed in 5 µs each when the
GPU was synchronised before every call, ../h200-2026-11-30g/zi/).

    python3 bench/replay_probe.py --engine engines/mini-h200 --modes copy copy+drafter
        [--prompts-dir engines/prompts] [--iters 100] [--out DIR]

Builds one engine per --modes entry in this process, in that order (one stream, as the eval),
then for each engine:
- steps: host µs of every replay() during a greedy generate of two prompts (translation and
  chat, 96 tokens; a warm-up generate first), median, the target's graphs and the drafter's
  apart, and the decode tokens/s of that generate;
- micro: host µs of replay() of the target's 16-token graph (a copy step's bucket), median of
  --iters, right after: synced (GPU idle), busy (a 200 µs GPU sleep queued), upload (a pinned
  16 KiB host-to-device copy queued), own (its own previous replay, not finished), other (the
  1-token graph's replay, not finished), drafter (a drafter graph's replay, not finished; engines
  with the drafter only).
Then the first engine's steps again (does it stay fast once the others exist?).
Writes DIR/replay_probe.json. Needs a CUDA device.

2026-11-30h (bench/results/h200-2026-11-30h/zo/): 8-14 µs per target replay in the steps of
every engine, first or later, copy or copy+drafter; the slow replays had come from
bench/profile_generate.py timing later modes after a torch.profiler run.
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
from kolibri_trt.prompts import load_prompts  # noqa: E402

SLEEP_CYCLES = 400_000      # torch.cuda._sleep: about 200 µs at the H200's 1.98 GHz


def _med_us(v: list[float]) -> float | None:
    return round(statistics.median(v) * 1e6, 1) if v else None


def graph_sets(llm) -> tuple[dict, dict]:
    """(target graphs, drafter graphs): id(CUDAGraph) -> its bucket key."""
    tgt = {id(v[0]): k for k, v in llm.engine.runner.graphs.items()}
    runner = getattr(llm.engine.speculator.drafter, "runner", None)
    dr = {id(v[0]): k for k, v in getattr(runner, "graphs", {}).items()}
    return tgt, dr


def steps(llm, ids: list[list[int]], params) -> dict:
    """Host µs per replay() during one generate (target and drafter medians), decode tok/s."""
    tgt, dr = graph_sets(llm)
    times: dict[str, list[float]] = {"target": [], "drafter": [], "other": []}
    orig = torch.cuda.CUDAGraph.replay

    def timed(self):
        t0 = time.perf_counter()
        try:
            return orig(self)
        finally:
            kind = "target" if id(self) in tgt else "drafter" if id(self) in dr else "other"
            times[kind].append(time.perf_counter() - t0)
    torch.cuda.CUDAGraph.replay = timed
    try:
        res = llm.generate(ids, params)
    finally:
        torch.cuda.CUDAGraph.replay = orig
    dec_n = sum(r.metrics.num_generated_tokens - 1 for r in res)
    dec_t = sum(r.metrics.total_time_s - r.metrics.time_to_first_token_s for r in res)
    return {"target_us": _med_us(times["target"]), "target_n": len(times["target"]),
            "drafter_us": _med_us(times["drafter"]), "drafter_n": len(times["drafter"]),
            "other_n": len(times["other"]), "decode_tok_s": round(dec_n / max(dec_t, 1e-9), 1)}


def micro(llm, iters: int) -> dict:
    """Host µs of the 16-token target graph's replay() behind each kind of queued work."""
    graphs = llm.engine.runner.graphs
    big = max((k for k in graphs if k[0] == 1), key=lambda k: k[1])
    small = min((k for k in graphs if k[0] == 1), key=lambda k: k[1])
    g, g1 = graphs[big][0], graphs[small][0]
    runner = getattr(llm.engine.speculator.drafter, "runner", None)
    dgraphs = [v[0] for v in getattr(runner, "graphs", {}).values()]
    host = torch.zeros(4096, dtype=torch.float32).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    before = {
        "synced": lambda: None,
        "busy": lambda: torch.cuda._sleep(SLEEP_CYCLES),
        "upload": lambda: dev.copy_(host, non_blocking=True),
        "own": g.replay,
        "other": g1.replay,
    }
    if dgraphs:
        before["drafter"] = dgraphs[0].replay
    out: dict[str, list[float]] = {k: [] for k in before}
    for _ in range(iters):
        for case, pre in before.items():
            torch.cuda.synchronize()
            pre()
            t0 = time.perf_counter()
            g.replay()
            out[case].append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return {"graph": list(big[:2]), **{k: _med_us(v) for k, v in out.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--modes", nargs="+", default=["copy", "copy+drafter"])
    ap.add_argument("--prompts-dir", type=Path, default=ROOT / "engines" / "prompts")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("replay_probe: needs a CUDA device", file=sys.stderr)
        return 2
    prompts = load_prompts(args.prompts_dir / "spec_bench_question.jsonl", per_category=1,
                           categories=("translation", "mt_bench"))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    rows, llms = [], []
    for i, mode in enumerate(args.modes):
        llm = LLM(args.engine, speculative=mode, max_num_seqs=1, device="cuda")
        llms.append(llm)
        ids = [llm.tokenizer.encode(p.text, add_bos=True) for p in prompts]
        llm.generate(ids, params)                              # warm-up: every shape
        rows.append({"engine": i, "mode": mode, "phase": "built",
                     **steps(llm, ids, params), **micro(llm, args.iters)})
        print(json.dumps(rows[-1]), flush=True)
    if len(llms) > 1:
        ids = [llms[0].tokenizer.encode(p.text, add_bos=True) for p in prompts]
        rows.append({"engine": 0, "mode": args.modes[0], "phase": "after all",
                     **steps(llms[0], ids, params), **micro(llms[0], args.iters)})
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
