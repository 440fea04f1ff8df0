"""The Gluon kernel of plugins/fp8_wgmma.py (imported there at launch only: Gluon needs Triton
>= 3.6, and the plugins import without Triton).

The tile computes y^T [64, MT] = W [64, K] · x^T for 64 weight rows and MT (8-128) rows of x with
4 warps (one warpgroup). W's e4m3 bytes are stored with each block of BK columns permuted
(fp8_wgmma.to_wgmma_storage); W's and x's tiles come in through a cp.async ring; each thread
reads 16-byte pieces of W's tile from shared memory (`storage_layout`), decodes them by bit
placement (fp8_gemv's DECODE 3) and `_to_logical` relabels them as wgmma's register A operand
(plugins/_wgmma_gluon.py); x's tile is wgmma's B. SPLIT > 1 K ranges write fp32 partials
[S, M, N], summed in the order s = 0..S-1 either by fp8_gemv's reduce launch or, FIXUP, by
each tile's last program (a counter per tile): the same bits
(bench/results/h200-2026-12-02e/gw3/). bench/gluon_gemv_probe.py times its settings.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                               warpgroup_mma_init,
                                                               warpgroup_mma_wait)

from ._e4m3_decode import E4M3_BF16_PTX
from ._wgmma_gluon import _drain, _issue_mma, _store_tile, _to_logical, pdl_enter, pdl_release

E4M3_BF16_ASM = gl.constexpr(E4M3_BF16_PTX)


@gluon.jit
def _e4m3_to_bf16(w):
    """float8e4nv -> bf16 by bit placement (plugins/_e4m3_decode.py, DECODE 3): exact."""
    return gl.inline_asm_elementwise(E4M3_BF16_ASM, "=r,=r,r", [w.to(gl.uint8, bitcast=True)],
                                     dtype=gl.bfloat16, is_pure=True, pack=4)


@gluon.jit
def _wgmma_gemv(w_ptr, x_ptr, s_ptr, y_ptr, p_ptr, cnt_ptr, M, N, K, K_PART, m_base,
                MT: gl.constexpr, BK: gl.constexpr, SPLIT: gl.constexpr,
                WL: gl.constexpr, STAGES: gl.constexpr, ASYNC: gl.constexpr = False,
                FIXUP: gl.constexpr = False, PDL: gl.constexpr = 0):
    """y [M, N] bf16 = scale · x [M, K] · W[N, K]^T (SPLIT 1), else fp32 partials [SPLIT, M, N]
    of the K ranges [s·K_PART, (s+1)·K_PART) into p_ptr; FIXUP: the tile's last program to
    finish (a counter per tile in cnt_ptr) sums them in the order s = 0..SPLIT-1 and writes y
    (no reduce launch). Rows m_base + program_id(1)·MT..; x rows past M are zero-filled, not
    read. w_ptr holds W
    with each BK block of a row in storage order (`to_storage`). W's and x's tiles come in
    through a ring of STAGES shared buffers by cp.async, D = STAGES - 1 steps ahead; W's is
    read back 16 bytes at a time in WL, decoded and relabelled into wgmma's A registers, x's
    is wgmma's B. ASYNC: each step's wgmma runs on while the next step's copies are issued and
    its W tile is read from shared memory, and is waited for before the decode (which may
    reuse its A registers: ptxas does not keep them alive, AOT sm_90); the copies run D =
    STAGES - 2 ahead so that a slot is refilled only after its wgmma ended. PDL (the launch
    mode, plugins/_common.py): the first D steps' W copies are issued before the wait for the
    kernel before (W is written once, at load), x's after it; the first cp.async group then
    holds those W copies and x's first step, so the loop's waits are unchanged."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, MT, 16])
    cp_l: gl.constexpr = gl.BlockedLayout([1, 16], [512 // BK, BK // 16], [4, 1], [1, 0])
    xcp_l: gl.constexpr = gl.BlockedLayout([1, 8], [256 // BK, BK // 8], [4, 1], [1, 0])
    ws_l: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=BK // 16,
                                                 order=[1, 0])
    xs_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MT, BK], gl.bfloat16)
    n0 = gl.program_id(0) * 64
    m0 = m_base + gl.program_id(1) * MT
    s = gl.program_id(2)
    wr = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, cp_l))
    wk = gl.arange(0, BK, layout=gl.SliceLayout(0, cp_l))
    xm = m0 + gl.arange(0, MT, layout=gl.SliceLayout(1, xcp_l))
    xk = gl.arange(0, BK, layout=gl.SliceLayout(0, xcp_l))
    w_tile = w_ptr + wr.to(gl.int64)[:, None] * K + wk[None, :]
    x_tile = x_ptr + gl.minimum(xm, M - 1).to(gl.int64)[:, None] * K + xk[None, :]
    x_in = (xm < M)[:, None] & (xk < BK)[None, :]     # rows past M: zero fill, no read
    w_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, BK], ws_l)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, MT, BK], xs_l)
    acc = gl.zeros([64, MT], gl.float32, layout=acc_l)
    k_lo = s * K_PART
    k_last = k_lo + K_PART - BK
    D: gl.constexpr = STAGES - 2 if ASYNC else STAGES - 1    # steps the copies run ahead
    for i in gl.static_range(D):            # past the range: the last step again (unused)
        async_copy.async_copy_global_to_shared(w_ring.index(i),
                                               w_tile + gl.minimum(k_lo + i * BK, k_last))
    pdl_enter(PDL)                          # x (and the FIXUP counters) after the wait
    for i in gl.static_range(D):
        kk = gl.minimum(k_lo + i * BK, k_last)
        async_copy.async_copy_global_to_shared(x_ring.index(i), x_tile + kk, mask=x_in)
        async_copy.commit_group()
    slot = 0
    if ASYNC:
        acc = warpgroup_mma_init(acc)       # the loop carries the in-flight accumulator
    for k0 in range(k_lo, k_lo + K_PART, BK):
        async_copy.wait_group(D - 1)        # this thread's copies of this step have landed,
        fence_async_shared()                # are visible to wgmma's (async proxy) reads,
        gl.thread_barrier()                 # for every thread; the last step's reads are done
        nxt = (slot + D) % STAGES
        kk = gl.minimum(k0 + D * BK, k_last)
        async_copy.async_copy_global_to_shared(w_ring.index(nxt), w_tile + kk)
        async_copy.async_copy_global_to_shared(x_ring.index(nxt), x_tile + kk, mask=x_in)
        async_copy.commit_group()
        raw = w_ring.index(slot).load(WL)
        if ASYNC:   # the last step's wgmma reads its A registers until here: decode after it
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc = _issue_mma(_to_logical(_e4m3_to_bf16(raw), BK), x_ring.index(slot), acc, ASYNC)
        slot = (slot + 1) % STAGES
    pdl_release(PDL)
    acc = _drain(acc, ASYNC)
    if SPLIT == 1:
        _store_tile(acc, y_ptr, gl.load(s_ptr), M, N, n0, m0, s, SPLIT)
    else:
        _store_tile(acc, p_ptr, gl.load(s_ptr), M, N, n0, m0, s, SPLIT)
        if FIXUP:
            _fixup(acc, p_ptr, y_ptr, cnt_ptr, gl.load(s_ptr), M, N, n0, m0, SPLIT)


