#!/usr/bin/env python3
"""Where the time of a speculative round goes: torch.profiler over `LLM.generate`, per mode.

    python3 bench/profile_generate.py --engine engines/mini-h200 --device cuda \
        --prompts-file engines/prompts/spec_bench_question.jsonl [--categories translation mt_bench]
        [--modes off copy drafter copy+drafter] [--max-tokens 96] [--warm-runs N]
        [--gc on|off|freeze] [--profiler on|off] [--out DIR]

For each mode: one short warm-up generate over the prompts (and --warm-runs whole ones) and the
timed run (Python's garbage collector as --gc says); then, after every mode's timed run (a
profiler slows the process's later CUDA calls), one profiled generate per mode (one stream at
a time; none with --profiler off). Prints and writes (DIR/profile_generate.json): wall seconds, target passes, wall ms per
pass, device busy ms per pass (sum of kernel times), host-side share (wall - device busy),
an unprofiled run's split of a decode step into its parts (`timed_split`), and the top ops by
self CPU time and the top kernels by device time. The question it answers:
how much of a drafter round is GPU work and how much is host work (index tensors, copies,
synchronisation, Python) — the cost that decides whether the drafter beats copy drafting on a
small target.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402
from kolibri_trt.runtime.engine_args import DRAFTS_ON_DEVICE  # noqa: E402
from kolibri_trt.spec.metrics import SpecMetrics  # noqa: E402
from step_timer import PARTS, timed_split  # noqa: E402,F401  (PARTS: paired_split)

PROMPTS = ROOT.parent / "shared" / "data" / "prompts" / "spec_bench_question.jsonl"
TOP = 20  # rows per table


def _dev_us(e) -> float:
    """Self device time of a profiler row in µs (torch renamed cuda_* to device_*)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, name):
            return float(getattr(e, name))
    return 0.0


# MODE/no-rounds: the mode's engine with a gate that never drafts. Diagnostics on top of it
# (`+`-joined; the graphs are captured without a part of the drafter mode's work, so the
# drafter's history goes stale: only meaningful with no-rounds): no-sink (taps not written
# into the history), no-taps (no taps computed; no sink), no-draft-put (the deferred drafts
# not put in by the graphs).
VARIANTS = ("no-rounds", "no-sink", "no-taps", "no-draft-put")
# MODE/chain-copy, MODE/chain-misses: the engine's chained rounds after every step, or only
# after steps without copy drafts (`LLMEngine.chain_after_copy`), whatever the default
POLICIES = {"chain-copy": True, "chain-misses": False}


@contextmanager
def _graph_variant(parts: set[str]):
    """Patch `PluginRunner._run` (what the target's graphs capture) per the diagnostics."""
    from kolibri_trt.runtime import cuda_graphs
    orig = cuda_graphs.PluginRunner._run

    def run(self, padded, tap_layers):
        sink, source = self.taps_sink, self.draft_source
        if parts & {"no-sink", "no-taps"}:
            self.taps_sink = None
        if "no-draft-put" in parts:
            self.draft_source = None
        try:
            logits, taps = orig(self, padded, () if "no-taps" in parts else tap_layers)
        finally:
            self.taps_sink, self.draft_source = sink, source
        return logits, taps
    cuda_graphs.PluginRunner._run = run if parts - {"no-rounds"} else orig
    try:
        yield
    finally:
        cuda_graphs.PluginRunner._run = orig


