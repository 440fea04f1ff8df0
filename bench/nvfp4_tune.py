#!/usr/bin/env python3
"""The NVFP4 GEMV's launch settings on the H200, full Kolibri-1 head shapes. One call:

    python3 bench/nvfp4_tune.py [--out DIR] [--quick]

Per head (LM head 131072 x 2560 at M = 1, 16, 64; drafter head slice 60614 x 2560 at M = 1,
16) the file's defaults, then BLOCK_N_MAX x MAX_TILES x num_warps x num_stages (GRID). Time as bench/plugins.py (one CUDA graph
over rotated weight sets, median of 5 x 20 replays); bytes = packed weights + block scales +
x + y; TB/s and % of the 4.14 TB/s read ceiling. Every variant's output is compared bit for bit
with the defaults' (none changes a dot's K order: the N tile groups output columns, MAX_TILES
groups 16-row tiles). The JSON (``nvfp4_tune.json``) holds every row.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from gpu_check import load_plugins  # noqa: E402

load_plugins()
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv  # noqa: E402

NV = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")
K = 2560
HEADS = (("lm_head", 131072), ("drafter_head", 60614))
# per M: the grid of (BLOCK_N_MAX, MAX_TILES, num_warps, num_stages) tried
GRID = {1: ([32, 64, 128], [4], [4, 8], [3, 4, 5]),
        16: ([32, 64, 128], [4], [4], [3, 4]),
        64: ([32, 64], [1, 2, 4], [4], [3, 4])}
QUICK = {1: ([64], [1], [4], [3, 4]), 16: ([64], [1], [4], [3]), 64: ([64], [1, 4], [4], [3])}
DRAFTER_GRID = {1: GRID[16], 16: GRID[16]}   # the drafter head serves 1-16 rows


def apply(bn: int, mt: int, warps: int, stages: int) -> None:
    NV.BLOCK_N_MAX, NV.MAX_TILES = bn, mt
    NV.TUNE.update(num_warps=warps, num_stages=stages)


def weights(n: int, sets: int):
    return [(torch.randint(0, 256, (n, K // 2), dtype=torch.uint8, device=PT.DEV),
             (torch.rand((n, K // 16), device=PT.DEV) + 0.25).to(PT.E4M3),
             torch.tensor([0.02], device=PT.DEV)) for _ in range(sets)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    default = (NV.BLOCK_N_MAX, NV.MAX_TILES, NV.TUNE["num_warps"], NV.TUNE["num_stages"])
    rows = []
    for name, n in HEADS:
        wbytes = n * K // 2 + n * K // 16
        ws = weights(n, PT.sets_for(wbytes))
        grids = QUICK if args.quick else (GRID if name == "lm_head" else DRAFTER_GRID)
        for m, grid in grids.items():
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            nbytes = wbytes + m * (K + n) * 2
            apply(*default)
            base = nvfp4_gemv(x, *ws[0])
            for v in [default] + [c for c in itertools.product(*grid) if c != default]:
                apply(*v)
                try:
                    same = torch.equal(nvfp4_gemv(x, *ws[0]), base)
                    us = PT.time_calls([lambda w=w: nvfp4_gemv(x, *w) for w in ws])
                except Exception as exc:  # one variant's failure must not hide the others
                    print(f"{name} M={m} {v}: FAILED {str(exc)[:300]}", flush=True)
                    continue
                tbs = nbytes / us / 1e6
                rows.append(dict(head=name, M=m, block_n_max=v[0], max_tiles=v[1], warps=v[2],
                                 stages=v[3], us=us, MB=nbytes / 1e6, TBs=tbs,
                                 pct=100 * tbs * 1e12 / PT.BW, bits_equal=same,
                                 default=v == default))
                print(f"{name:12s} M={m:2d} bn={v[0]:3d} tiles={v[1]} warps={v[2]} "
                      f"stages={v[3]} {us:8.1f} us {tbs:5.2f} TB/s "
                      f"{100 * tbs * 1e12 / PT.BW:5.1f}%  bits == default: {same}"
                      f"{'  (default)' if v == default else ''}", flush=True)
        del ws
        torch.cuda.empty_cache()
    apply(*default)
    for name, _ in HEADS:
        for m in GRID:
            mine = [r for r in rows if r["head"] == name and r["M"] == m]
            if mine:
                best = min(mine, key=lambda r: r["us"])
                cur = next((r["us"] for r in mine if r["default"]), float("nan"))
                print(f"BEST {name} M={m}: {best['us']:.1f} us (default {cur:.1f}) "
                      f"bn={best['block_n_max']} tiles={best['max_tiles']} "
                      f"warps={best['warps']} stages={best['stages']}", flush=True)
    (out / "nvfp4_tune.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
