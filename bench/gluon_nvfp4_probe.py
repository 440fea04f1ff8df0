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
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                               warpgroup_mma_init,
                                                               warpgroup_mma_wait)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from gluon_gemv_probe import (SHARED_BUDGET, _drain, _issue_mma, _store_tile,  # noqa: E402
                              _to_logical, check_case, finish, print_aot, probe_main,
                              row_segments, storage_layout, time_rows)
from kolibri_trt_plugins.nvfp4_gemv import E2M1_BF16_PTX  # noqa: E402

BK = 256                          # K per step (128 bytes, 16 scales per row)
SHAPES = {"lm_head": (131072, 2560), "drafter_head": (60614, 2560)}
# (SPLIT, ASYNC, most STAGES): (1, False, 4) as in bench/results/h200-2026-12-02e/gn/ (then
# with x rows past M clamped, one MT per launch); ASYNC gave wrong numbers there and in gn2/
# (untraced); 6 and 8 buffers lost to 4 at every row count (gn2/): third round 2-4
SETTINGS = ((1, False, 4), (1, False, 3), (1, False, 2))
PAIR_BITS = (2, 3, 4, 5, 6, 0, 1)   # pair bit held by storage byte bit i (BK 256)
SCALE_LAYOUT = gl.DistributedLinearLayout(   # [64, 16] scales: a row's 16 in one thread
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]],
    lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]],
    block_bases=[], shape=[64, 16])
BCAST_LAYOUT = gl.DistributedLinearLayout(   # [64, 4, 32]: the byte layout, pair bits 0-1 apart
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16], [8, 0, 0]],
    lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 32])


E2M1_BF16_ASM = gl.constexpr(E2M1_BF16_PTX)


@gluon.jit
def _e2m1_pairs_to_bf16(wq, sb):
    """nvfp4_gemv's DECODE 3 (plugins/nvfp4_gemv.py): packed pairs and bf16 scales (· 2^110)
    -> (low, high nibbles) as bf16 = value · scale · 2^-16, exactly."""
    return gl.inline_asm_elementwise(E2M1_BF16_ASM, "=r,=r,=r,=r,r,r,r", [wq, sb],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)