def timed_mode(args, mode: str, prompts: list):
    """One mode's engine, warm-up and unprofiled timed run (`timed_split`). Returns (the LLM,
    {"mode", "unprofiled"}). mode "copy+drafter/no-rounds": that engine (taps written, the
    drafter's per-step work) with its gate refusing every round, i.e. copy drafting alone on
    the drafter mode's machinery; "/no-rounds+no-taps" etc.: VARIANTS. ValueError for an
    unknown variant."""
    base, _, variant = mode.partition("/")
    policy = POLICIES.get(variant)
    parts = set() if policy is not None else set(variant.split("+")) - {""}
    if parts - set(VARIANTS) or (parts and "no-rounds" not in parts):
        raise ValueError(f"mode {mode!r}: variants are no-rounds[+{'|'.join(VARIANTS[1:])}] "
                         f"or one of {list(POLICIES)}")
    with _graph_variant(parts):
        llm = LLM(args.engine, speculative=base, max_num_seqs=1, device=args.device,
                  drafter_attention=args.drafter_attention, drafter_gate=args.drafter_gate,
                  drafts_on_device=DRAFTS_ON_DEVICE[args.drafts_on_device],
                  drafter_chain=DRAFTS_ON_DEVICE[args.drafter_chain],
                  cpu_affinity=args.cpu_affinity)
        if "no-rounds" in parts:
            llm.engine.speculator.gate.decide = lambda request_ids: set()
        if policy is not None:
            llm.engine.chain_after_copy = policy
        ids, params = _inputs(args, llm, prompts)
        llm.generate(ids, SamplingParams(max_tokens=2))
        for _ in range(args.warm_runs):
            llm.generate(ids, params)
        gc.collect()
        if args.gc == "freeze":
            gc.freeze()
        elif args.gc == "off":
            gc.disable()
        try:
            split = timed_split(llm, ids, params)
        finally:
            gc.enable()
            gc.unfreeze()
    return llm, {"mode": mode, "unprofiled": split}


def _inputs(args, llm, prompts: list):
    ids = [llm.tokenizer.encode(p.text, add_bos=True) for p in prompts]
    return ids, SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)


def profiled_mode(args, llm, prompts: list) -> dict:
    """The profiled generate of a mode's (warm) LLM: the figures of the module docstring.
    Run only after every mode's timed run: once torch.profiler has run, the process's CUDA
    calls stay slower (H200: graph replays 10 -> 50-120 µs, bench/results/h200-2026-11-30h/)."""
    ids, params = _inputs(args, llm, prompts)
    llm.engine.stats = SpecMetrics()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device != "cpu" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        outs = llm.generate(ids, params)
        if args.device != "cpu":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    rows = prof.key_averages()
    passes = max(1, llm.engine.stats.target_passes)
    kernels = sorted(((e.key, e.count, _dev_us(e)) for e in rows if _dev_us(e) > 0),
                     key=lambda r: -r[2])
    busy_ms = sum(r[2] for r in kernels) / 1e3
    host = sorted(((e.key, e.count, e.self_cpu_time_total) for e in rows),
                  key=lambda r: -r[2])
    return {"wall_s": wall, "tokens": sum(len(o.token_ids) for o in outs),
            "target_passes": passes, "tau": llm.engine.stats.acceptance_length,
            "wall_ms_per_pass": wall * 1e3 / passes, "device_busy_ms_per_pass": busy_ms / passes,
            "top_host_ops": [dict(op=k[:100], calls=c, self_cpu_ms=t / 1e3)
                             for k, c, t in host[:TOP]],
            "top_kernels": [dict(kernel=k[:100], calls=c, device_ms=t / 1e3)
                            for k, c, t in kernels[:TOP]]}


