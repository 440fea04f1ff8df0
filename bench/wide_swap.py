#!/usr/bin/env python3
"""The swapped GEMV form (weights as the MMA's A operand, rows as its N) past 8 rows, on the
H200. One call:

    python3 bench/wide_swap.py [--out DIR] [--kernels fp8,nvfp4] [--ms 16,32,64] [--swap-rows 64]
        [--warps 1,4] [--stages 3,5]

fp8_gemv (QKV 3584 x 2560 and o_proj 2560 x 2560 per tensor, the drafter's 7680 x 2560 with
1x64 block scales) and nvfp4_gemv (LM head 131072 x 2560, drafter head 60614 x 2560) at M = 16,
32, 64: the file's settings (shown as 0s), then the swapped form for
every M up to 64 (SWAP_ROWS 64) in tiles of ROWS_SWAP = 16, 32 or 64 rows, one weight pass per
tile, at other warps and stages. (Ran at a339116, bench/results/h200-2026-12-01e/od/; fp8_gemv's
16- and 32-row tiles past 8 rows are its default since, SWAP_TILES.) Compiled for sm_90 here first (bench/aot_sass.py):
nvfp4 at 64 rows, BLOCK_N 64, 4 warps: the 16-row form with 4 row tiles 992 SASS instructions
per K step, 255 registers and 144 B of spills; swapped 64-row tiles 908, 224 registers (a
wgmma), 32-row 812; fp8 at one warp (mma.sync): 8 / 16 / 32 rows 769 / 941 / 1228
instructions per K step (BLOCK_N 32), 64 rows spill. Each output keeps its K order (the MMA
tiles N by 8), so the bits must equal the defaults'; every row says whether they do. Time as
bench/plugins.py (one CUDA graph over rotated weight sets, median of 5 x 20 replays), bytes =
weights (+ scales) + x + y, TB/s and % of the 4.14 TB/s read ceiling. JSON:
$OUT/wide_swap.json. With --swap-rows past 64 and --ms past 64 (verification passes: 16
streams x 5-9 tokens are 80-144 rows, where QKV and o_proj take the 16-row form with up to 4
row tiles per program, WIDE_TILES, reading the weights once per 64 rows): the swapped form
there, also in 64-row tiles at 4 warps.
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
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv  # noqa: E402

F8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
NV = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")
K = 2560
FP8_SHAPES = (("qkv", 3584, "tensor"), ("o_proj", 2560, "tensor"), ("drafter_mlp", 7680, "block"))
HEADS = (("lm_head", 131072), ("drafter_head", 60614))
def fp8_grid(swap_rows: int, warps=(1, 4), stages=(3, 5)) -> list[tuple]:
    """(SWAP_ROWS, rows per tile, num_warps, num_stages) variants of fp8_gemv's swapped form."""
    grid = [(swap_rows, r, w, s) for r, w, s in itertools.product((16, 32), warps, stages)]
    return grid + ([(swap_rows, 64, 4, 3)] if swap_rows > 64 else [])


def nv_grid(swap_rows: int) -> list[tuple]:
    """(SWAP_ROWS, ROWS_SWAP, num_warps, num_stages) variants of nvfp4_gemv's swapped form."""
    return [(swap_rows, r, 4, s) for r, s in itertools.product((16, 32, 64), (3, 4))]


FILE = (0, 0, 0, 0)   # the file's own settings


