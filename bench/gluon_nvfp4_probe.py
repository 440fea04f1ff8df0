#!/usr/bin/env python3
"""An NVFP4 GEMV on wgmma at every row count (plugins/NOTES.md, "Next" 3): the LM head and the
drafter's head slice, as bench/gluon_gemv_probe.py does the FP8 GEMV.

    python3 bench/gluon_nvfp4_probe.py --aot          # here, no GPU: compile for sm_90, count SASS
    python3 bench/gluon_nvfp4_probe.py --out DIR      # on the H200: check, then time

Per K step of BK = 256 a program of 4 warps takes 64 weight rows: 128 packed bytes and 16 e4m3
block scales per row and x's [MT, 256] tile come in through a cp.async ring. Each thread reads
32 bytes of each of its two rows (16-byte shared-memory reads) and the 16 scales of each; a
byte holds the K pair (2p, 2p+1), which is one register pair of wgmma's A operand (k width 2),
so the bytes are stored with each block's pairs permuted (`to_storage`: byte b holds pair
p(b), b's bits (p2 .. p6, p0, p1)) and the two decoded nibble tensors, joined, are relabelled
by bench/gluon_gemv_probe.py's `_to_logical` at BK 256 (the same bit order: k1, k8, ... k128,
k2, k4). The scales are expanded to the bytes' layout by a join and a lane broadcast (no data
moves). The decode is nvfp4_gemv's DECODE 3 (bit placement, scale product in bf16, the fp32
result times 2^16 · weight_scale_2). On the GPU: relative error against nvfp4_gemv_ref, row 0
alone against inside 16 / 64 / 144 rows, µs at 1-144 rows against nvfp4_gemv in each (SPLIT,
ASYNC) setting; JSON under --out.
"""

from __future__ import annotations

import pathlib
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from gluon_gemv_probe import (SHARED_BUDGET, check_case, finish, print_aot,  # noqa: E402
                              probe_main, time_rows)
from kolibri_trt_plugins._nvfp4_wgmma_gluon import (BCAST_LAYOUT, SCALE_LAYOUT,  # noqa: E402
                                                    _wgmma_nvfp4)
from kolibri_trt_plugins._wgmma_gluon import row_segments, storage_layout  # noqa: E402
from kolibri_trt_plugins.nvfp4_wgmma import (relabelled_columns,  # noqa: E402
                                             to_wgmma_storage as to_storage)


def check_relabel() -> None:
    """Every logical column of the decoded, joined and relabelled tile is its own weight
    (plugins/nvfp4_wgmma.relabelled_columns): AssertionError otherwise."""
    assert torch.equal(relabelled_columns(), torch.arange(256)), "nvfp4 relabel mismatch"


BK = 256                          # K per step (128 bytes, 16 scales per row)
SHAPES = {"lm_head": (131072, 2560), "drafter_head": (60614, 2560)}
# (SPLIT, ASYNC, most STAGES): (1, False, 4) as in bench/results/h200-2026-12-02e/gn/ (then
# with x rows past M clamped, one MT per launch); ASYNC gave wrong numbers there and in gn2/
# (untraced); 6 and 8 buffers lost to 4 at every row count (gn2/): third round 2-4
SETTINGS = ((1, False, 4), (1, False, 3), (1, False, 2))


