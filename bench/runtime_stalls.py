#!/usr/bin/env python3
"""Where a slow `generate` loses its time: per-step wall times, Triton compilations, graph
captures and garbage collections inside the timed region, one setting after another.

    python3 bench/runtime_stalls.py --engine engines/mini-h200 \
        [--prompts-file P] [--per-category 1] [--limit 6] [--max-tokens 48] [--out DIR]

Why: bench/gpu_runtime.py has measured greedy (T = 0) runs of 8 streams through CUDA graphs at
100-200 tokens/s, against 300-500 eager and ~2,000 for the same setting unchained or sampled
(bench/results/h200-2026-12-01d/nx/ .. h200-2026-12-02b/pc/runtime.log). Each setting here is
one fresh `LLM` (speculative mode, max_num_seqs = streams, graphs unless eager), warmed up as
bench/spec_decode.py's `run` did until 2026-12-02 (2 tokens per prompt), then timed twice in a row on the same prompts ("first",
"again"). Per timed generate: tokens/s, steps, median and largest step (ms), the steps above
5x the median and their share of the time, Triton compilations (knobs.runtime.
jit_post_compile_hook: kernel names), graphs captured (runner.graphs) and gc passes with their
time (gc.callbacks). JSON: DIR/runtime_stalls.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (plain checkouts: plugins/ as kolibri_trt_plugins)

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402

PROMPTS = ROOT.parent / "shared" / "data" / "prompts" / "spec_bench_question.jsonl"
# (speculative mode, temperature, streams, enforce_eager): the slow setting three times over,
# then its neighbours in gpu_runtime's table
SETTINGS = (("off", 0.0, 1, False), ("off", 0.0, 8, False), ("off", 0.0, 8, False),
            ("off", 0.0, 8, True), ("off", 0.8, 8, False), ("copy+drafter", 0.0, 8, False))
SLOW_FACTOR = 5.0   # a step this many times the median counts as a stall


class Probe:
    """Counts what happens while `active`: Triton compilations and gc passes (with time)."""

    def __init__(self):
        self.active, self.compiles, self.gc_s, self.gc_n, self._gc_t0 = False, [], 0.0, 0, 0.0
        from triton import knobs
        knobs.runtime.jit_post_compile_hook = self._compiled
        gc.callbacks.append(self._gc)

    def _compiled(self, *, fn, **_):
        if self.active:
            self.compiles.append(fn.name)
        return None

    def _gc(self, phase, info):
        if not self.active:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_t0
            self.gc_n += 1

    def reset(self):
        self.compiles, self.gc_s, self.gc_n = [], 0.0, 0


def timed_generate(llm: LLM, ids, params, probe: Probe) -> dict:
    """One generate with each engine step's wall time (s) and the batch it ran."""
    eng = llm.engine
    steps, inner = [], eng.step

    def step():
        t0 = time.perf_counter()
        out = inner()
        steps.append((time.perf_counter() - t0, len(eng.scheduler.running)))
        return out

    eng.step = step
    graphs = getattr(eng.runner, "graphs", {})
    n_graphs = len(graphs)
    probe.reset()
    probe.active = True
    t0 = time.perf_counter()
    outs = llm.generate(ids, params)
    dt = time.perf_counter() - t0
    probe.active = False
    eng.step = inner
    times = [s for s, _ in steps]
    med = statistics.median(times)
    slow = [(i, round(s * 1e3, 2), b) for i, (s, b) in enumerate(steps) if s > SLOW_FACTOR * med]
    n = sum(len(o.token_ids) for o in outs)
    return {"tokens": n, "seconds": dt, "tokens_per_s": n / dt, "steps": len(steps),
            "median_step_ms": med * 1e3, "max_step_ms": max(times) * 1e3,
            "slow_steps": slow[:12], "slow_share": sum(s for _, s, _ in slow) / 1e3 / dt,
            "compiles": sorted(set(probe.compiles)), "n_compiles": len(probe.compiles),
            "graphs_captured": len(graphs) - n_graphs, "gc_passes": probe.gc_n,
            "gc_ms": probe.gc_s * 1e3}


def run_setting(engine: Path, prompts, setting, max_tokens: int, probe: Probe,
                device: str) -> dict:
    mode, temp, streams, eager = setting
    llm = LLM(engine, speculative=mode, max_num_seqs=streams, device=device,
              model_impl="plugins", enforce_eager=eager)
    ids = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p.text}])
           for p in prompts]
    llm.generate(ids, SamplingParams(max_tokens=2))   # spec_decode.run's warm-up until 2026-12-02
    params = SamplingParams(max_tokens=max_tokens, temperature=temp, seed=1, ignore_eos=True)
    row = {"mode": mode, "temperature": temp, "streams": streams, "eager": eager}
    for tag in ("first", "again"):
        row[tag] = timed_generate(llm, ids, params, probe)
    llm.shutdown()
    return row


def show(row: dict) -> None:
    head = (f"{row['mode']:<13} T={row['temperature']} streams={row['streams']}"
            f"{' eager' if row['eager'] else ''}")
    for tag in ("first", "again"):
        r = row[tag]
        print(f"{head:<36} {tag:<5} {r['tokens_per_s']:8.1f} tok/s  {r['steps']:4d} steps  "
              f"median {r['median_step_ms']:7.2f} ms  max {r['max_step_ms']:8.2f} ms  "
              f"stalls {len(r['slow_steps'])} ({100 * r['slow_share']:.0f} %)  "
              f"compiles {r['n_compiles']}  graphs +{r['graphs_captured']}  "
              f"gc {r['gc_passes']} / {r['gc_ms']:.1f} ms", flush=True)
        if r["slow_steps"]:
            print(f"    stalls (step, ms, running): {r['slow_steps']}", flush=True)
        if r["compiles"]:
            print(f"    compiled: {', '.join(r['compiles'])}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--device", default="cuda", help="cpu: a dry run on the torch references")
    args = ap.parse_args()
    prompts = load_prompts(args.prompts_file, per_category=args.per_category)[:args.limit]
    probe, rows = Probe(), []
    for setting in SETTINGS:
        rows.append(run_setting(args.engine, prompts, setting, args.max_tokens, probe,
                                 args.device))
        show(rows[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runtime_stalls.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
