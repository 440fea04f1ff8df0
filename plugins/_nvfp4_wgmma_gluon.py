"""The Gluon kernel of plugins/nvfp4_wgmma.py (imported there at launch only: Gluon needs
Triton >= 3.6, and the plugins import without Triton).

Per K step of 256 a program of 4 warps (one warpgroup) takes 64 weight rows: 128 packed bytes
and 16 e4m3 block scales per row and x's [MT, 256] tile come in through a cp.async ring. Each
thread reads 32 bytes of each of its two rows (16-byte shared-memory reads) and the 16 scales
of each; a byte holds the K pair (2p, 2p+1), one register pair of wgmma's A operand (k width
2), so the bytes are stored with each block's pairs permuted (nvfp4_wgmma.to_wgmma_storage:
byte b holds pair p(b), b's bits (p2 .. p6, p0, p1)) and the two decoded nibble tensors,
joined, are relabelled by `_to_logical` at BK 256 (plugins/_wgmma_gluon.py). The scales reach
the bytes' layout by a join and a lane broadcast (no data moves). The decode is nvfp4_gemv's
DECODE 3 (bit placement, scale product in bf16, the fp32 result times 2^16 ·
weight_scale_2). bench/gluon_nvfp4_probe.py times its settings (SPLIT, ASYNC, STAGES).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                               warpgroup_mma_init,
                                                               warpgroup_mma_wait)

from ._wgmma_gluon import _drain, _issue_mma, _store_tile, _to_logical, pdl_enter, pdl_release
from .nvfp4_gemv import E2M1_BF16_PTX

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
                 L3: gl.constexpr, STAGES: gl.constexpr, ASYNC: gl.constexpr = False,
                 PDL: gl.constexpr = 0):
    """y [M, N] bf16 (SPLIT 1) or fp32 partials [SPLIT, M, N] (unscaled by weight_scale_2 ·
    2^16: the probe's host code applies it) of x · W^T, W in storage order (`to_storage`);
    program_id(2) takes STEPS steps of 256 columns. sw_n = K/2 and ss_n = K/16 (the row
    strides, as arguments so that they are known divisible by 16: 16-byte cp.async). PDL (the
    launch mode, plugins/_common.py): the first D steps' weight and scale copies are issued
    before the wait for the kernel before (both written once, at load), x's after it."""
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
    pdl_enter(PDL)                          # x after the wait
    for i in gl.static_range(D):
        j = gl.minimum(j_lo + i, j_last)
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
    pdl_release(PDL)
    _store_tile(_drain(acc, ASYNC), y_ptr, gl.load(gs_ptr) * 65536.0, M, N, n0, m0, s, SPLIT)