def stages_for(mt: int, most: int = 4) -> int:
    """Ring buffers: up to `most`, as many as SHARED_BUDGET holds (at least 2)."""
    return max(2, min(most, SHARED_BUDGET // (64 * 128 + 64 * 16 + mt * 512)))


def wgmma_nvfp4(x, w_stored, weight_scale, weight_scale_2, split: int, is_async: bool = False,
                most: int = 4):
    """The probe's y bf16 [M, N]; split > 1: fp32 partials summed in order here (torch)."""
    M, K = x.shape
    N = w_stored.shape[0]
    if K % (split * BK):
        raise ValueError(f"K {K} must be a multiple of SPLIT {split} x {BK}")
    out = (torch.empty((M, N), dtype=torch.bfloat16, device=x.device) if split == 1 else
           torch.empty((split, M, N), dtype=torch.float32, device=x.device))
    for m0, mt, tiles in row_segments(M):   # the row tiles as gluon_gemv_probe's
        _wgmma_nvfp4[(triton.cdiv(N, 64), tiles, split)](
            w_stored, weight_scale, weight_scale_2, x, out, M, N, K, K // 2, K // 16,
            K // (split * BK), m0, MT=mt, SPLIT=split, WB=storage_layout(128),
            SL=SCALE_LAYOUT, L3=BCAST_LAYOUT, STAGES=stages_for(mt, most), ASYNC=is_async,
            num_warps=4)
    if split == 1:
        return out
    total = out[0]
    for i in range(1, split):
        total = total + out[i]
    return (total * (weight_scale_2 * 65536.0)).to(torch.bfloat16)


def aot(mt: int, split: int, is_async: bool = False, pdl: int = 0):
    sig = dict(w_ptr="*u8", ws_ptr="*fp8e4nv", gs_ptr="*fp32", x_ptr="*bf16", y_ptr="*bf16",
               M="i32", N="i32", K="i32", sw_n="i32", ss_n="i32", STEPS="i32", m_base="i32",
               MT="constexpr", SPLIT="constexpr",
               WB="constexpr", SL="constexpr", L3="constexpr", STAGES="constexpr",
               ASYNC="constexpr", PDL="constexpr")
    src = GluonASTSource(_wgmma_nvfp4, sig, constexprs=dict(
        MT=mt, SPLIT=split, WB=storage_layout(128), SL=SCALE_LAYOUT, L3=BCAST_LAYOUT,
        STAGES=stages_for(mt), ASYNC=is_async, PDL=pdl),
        attrs={(k,): [["tt.divisibility", 16]] for k in range(11)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def run_aot() -> int:
    check_relabel()
    print("to_storage and the relabelling pair every logical column with its nibble")
    for mt, is_async in ((8, False), (32, False), (64, False), (128, False), (8, True)):
        print_aot(f"MT {mt:3d}" + (" async" if is_async else ""), aot(mt, 1, is_async))
    return 0


def run_gpu(out: pathlib.Path) -> int:
    from plugin_timing import sets_for
    from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv, nvfp4_gemv_ref
    from kolibri_trt_plugins.testing import nvfp4_weight
    results, bad = [], 0
    for name, (N, K) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        ws = [nvfp4_weight(N, K, g, device="cuda") for _ in range(sets_for(N * K // 2))]
        stored = [(to_storage(w), s, s2) for w, s, s2 in ws]
        x_all = torch.randn((144, K), device="cuda").bfloat16()
        ref = nvfp4_gemv_ref(x_all, *ws[0]).float()
        calls = {"nvfp4_gemv": (nvfp4_gemv, ws)}
        for split, is_async, most in SETTINGS:
            def fn(x, w, s, s2, split=split, is_async=is_async, most=most):
                return wgmma_nvfp4(x, w, s, s2, split, is_async, most)
            tag = f"s{split}_st{most}" + ("_async" if is_async else "")
            rec, ok = check_case(f"{name} {tag}", lambda x, w0=stored[0]: fn(x, *w0), x_all, ref)
            results.append(dict(shape=name, split=split, is_async=is_async, most=most, **rec))
            bad += not ok
            calls[f"wgmma_{tag}"] = (fn, stored)
        results += time_rows(name, x_all, calls)
        del ws, stored, calls
        torch.cuda.empty_cache()
    return finish(out, "gluon_nvfp4.json", results, bad)


if __name__ == "__main__":
    sys.exit(probe_main(__doc__, run_aot, run_gpu, "gluon_nvfp4_out"))
