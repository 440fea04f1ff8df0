#!/usr/bin/env python3
"""The GEMVs' launch settings on the H200, full Kolibri-1 shapes. One call:

    python3 bench/gemv_tune.py [--kernels nvfp4,fp8,fp8tiles,router] [--out DIR] [--quick]

nvfp4: per head (LM head 131072 x 2560, drafter head slice 60614 x 2560) and M the file's
defaults, then BLOCK_N x MAX_TILES x num_warps x num_stages (GRID).
fp8: fp8_gemv at QKV 3584 x 2560 and o_proj 2560 x 2560 (per-tensor scale) and the drafter's
7680 x 2560 (1x64 block scales), M = 1, 16, 64: BLOCK_K x num_stages (FP8_GRID: bytes in flight
per program). fp8tiles: fp8_gemv at the three FP8 shapes, M = 16 and 64 (the 16-row form): N
tile x row tiles x num_warps x split-K (FP8_TILE_GRID; split-K sets other bits). router:
moe_route at E = 256, M = 1 and 64: BLOCK_H x num_stages x SPLIT_H x the top-k kernel's warps.
Time as bench/plugins.py (one CUDA graph over rotated weight sets, median of 5 x 20 replays);
bytes = the weights (+ block scales) + x + y; TB/s and % of the 4.14 TB/s read ceiling. Every
variant's output is compared bit for bit with the defaults' (the N tile groups output columns
and MAX_TILES 16-row tiles, neither changes a dot's K order; split-K and the router's H split
and top-k warps may). The JSON (``gemv_tune.json``) holds every row.
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
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402
from kolibri_trt_plugins.moe_route import moe_route  # noqa: E402
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv  # noqa: E402

NV = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")
F8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
RT = importlib.import_module("kolibri_trt_plugins.moe_route")
FP8_SHAPES = (("qkv", 3584, "tensor"), ("o_proj", 2560, "tensor"), ("drafter_mlp", 7680, "block"))
FP8_GRID = ([256, 512], [3, 4, 6, 8])    # BLOCK_K, num_stages (kf/ swept BLOCK_N_MAX, MAX_TILES)
# moe_route's BLOCK_H, num_stages, SPLIT_H, TOPK_WARPS
ROUTER_GRID = ([256, 512], [3], [2, 5], [1, 4])
# fp8_gemv's (N tile, row tiles per program, num_warps, SPLIT_K or None = by shape) at 16 and
# 64 rows: per-tensor shapes run them through WIDE_TILES, block scales through block_n_for /
# MAX_TILES (both set here)
FP8_TILE_GRID = [(16, 1, 4, None), (32, 4, 4, None), (64, 4, 4, None), (32, 2, 4, None),
                 (16, 1, 2, None), (32, 4, 4, 2), (64, 4, 4, 4)]
FP8_SAVED = (F8.block_n_for, F8.MAX_TILES, F8.WIDE_TILES, dict(F8.TUNE), F8.SPLIT_K)
K = 2560
HEADS = (("lm_head", 131072), ("drafter_head", 60614))
# per M: the grid of (BLOCK_N, MAX_TILES, num_warps, num_stages) tried (kt/ swept them at M = 1,
# 16, 64; ki/ at 2853218 also the grid order, since removed)
GRID = {1: ([64, 128], [4], [4, 8], [3, 4]),
        16: ([64, 128], [4], [4], [3]),
        64: ([64, 128], [1, 2, 4], [4], [3])}
QUICK = {1: ([64], [1], [4], [3, 4]), 64: ([64], [1, 4], [4], [3])}
DRAFTER_GRID = {16: GRID[16], 64: GRID[64]}


def apply(bn: int, mt: int, warps: int, stages: int) -> None:
    NV.BLOCK_N_MAX = NV.BLOCK_N_ONE_TILE = bn
    NV.MAX_TILES = mt
    NV.TUNE.update(num_warps=warps, num_stages=stages)


def _set_fp8(block_k: int, stages: int) -> None:
    F8.BLOCK_K = block_k
    F8.TUNE["num_stages"] = stages


def _set_fp8_tiles(bn: int, mt: int, warps: int, split) -> None:
    F8.block_n_for = lambda n, bn=bn: bn
    F8.MAX_TILES = mt
    F8.WIDE_TILES = (bn, mt)
    F8.TUNE["num_warps"] = warps
    F8.SPLIT_K = split


def fp8_tile_rows(rows: list) -> None:
    """fp8_gemv QKV, o_proj (per tensor) and the drafter's 7680x2560 (block scales) at M = 16,
    64 over FP8_TILE_GRID in the 16-row form (SWAP_ROWS 8 here: the default swaps up to 64
    rows, h200-2026-12-01e/od/), bits vs the form's defaults (split-K changes them)."""
    warps, split = F8.TUNE["num_warps"], F8.SPLIT_K
    swap_rows, F8.SWAP_ROWS = F8.SWAP_ROWS, 8
    for name, n, mode in FP8_SHAPES:
        default = ((*F8.WIDE_TILES, warps, split) if mode == "tensor" else
                   (F8.block_n_for(n), F8.MAX_TILES, warps, split))
        ws = [(torch.randn((n, K), device=PT.DEV).to(PT.E4M3),
               torch.tensor([0.02], device=PT.DEV) if mode == "tensor"
               else torch.rand((n, K // 64), device=PT.DEV)) for _ in range(PT.sets_for(n * K))]
        for m in (16, 64):
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            nbytes = n * K + m * (n + K) * 2
            calls = [lambda w=w: fp8_gemv(x, *w) for w in ws]
            base = calls[0]()
            try:
                for v, us, same in PT.variants(f"fp8 {name} M={m}", calls, default,
                                               FP8_TILE_GRID, _set_fp8_tiles,
                                               lambda y, base=base: torch.equal(y, base)):
                    pct = 100 * nbytes / (us * 1e-6) / PT.BW
                    rows.append(dict(kernel="fp8_gemv", shape=name, M=m, block_n=v[0],
                                     max_tiles=v[1], warps=v[2], split_k=v[3], us=us, pct=pct,
                                     bits_equal=same, default=v == default))
                    print(f"fp8 {name:12s} M={m:2d} bn={v[0]} tiles={v[1]} warps={v[2]} "
                          f"split={v[3]} {us:8.1f} us {pct:5.1f}%  bits == default: {same}"
                          f"{'  (default)' if v == default else ''}", flush=True)
            finally:
                F8.block_n_for, F8.MAX_TILES, F8.WIDE_TILES = FP8_SAVED[:3]
                F8.TUNE.update(FP8_SAVED[3])
                F8.SPLIT_K = FP8_SAVED[4]
        del ws
        torch.cuda.empty_cache()
    F8.SWAP_ROWS = swap_rows


def fp8_rows(rows: list) -> None:
    """fp8_gemv: each FP8_SHAPES matrix at M = 1, 16, 64 over FP8_GRID, bits vs the defaults.
    (At 3cd5c76 the grid was BLOCK_N_MAX x MAX_TILES at M = 16, 32, 64: h200-2026-11-30k/kf/.)"""
    default = (F8.BLOCK_K, F8.TUNE["num_stages"])
    for name, n, mode in FP8_SHAPES:
        ws = [(torch.randn((n, K), device=PT.DEV).to(PT.E4M3),
               torch.tensor([0.02], device=PT.DEV) if mode == "tensor"
               else torch.rand((n, K // 64), device=PT.DEV)) for _ in range(PT.sets_for(n * K))]
        for m in (1, 16, 64):
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            nbytes = n * K + m * (n + K) * 2
            calls = [lambda w=w: fp8_gemv(x, *w) for w in ws]
            base = calls[0]()
            for v, us, same in PT.variants(f"fp8 {name} M={m}", calls, default,
                                           itertools.product(*FP8_GRID), _set_fp8,
                                           lambda y, base=base: torch.equal(y, base)):
                pct = 100 * nbytes / (us * 1e-6) / PT.BW
                rows.append(dict(kernel="fp8_gemv", shape=name, M=m, block_k=v[0], stages=v[1],
                                 us=us, pct=pct, bits_equal=same, default=v == default))
                print(f"fp8 {name:12s} M={m:2d} block_k={v[0]:3d} stages={v[1]} {us:8.1f} us "
                      f"{pct:5.1f}%  bits == default: {same}"
                      f"{'  (default)' if v == default else ''}", flush=True)
        del ws
        torch.cuda.empty_cache()


def _set_router(block_h: int, stages: int, split_h: int, topk_warps: int) -> None:
    RT.BLOCK_H, RT.SPLIT_H, RT.TOPK_WARPS = block_h, split_h, topk_warps
    RT.TUNE["num_stages"] = stages


def router_rows(rows: list) -> None:
    """moe_route (router logits GEMV + top-k) at E = 256, H = 2560, M = 1 and 64 over
    ROUTER_GRID. With the defaults' H split and top-k warps the ids and weights must equal the
    defaults' bit for bit; otherwise (other logit or softmax-sum bits) the ids must, and the
    weights within 1e-5."""
    default = (RT.BLOCK_H, RT.TUNE["num_stages"], RT.SPLIT_H, RT.TOPK_WARPS)
    rws = [torch.randn((256, K), device=PT.DEV).bfloat16() * 0.05 for _ in range(32)]
    for m in (1, 64):
        x = torch.randn((m, K), device=PT.DEV).bfloat16()
        base = moe_route(x, rws[0], 6)
        calls = [lambda w=w: moe_route(x, w, 6) for w in rws]

        def check(got, base=base):
            return bool(torch.equal(got[0], base[0])), float((got[1] - base[1]).abs().max())
        for v, us, (ids_same, wdiff) in PT.variants(f"router M={m}", calls, default,
                                                    itertools.product(*ROUTER_GRID),
                                                    _set_router, check):
            ok = ids_same and (wdiff == 0.0 if v[2:] == default[2:] else wdiff < 1e-5)
            rows.append(dict(kernel="moe_route", M=m, block_h=v[0], stages=v[1], split_h=v[2],
                             topk_warps=v[3], us=us, ids_equal=ids_same, max_weight_diff=wdiff,
                             bits_equal=ok, default=v == default))
            print(f"router M={m:2d} block_h={v[0]:4d} stages={v[1]} split_h={v[2]} "
                  f"topk_warps={v[3]} {us:8.1f} us"
                  f"  ids equal: {ids_same}, weights within {wdiff:.1e}"
                  f"{'  (default)' if v == default else ''}", flush=True)


def weights(n: int, sets: int):
    return [(torch.randint(0, 256, (n, K // 2), dtype=torch.uint8, device=PT.DEV),
             (torch.rand((n, K // 16), device=PT.DEV) + 0.25).to(PT.E4M3),
             torch.tensor([0.02], device=PT.DEV)) for _ in range(sets)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kernels", default="nvfp4,fp8,router")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    if set(kernels) - {"nvfp4", "fp8", "fp8tiles", "router"}:
        ap.error(f"--kernels: among nvfp4, fp8, fp8tiles, router, got {args.kernels}")
    out = PT.out_dir()
    saved = (NV.BLOCK_N_MAX, NV.BLOCK_N_ONE_TILE, NV.MAX_TILES, dict(NV.TUNE))
    rows = []
    if "fp8" in kernels:
        fp8_rows(rows)
    if "fp8tiles" in kernels:
        fp8_tile_rows(rows)
    if "router" in kernels:
        router_rows(rows)
    for name, n in HEADS if "nvfp4" in kernels else ():
        wbytes = n * K // 2 + n * K // 16
        ws = weights(n, PT.sets_for(wbytes))
        grids = QUICK if args.quick else (GRID if name == "lm_head" else DRAFTER_GRID)
        for m, grid in grids.items():
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            nbytes = wbytes + m * (K + n) * 2
            default = (saved[1] if m <= NV.ROWS else saved[0], saved[2],
                       saved[3]["num_warps"], saved[3]["num_stages"])
            calls = [lambda w=w: nvfp4_gemv(x, *w) for w in ws]
            apply(*default)
            base = calls[0]()
            for v, us, same in PT.variants(f"{name} M={m}", calls, default,
                                           itertools.product(*grid), apply,
                                           lambda y, base=base: torch.equal(y, base)):
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
    NV.BLOCK_N_MAX, NV.BLOCK_N_ONE_TILE, NV.MAX_TILES = saved[:3]
    NV.TUNE.update(saved[3])
    for name, _ in HEADS:
        for m in (1, 16, 64):
            mine = [r for r in rows if r.get("head") == name and r["M"] == m]
            if mine:
                best = min(mine, key=lambda r: r["us"])
                cur = next((r["us"] for r in mine if r["default"]), float("nan"))
                print(f"BEST {name} M={m}: {best['us']:.1f} us (default {cur:.1f}) "
                      f"bn={best['block_n_max']} tiles={best['max_tiles']} "
                      f"warps={best['warps']} stages={best['stages']}", flush=True)
    (out / "gemv_tune.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] or r.get("split_k") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
