#!/usr/bin/env python3
"""The MoE expert GEMM's launch settings on the H200, full Kolibri-1 MoE shapes (E = 256, top-6,
H = 2560, I = 768, one shared expert). One call:

    python3 bench/moe_pipeline.py [--out DIR]

Per M in 1, 4, 16, 64: moe_forward at num_stages 3 and 4, N tile widths by tokens
(moe_experts.TILE_N) and one wider setting, BLOCK_K 128 (the default since
bench/results/h200-2026-11-30h/zp/: AOT at M=64 80 KB and 255 registers per program), 256 and 64; time as bench/plugins.py (one CUDA graph over
rotated input sets, median of 5 x 20 replays), bytes = router + distinct experts + shared + x/y,
TB/s and % of the 4.14 TB/s read ceiling. Every variant's output is compared bit for bit with
the file's defaults (neither setting changes a dot or its K order). At 331f6de the script also
ran the old loop order (row tiles inside the K loop, not pipelined): bench/results/
h200-2026-11-30g/zh/moe_pipeline.log.
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
DEFAULT_TILES = dict(ME.TILE_N)
WIDE = {True: ((ME.MAX_TOKENS, 64),), False: ((ME.MAX_TOKENS, 128),)}  # gate_up 64, down 128
# (num_stages, TILE_N override or None = the file's, BLOCK_K); the first is the file's default
VARIANTS = [(3, None, 128), (4, None, 128), (3, WIDE, 128), (3, None, 256), (3, None, 64)]


def apply(v):
    ns, tiles, block_k = v
    ME.BLOCK_K = block_k
    ME.TUNE.update(num_warps=4, num_stages=ns)
    ME.TILE_N = tiles or DEFAULT_TILES


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    wts = PT.moe_weights(E, H, INTER)
    rows = []
    for M in (1, 4, 16, 64):
        xs = [torch.randn((M, H), device=PT.DEV).bfloat16() for _ in range(8)]
        nbytes = moe_bytes(xs, wts[0], E, H, INTER, TOPK)
        apply(VARIANTS[0])
        base = [moe_forward(x, *wts, top_k=TOPK) for x in xs]
        for v in VARIANTS:
            apply(v)
            try:
                same = all(torch.equal(moe_forward(x, *wts, top_k=TOPK), b)
                           for x, b in zip(xs, base))
                us = PT.time_calls([lambda x=x: moe_forward(x, *wts, top_k=TOPK) for x in xs])
            except Exception as exc:  # one variant's failure must not hide the others
                print(f"M={M:2d} {v}: FAILED {str(exc)[:300]}", flush=True)
                continue
            tbs = nbytes / us / 1e6
            rows.append(dict(M=M, stages=v[0], wide=v[1] is not None, block_k=v[2], us=us,
                             MB=nbytes / 1e6, TBs=tbs, pct=100 * tbs * 1e12 / PT.BW,
                             bits_equal=same))
            print(f"M={M:2d} stages={v[0]} tiles={'wide' if v[1] else 'file'} block_k={v[2]}"
                  f" {us:8.1f} us {nbytes / 1e6:7.1f} MB {tbs:5.2f} TB/s "
                  f"{100 * tbs * 1e12 / PT.BW:5.1f}%  bits == default: {same}", flush=True)
    apply(VARIANTS[0])
    (out / "moe_pipeline.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