def fp8_sets(n: int, mode: str) -> list[tuple]:
    """Random e4m3 [n, K] weights with per-tensor ("tensor") or 1x64 block scales, as many
    sets as rotate past the L2 (plugin_timing.sets_for)."""
    return [(torch.randn((n, K), device=PT.DEV).to(PT.E4M3),
             torch.tensor([0.02], device=PT.DEV) if mode == "tensor"
             else torch.rand((n, K // 64), device=PT.DEV)) for _ in range(PT.sets_for(n * K))]


def nvfp4_sets(n: int) -> tuple[list[tuple], int]:
    """Random NVFP4 [n, K] weights (packed e2m1, e4m3 block scales, global scale) rotated past
    the L2, and the bytes of one set."""
    wbytes = n * K // 2 + n * K // 16
    return [(torch.randint(0, 256, (n, K // 2), dtype=torch.uint8, device=PT.DEV),
             (torch.rand((n, K // 16), device=PT.DEV) + 0.25).to(PT.E4M3),
             torch.tensor([0.02], device=PT.DEV)) for _ in range(PT.sets_for(wbytes))], wbytes


def setter(mod):
    """apply(swap_rows, rows_swap, warps, stages) on mod (fp8_gemv: one SWAP_TILES entry;
    nvfp4_gemv: ROWS_SWAP and TUNE_SWAP); FILE restores the file's settings."""
    names = ("SWAP_ROWS", "SWAP_TILES") if hasattr(mod, "SWAP_TILES") else (
        "SWAP_ROWS", "ROWS_SWAP", "TUNE_SWAP")
    saved = {k: getattr(mod, k) for k in names}

    def apply(swap_rows, rows_swap, warps, stages):
        for k, v in saved.items():
            setattr(mod, k, v)
        if (swap_rows, rows_swap, warps, stages) == FILE:
            return
        mod.SWAP_ROWS = swap_rows
        if "SWAP_TILES" in saved:
            mod.SWAP_TILES = ((swap_rows, rows_swap, warps, stages),)
        else:
            mod.ROWS_SWAP = rows_swap
            mod.TUNE_SWAP = dict(saved["TUNE_SWAP"], num_warps=warps, num_stages=stages)
    return apply, FILE


SWAP_FIELDS = ("swap_rows", "rows_swap", "warps", "stages")


def run(rows, kernel, name, nbytes_w, n, m, calls, grid, apply, default, fields=SWAP_FIELDS):
    """Time the defaults and each grid variant (apply(*variant) sets it; fields name its
    values) of one shape and M, every variant's bits against the defaults'; a dict each."""
    base = calls[0]()
    nbytes = nbytes_w + m * (n + K) * 2
    for v, us, same in PT.variants(f"{kernel} {name} M={m}", calls, default, grid, apply,
                                   lambda y: torch.equal(y, base)):
        tbs = nbytes / us / 1e6
        pct = 100 * tbs * 1e12 / PT.BW
        rows.append(dict(kernel=kernel, shape=name, M=m, **dict(zip(fields, v)), us=us,
                         TBs=tbs, pct=pct, bits_equal=same, default=v == default))
        desc = " ".join(f"{k}={x}" for k, x in zip(fields, v))
        print(f"{kernel} {name:12s} M={m:3d} {desc} {us:8.1f} us {tbs:5.2f} TB/s {pct:5.1f}%  "
              f"bits == default: {same}{'  (default)' if v == default else ''}", flush=True)


def sweep(kernels, ms, fp8_plan, nv_plan) -> list[dict]:
    """`run` over FP8_SHAPES (kernels holding "fp8") and HEADS ("nvfp4") at every M of ms;
    each plan: (grid, apply, default, fields) of that kernel's variants."""
    rows: list[dict] = []
    for name, n, mode in FP8_SHAPES if "fp8" in kernels else ():
        ws = fp8_sets(n, mode)
        for m in ms:
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            run(rows, "fp8", name, n * K, n, m, [lambda w=w: fp8_gemv(x, *w) for w in ws],
                *fp8_plan)
        del ws
        torch.cuda.empty_cache()
    for name, n in HEADS if "nvfp4" in kernels else ():
        ws, wbytes = nvfp4_sets(n)
        for m in ms:
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            run(rows, "nvfp4", name, wbytes, n, m, [lambda w=w: nvfp4_gemv(x, *w) for w in ws],
                *nv_plan)
        del ws
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else /tmp)")
    ap.add_argument("--kernels", default="fp8,nvfp4")
    ap.add_argument("--ms", default="16,32,64", help="rows per call, comma-separated")
    ap.add_argument("--swap-rows", type=int, default=64,
                    help="SWAP_ROWS of the swapped variants (>= the largest of --ms)")
    ap.add_argument("--warps", default="1,4", help="fp8 variants' num_warps, comma-separated")
    ap.add_argument("--stages", default="3,5", help="fp8 variants' num_stages, comma-separated")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    warps = tuple(int(v) for v in args.warps.split(","))
    stages = tuple(int(v) for v in args.stages.split(","))
    if min(ms) < 1 or max(ms) > args.swap_rows:
        ap.error(f"--ms: rows in 1..--swap-rows ({args.swap_rows}), got {args.ms}")
    kernels = args.kernels.split(",")
    if set(kernels) - {"fp8", "nvfp4"}:
        ap.error(f"--kernels: among fp8, nvfp4, got {args.kernels}")
    out = PT.out_dir()
    rows = sweep(kernels, ms, (fp8_grid(args.swap_rows, warps, stages), *setter(F8), SWAP_FIELDS),
                 (nv_grid(args.swap_rows), *setter(NV), SWAP_FIELDS))
    (out / "wide_swap.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