@gluon.jit
def _fixup(acc, p_ptr, y_ptr, cnt_ptr, scale, M, N, n0, m0, SPLIT: gl.constexpr):
    """Serial split-K in the launch: after this program's partial is stored, the tile's
    counter counts it (release: every thread's stores first, by the barrier); the program that
    counts last (acquire) sums the SPLIT partials in the order s = 0..SPLIT-1 (read past L1),
    writes y [M, N] bf16 times scale and zeroes the counter for the next launch."""
    gl.thread_barrier()
    tile = (n0 // 64) * gl.cdiv(M, 8) + m0 // 8
    done = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if done == SPLIT - 1:
        acc_l: gl.constexpr = acc.type.layout
        orr = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
        om = m0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc_l))
        omask = (om < M)[None, :] & (orr < N)[:, None]
        at = om.to(gl.int64)[None, :] * N + orr[:, None]
        tot = gl.load(p_ptr + at, mask=omask, other=0.0, cache_modifier=".cg")
        for i in gl.static_range(1, SPLIT):
            tot += gl.load(p_ptr + i * M * N + at, mask=omask, other=0.0, cache_modifier=".cg")
        gl.store(y_ptr + at, (tot * scale).to(gl.bfloat16), mask=omask)
        gl.store(cnt_ptr + tile, 0)