@gluon.jit
def _scale_to_bf16(s):
    """e4m3 block scales -> bf16 scale · 2^110 (the DECODE 3 convention) by bit placement:
    (code & 0x7F) << 4 with the sign on top is scale · 2^-120 (plugins/_e4m3_decode.py),
    then two exact products by 2^115 (bf16 has no 2^230)."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 r, z, k; mov.b32 z, 0; mov.b32 k, 0x79007900; "
        "prmt.b32 r, $2, z, 0x9180; shl.b32 r, r, 4; and.b32 r, r, 0x87F087F0; "
        "mul.rn.bf16x2 r, r, k; mul.rn.bf16x2 $0, r, k; "
        "prmt.b32 r, $2, z, 0xB3A2; shl.b32 r, r, 4; and.b32 r, r, 0x87F087F0; "
        "mul.rn.bf16x2 r, r, k; mul.rn.bf16x2 $1, r, k; }",
        "=r,=r,r", [s.to(gl.uint8, bitcast=True)], dtype=gl.bfloat16, is_pure=True, pack=4)


@gluon.jit
def _scales_to_bytes(sb, WB: gl.constexpr, L3: gl.constexpr):
    """bf16 [64, 16] block scales (SCALE_LAYOUT) -> [64, 128] in the bytes' layout WB: byte b
    gets the scale of its 16-column block (b's bits 1-4); registers only."""
    t = gl.reshape(gl.join(sb, sb), [64, 32])
    t = gl.expand_dims(gl.convert_layout(t, gl.SliceLayout(1, L3), assert_trivial=True), 1)
    t, _ = gl.broadcast(t, gl.full([64, 4, 32], 0, gl.bfloat16, layout=L3))
    return gl.convert_layout(gl.reshape(t, [64, 128]), WB, assert_trivial=True)


@gluon.jit
def _wgmma_nvfp4(w_ptr, ws_ptr, gs_ptr, x_ptr, y_ptr, M, N, K, sw_n, ss_n, STEPS, m_base,
                 MT: gl.constexpr, SPLIT: gl.constexpr, WB: gl.constexpr, SL: gl.constexpr,
                 L3: gl.constexpr, STAGES: gl.constexpr, ASYNC: gl.constexpr = False):
    """y [M, N] bf16 (SPLIT 1) or fp32 partials [SPLIT, M, N] (unscaled by weight_scale_2 ·
    2^16: the probe's host code applies it) of x · W^T, W in storage order (`to_storage`);
    program_id(2) takes STEPS steps of 256 columns. sw_n = K/2 and ss_n = K/16 (the row
    strides, as arguments so that they are known divisible by 16: 16-byte cp.async)."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, MT, 16])
    cp_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])     # [64, 128] B
    cs_l: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0])    # [64, 16] B
    xcp_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])    # [MT, 256]
    ws_l: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
    ss_l: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=1, order=[1, 0])
    xs_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MT, 256], gl.bfloat16)
    n0 = gl.program_id(0) * 64
    m0 = m_base + gl.program_id(1) * MT
    s = gl.program_id(2)
    wr = gl.minimum(n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, cp_l)), N - 1)
    sr = gl.minimum(n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, cs_l)), N - 1)
    xr = m0 + gl.arange(0, MT, layout=gl.SliceLayout(1, xcp_l))
    xm = gl.minimum(xr, M - 1)
    x_in = (xr < M)[:, None] & (gl.arange(0, 256, layout=gl.SliceLayout(0, xcp_l)) < 256)[None, :]
    w_tile = w_ptr + wr.to(gl.int64)[:, None] * sw_n + \
        gl.arange(0, 128, layout=gl.SliceLayout(0, cp_l))[None, :]
    s_tile = ws_ptr + sr.to(gl.int64)[:, None] * ss_n + \
        gl.arange(0, 16, layout=gl.SliceLayout(0, cs_l))[None, :]
    x_tile = x_ptr + xm.to(gl.int64)[:, None] * K + \
        gl.arange(0, 256, layout=gl.SliceLayout(0, xcp_l))[None, :]
    w_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 128], ws_l)
    s_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 64, 16], ss_l)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, MT, 256], xs_l)
    acc = gl.zeros([64, MT], gl.float32, layout=acc_l)
    j_lo = s * STEPS
    j_last = j_lo + STEPS - 1
    D: gl.constexpr = STAGES - 2 if ASYNC else STAGES - 1    # steps the copies run ahead
    for i in gl.static_range(D):            # past the range: the last step again (unused)
        j = gl.minimum(j_lo + i, j_last)
        async_copy.async_copy_global_to_shared(w_ring.index(i), w_tile + j * 128)
        async_copy.async_copy_global_to_shared(s_ring.index(i), s_tile + j * 16)
        async_copy.async_copy_global_to_shared(x_ring.index(i), x_tile + j * 256, mask=x_in)
        async_copy.commit_group()
    if ASYNC:
        acc = warpgroup_mma_init(acc)
    slot = 0
    for j0 in range(j_lo, j_lo + STEPS):
        async_copy.wait_group(D - 1)
        fence_async_shared()
        gl.thread_barrier()
        nxt = (slot + D) % STAGES
        j = gl.minimum(j0 + D, j_last)
        async_copy.async_copy_global_to_shared(w_ring.index(nxt), w_tile + j * 128)
        async_copy.async_copy_global_to_shared(s_ring.index(nxt), s_tile + j * 16)
        async_copy.async_copy_global_to_shared(x_ring.index(nxt), x_tile + j * 256, mask=x_in)
        async_copy.commit_group()
        raw = w_ring.index(slot).load(WB)
        sraw = s_ring.index(slot).load(SL)
        if ASYNC:   # the decode may reuse the last wgmma's A registers (gluon_gemv_probe)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        lo, hi = _e2m1_pairs_to_bf16(raw, _scales_to_bytes(_scale_to_bf16(sraw), WB, L3))
        w = _to_logical(gl.reshape(gl.join(lo, hi), [64, 256]), 256)
        acc = _issue_mma(w, x_ring.index(slot), acc, ASYNC)
        slot = (slot + 1) % STAGES
    _store_tile(_drain(acc, ASYNC), y_ptr, gl.load(gs_ptr) * 65536.0, M, N, n0, m0, s, SPLIT)


def to_storage(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] packed pairs -> the same bytes with each block of 128 permuted: byte b
    holds pair Σ bit_i(b) << PAIR_BITS[i] (exact: bytes move)."""
    n, kb = weight.shape
    src = torch.tensor([sum(((b >> i) & 1) << PAIR_BITS[i] for i in range(7))
                        for b in range(128)], device=weight.device)
    return weight.view(n, kb // 128, 128)[:, :, src].reshape(n, kb).contiguous()


def check_relabel() -> None:
    """Logical column k after the decode, the join and `_to_logical` is nibble k & 1 of pair
    k >> 1 (torch emulation of the reshape and permute): AssertionError otherwise."""
    joined = torch.arange(256).reshape([1] + [2] * 8).permute(0, 3, 4, 5, 6, 7, 1, 2, 8)
    joined = joined.reshape(256)                       # logical k <- joined column 2b + nibble
    stored = to_storage(torch.arange(128, dtype=torch.uint8).reshape(1, 128)).long()[0]
    pair = stored[joined // 2]
    assert torch.equal(pair * 2 + joined % 2, torch.arange(256)), "nvfp4 relabel mismatch"


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


def aot(mt: int, split: int, is_async: bool = False):
    sig = dict(w_ptr="*u8", ws_ptr="*fp8e4nv", gs_ptr="*fp32", x_ptr="*bf16", y_ptr="*bf16",
               M="i32", N="i32", K="i32", sw_n="i32", ss_n="i32", STEPS="i32", m_base="i32",
               MT="constexpr", SPLIT="constexpr",
               WB="constexpr", SL="constexpr", L3="constexpr", STAGES="constexpr",
               ASYNC="constexpr")
    src = GluonASTSource(_wgmma_nvfp4, sig, constexprs=dict(
        MT=mt, SPLIT=split, WB=storage_layout(128), SL=SCALE_LAYOUT, L3=BCAST_LAYOUT,
        STAGES=stages_for(mt), ASYNC=is_async),
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