def report_split(r: dict) -> None:
    u = r["unprofiled"]
    parts = ", ".join(f"{k} {u[k + '_ms']:.3f}" for k, _, _ in PARTS)
    print(f"== {r['mode']}, unprofiled, per decode step ({u['decode_steps']} steps): "
          f"{u['step_ms']:.3f} ms (median {u['step_median_ms']:.3f}, max {u['step_max_ms']:.3f}); "
          f"{parts}; drafter rounds {u['drafter_rounds_per_step']:.2f} per step")
    print(f"   first token to last (the evals' decode time): {u['decode_wall_ms']:.1f} ms for "
          f"{u['decode_tokens']} tokens ({u['decode_tokens'] / u['decode_wall_ms'] * 1e3:,.0f} "
          f"tokens/s), of it in decode steps {u['decode_steps_ms']:.1f} ms")
    for name, key in (("step", "step_by_tokens"), ("forward", "forward_by_tokens"),
                      ("its graph replays", "replay_by_tokens")):
        print(f"   {name} by step tokens (median ms, steps): " + ", ".join(
            f"{t}: {v['median_ms']:.3f} x{v['steps']}" for t, v in u[key].items()))
    for t, parts in u["parts_by_tokens"].items():
        print(f"   parts of {t}-token steps (mean ms): " + ", ".join(
            f"{k} {v:.3f}" for k, v in parts.items() if v >= 0.0005))


def report_profile(r: dict) -> None:
    host_share = 1 - r["device_busy_ms_per_pass"] / r["wall_ms_per_pass"]
    print(f"== {r['mode']}, profiled: {r['tokens']} tokens in {r['wall_s']:.3f} s, "
          f"{r['target_passes']} passes (tau {r['tau'] or 1:.2f}): {r['wall_ms_per_pass']:.3f} "
          f"ms/pass wall, {r['device_busy_ms_per_pass']:.3f} ms/pass kernels, host share "
          f"{host_share:.0%}")
    for x in r["top_host_ops"][:10]:
        print(f"   host {x['self_cpu_ms']:9.3f} ms {x['calls']:7d}x  {x['op']}")
    for x in r["top_kernels"][:10]:
        print(f"   gpu  {x['device_ms']:9.3f} ms {x['calls']:7d}x  {x['kernel']}")


def bench_prompts(args) -> list:
    """args.per_category prompts of each of args.categories from args.prompts_file;
    SystemExit naming them when none match."""
    prompts = load_prompts(args.prompts_file, per_category=args.per_category,
                           categories=tuple(args.categories))
    if not prompts:
        raise SystemExit(f"--categories {args.categories}: no prompts in {args.prompts_file}")
    return prompts


def build_parser(description: str = __doc__.split("\n")[0]) -> argparse.ArgumentParser:
    """This script's options (bench/paired_split.py adds its own to them)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--device", default="cuda", help="cuda | cpu (a dry run)")
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS)
    ap.add_argument("--categories", nargs="+", default=["translation", "mt_bench"])
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=["off", "copy", "drafter", "copy+drafter"])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--drafter-attention", default="kernel", choices=["dense", "sdpa", "kernel"])
    ap.add_argument("--cpu-affinity", default=None, metavar="CPUS",
                    help="EngineArgs.cpu_affinity: gpu-local or a CPU list (default: as it is)")
    ap.add_argument("--drafter-gate", default="always", choices=["always", "adaptive"])
    ap.add_argument("--drafts-on-device", default="auto", choices=list(DRAFTS_ON_DEVICE))
    ap.add_argument("--drafter-chain", default="auto", choices=list(DRAFTS_ON_DEVICE))
    ap.add_argument("--warm-runs", type=int, default=0,
                    help="whole untimed generates of the prompts before the timed one")
    ap.add_argument("--gc", default="on", choices=["on", "off", "freeze"],
                    help="Python's garbage collector during the timed run: as is, disabled, "
                         "or with the heap so far frozen (gc.freeze, as vLLM does at start-up)")
    ap.add_argument("--profiler", default="on", choices=["on", "off"],
                    help="after every mode's timed run, one torch.profiler run per mode")
    ap.add_argument("--out", type=Path, default=Path("."))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prompts = bench_prompts(args)
    results, llms = [], []
    for mode in args.modes:      # every timed run before any profiler (profiled_mode)
        llm, r = timed_mode(args, mode, prompts)
        llms.append(llm)
        results.append(r)
        report_split(r)
    if args.profiler == "on":
        for llm, r in zip(llms, results):
            r.update(profiled_mode(args, llm, prompts))
            report_profile(r)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_generate.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
