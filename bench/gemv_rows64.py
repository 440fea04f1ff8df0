#!/usr/bin/env python3
"""fp8_gemv past 16 rows in 64-row tiles of the unswapped form (x the MMA's A operand from
shared memory, the decoded weights its B: Triton emits wgmma for sm_90 there, 16 HGMMA and
64 PRMT per K step per warp at BLOCK_N 64, plugins/NOTES.md next step 2), on the H200. One call:

    python3 bench/gemv_rows64.py [--out DIR] [--ms 16,32,64,80,128,144]

QKV 3584 x 2560 and o_proj 2560 x 2560 (per tensor), the drafter's 7680 x 2560 (1x64 block
scales): the file's settings, then ROWS 64 with SWAP_ROWS 0 at N tiles of 16 / 32 / 64
(WIDE_TILES with one row tile per program), 4 / 8 warps, stages 2 / 3. Timed as
bench/plugins.py (one CUDA graph over rotated weight sets, median of 5 x 20 replays); every
row says whether its bits equal the defaults' (wgmma may sum a K step in another order than
mma.sync: the first thing to know). JSON: $OUT/gemv_rows64.json; exit 1 when any differs.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from gpu_check import load_plugins  # noqa: E402

load_plugins()
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402

F8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
K = 2560
SHAPES = (("qkv", 3584, "tensor"), ("o_proj", 2560, "tensor"), ("drafter_mlp", 7680, "block"))
NAMES = ("ROWS", "SWAP_ROWS", "WIDE_TILES", "WIDE_ROWS", "TUNE")
FILE = (0, 0, 0)   # the file's own settings
GRID = list(itertools.product((16, 32, 64), (4, 8), (2, 3)))   # (N tile, warps, stages)


def setter():
    """apply(n_tile, warps, stages): 64-row unswapped tiles; FILE restores the file's."""
    saved = {k: getattr(F8, k) for k in NAMES}

    def apply(n_tile, warps, stages):
        for k, v in saved.items():
            setattr(F8, k, v)
        if (n_tile, warps, stages) == FILE:
            return
        F8.ROWS, F8.SWAP_ROWS, F8.WIDE_ROWS = 64, 0, ()
        F8.WIDE_TILES = (n_tile, 1)
        F8.TUNE = dict(num_warps=warps, num_stages=stages)
    return apply


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else /tmp)")
    ap.add_argument("--ms", default="16,32,64,80,128,144", help="rows per call, comma-separated")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    out = PT.out_dir(["--out", args.out] if args.out else [])
    apply, rows = setter(), []
    for name, n, mode in SHAPES:
        ws = [(torch.randn((n, K), device=PT.DEV).to(PT.E4M3),
               torch.tensor([0.02], device=PT.DEV) if mode == "tensor"
               else torch.rand((n, K // 64), device=PT.DEV)) for _ in range(PT.sets_for(n * K))]
        for m in ms:
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            calls = [lambda w=w: fp8_gemv(x, *w) for w in ws]
            base = calls[0]()
            nbytes = n * K + m * (n + K) * 2
            for v, us, same in PT.variants(f"fp8 {name} M={m}", calls, FILE, GRID, apply,
                                           lambda y: torch.equal(y, base)):
                tbs = nbytes / us / 1e6
                rows.append(dict(shape=name, M=m, n_tile=v[0], warps=v[1], stages=v[2], us=us,
                                 TBs=tbs, bits_equal=same, default=v == FILE))
                print(f"fp8 {name:12s} M={m:3d} n_tile={v[0]:2d} warps={v[1]} stages={v[2]} "
                      f"{us:8.1f} us {tbs:5.2f} TB/s  bits == default: {same}"
                      f"{'  (default)' if v == FILE else ''}", flush=True)
        del ws
        torch.cuda.empty_cache()
    (out / "gemv_rows64.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
