#!/usr/bin/env python3
"""The MoE expert GEMM's launch settings on the H200, full Kolibri-1 MoE shapes (E = 256, top-6,
H = 2560, I = 768, one shared expert). One call:

    python3 bench/moe_pipeline.py [--out DIR] [--breakdown] [--defaults-only]

Per M in 1, 4, 16, 64: moe_forward at the file's defaults and at other num_stages, register
caps (maxnreg) and the row tiles unrolled (TILE_LOOP off); time as bench/plugins.py (one CUDA
graph over rotated input sets, median of 5 x 20 replays), bytes = router + distinct experts +
shared + x/y, TB/s and % of the 4.14 TB/s read ceiling. Every variant's output is compared bit
for bit with the file's defaults (no setting changes a dot or its K order). --breakdown: then,
per M, the defaults' kernels under torch.profiler (µs per moe_forward call, by kernel name); it
runs last, since a profiler run slows the process's later CUDA calls. Earlier variant lists
(the 16-row form: stages 3/4, wider tiles, BLOCK_K 256):
bench/results/h200-2026-11-30h/zp/moe_pipeline.log.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from gpu_check import load_plugins  # noqa: E402
from plugin_sweeps import moe_bytes  # noqa: E402

load_plugins()
from kolibri_trt_plugins.moe import moe_forward  # noqa: E402

ME = importlib.import_module("kolibri_trt_plugins.moe_experts")
E, H, INTER, TOPK = 256, 2560, 768, 6
TUNES = ("TUNE", "TUNE_SWAP", "TUNE_SWAP_WIDE", "TUNE_SWAP_MANY",
         "TUNE_SWAP_MOST")   # every launch config
DEFAULT_TUNES = {t: dict(getattr(ME, t)) for t in TUNES}
# (num_stages or None = the file's, BLOCK_K, num_warps, maxnreg or None, TILE_LOOP): register
# caps (AOT at 64 tokens with TILE_LOOP: 188 registers, 2 programs per SM; 168 -> 3, 128 -> 4),
# stages 5 (at 64 tokens, unrolled tiles: 382.0 -> 359.9 µs), the unrolled row tiles; the first
# is the file's default. Earlier lists (narrower / half-width N tiles, BLOCK_K 64, stages 3,
# 16-token passes as two 8-token MMAs, since removed): bench/results/h200-2026-12-01d/nw/.
FILE_LOOP = ME.TILE_LOOP
VARIANTS = [(None, 128, 4, None, FILE_LOOP), (None, 128, 4, None, not FILE_LOOP),
            (5, 128, 4, None, FILE_LOOP), (5, 128, 4, 168, FILE_LOOP),
            (None, 128, 4, 168, FILE_LOOP), (None, 128, 4, 128, FILE_LOOP),
            (6, 128, 4, None, FILE_LOOP)]
PROFILED = 10   # graph replays under the profiler (--breakdown)


def apply(v):
    ns, block_k, warps, maxnreg, loop = v
    ME.BLOCK_K, ME.TILE_LOOP = block_k, loop
    for t in TUNES:
        tune = getattr(ME, t)
        tune.clear()
        tune.update(DEFAULT_TUNES[t], num_warps=warps)
        if ns is not None:
            tune["num_stages"] = ns
        if maxnreg is not None:
            tune["maxnreg"] = maxnreg


def breakdown(xs, wts) -> dict:
    """µs per moe_forward call by kernel name: one graph of the calls over xs, PROFILED replays
    under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    g = torch.cuda.CUDAGraph()
    for x in xs:
        moe_forward(x, *wts, top_k=TOPK)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for x in xs:
            moe_forward(x, *wts, top_k=TOPK)
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            g.replay()
        torch.cuda.synchronize()
    calls = PROFILED * len(xs)
    return {e.key[:60]: getattr(e, "device_time_total", 0) / calls
            for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--defaults-only", action="store_true", help="time the defaults alone")
    args = ap.parse_args()
    out = PT.out_dir()
    wts = PT.moe_weights(E, H, INTER)
    rows = []
    for M in (1, 4, 16, 64):
        xs = [torch.randn((M, H), device=PT.DEV).bfloat16() for _ in range(8)]
        nbytes = moe_bytes(xs, wts[0], E, H, INTER, TOPK)
        apply(VARIANTS[0])
        base = [moe_forward(x, *wts, top_k=TOPK) for x in xs]
        for v in VARIANTS[:1] if args.defaults_only else VARIANTS:
            apply(v)
            try:
                same = all(torch.equal(moe_forward(x, *wts, top_k=TOPK), b)
                           for x, b in zip(xs, base))
                us = PT.time_calls([lambda x=x: moe_forward(x, *wts, top_k=TOPK) for x in xs])
            except Exception as exc:  # one variant's failure must not hide the others
                print(f"M={M:2d} {v}: FAILED {str(exc)[:300]}", flush=True)
                continue
            tbs = nbytes / us / 1e6
            rows.append(dict(M=M, stages=v[0], block_k=v[1], warps=v[2],
                             maxnreg=v[3], tile_loop=v[4], us=us, MB=nbytes / 1e6, TBs=tbs,
                             pct=100 * tbs * 1e12 / PT.BW, bits_equal=same))
            print(f"M={M:2d} stages={v[0] or 'file'} "
                  f"block_k={v[1]} warps={v[2]} maxnreg={v[3]} loop={v[4]} {us:8.1f} us "
                  f"{nbytes / 1e6:7.1f} MB "
                  f"{tbs:5.2f} TB/s {100 * tbs * 1e12 / PT.BW:5.1f}%  bits == default: {same}",
                  flush=True)
    apply(VARIANTS[0])
    if args.breakdown:
        for M in (1, 4, 16, 64):
            xs = [torch.randn((M, H), device=PT.DEV).bfloat16() for _ in range(8)]
            parts = breakdown(xs, wts)
            rows.append(dict(M=M, breakdown=parts))
            print(f"breakdown M={M:2d}: total {sum(parts.values()):.1f} us per call | "
                  + " | ".join(f"{k} {v:.1f}" for k, v in sorted(parts.items(),
                                                                   key=lambda r: -r[1])),
                  flush=True)
    (out / "moe_pipeline.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("bits_equal", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
