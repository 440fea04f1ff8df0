"""Gluon pieces shared by the wgmma GEMVs (plugins/nvfp4_wgmma.py; the FP8 probe
bench/gluon_gemv_probe.py): the row launches, the storage-order register layout of a weight
tile and its relabelling into wgmma's register A operand, the wgmma issue, drain and store.

The scheme (plugins/NOTES.md, "GEMVs on wgmma"): each BK-column block of a weight row is stored
permuted so that a thread's 16-byte shared-memory reads, decoded in registers and relabelled
by a reshape and permute (`_to_logical`, a trivial layout conversion: no data moves), are
wgmma's A fragment; x's tile in shared memory is wgmma's B. A column's sums do not depend on
wgmma's N (H200: row 0 alone and inside 16 / 64 / 144 rows bit-identical,
bench/results/h200-2026-12-02e/), so the rows may go in any power-of-two tiles.
Imported only where Gluon is (Triton >= 3.6): the plugins import it lazily at launch.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

SHARED_BUDGET = 200 * 1024   # bytes of the ring (the H200 gives a program up to 227 KiB)


@gluon.jit
def _griddepcontrol(WAIT: gl.constexpr):
    """PTX griddepcontrol.wait (WAIT) or .launch_dependents, as triton.language.extra.cuda's
    gdc_wait / gdc_launch_dependents (which Gluon's semantics do not take)."""
    if WAIT:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def pdl_enter(PDL: gl.constexpr):
    """plugins/_common.py's `pdl_enter` for Gluon kernels (the same modes 0-3, given by
    `_common.launch`): before a kernel's first read of memory that the kernel before it may
    write. The wgmma GEMVs issue their weights' first copies before it (weights are written
    once, at load)."""
    if PDL == 1:
        _griddepcontrol(False)
    if PDL != 0:
        _griddepcontrol(True)
    if PDL == 3:
        _griddepcontrol(False)


@gluon.jit
def pdl_release(PDL: gl.constexpr):
    """plugins/_common.py's `pdl_release` for Gluon kernels: mode 2 lets the next kernel
    launch (placed after the main loop)."""
    if PDL == 2:
        _griddepcontrol(False)


def tile_rows(m: int) -> int:
    """MT for m rows: the power of two >= m in 8-128 (wgmma's N; tiles only group rows)."""
    return max(8, min(128, 1 << (max(m, 1) - 1).bit_length()))


ONE_LAUNCH_ROWS = 64
"""Rows past the full 128-row tiles that take one launch of tile_rows whatever their count
(9 -> 16, 17 -> 32, 33 -> 64). On the H100 with PDL, QKV / o_proj and the head on wgmma, one
stream verifying 9 tokens took 7.426 ms a step at 64 against 7.981 at 8 (9 -> 8 + 8: two
launches of each GEMV), and 7.499 against mma.sync's 7.594 in one call; 1-8 and 16 x 9 rows
unchanged (bench/results/h100-2026-12-07b/wq/, ms/). gpu_check fp8wg / nvfp4wg (batch
invariance at 1-144 rows) and gpu_runtime (every speculative mode == off) passed at 64."""


def row_segments(m: int) -> list[tuple[int, int, int]]:
    """(first row, MT, tiles) launches covering m rows: full 128-row tiles, then the rest in
    one launch of tile_rows up to ONE_LAUNCH_ROWS rows, past it the largest power of two the
    rest fills and tile_rows of what is left (80 -> 64 + 16, 100 -> 64 + 64, 144 -> 128 + 16;
    at ONE_LAUNCH_ROWS 8 also 9 -> 8 + 8): x rows past m cost wgmma work, so no tile is mostly
    empty."""
    segs, m0 = [], 0
    if m > 128:
        segs.append((0, 128, m // 128))
        m0 = 128 * (m // 128)
    rest = m - m0
    if rest > ONE_LAUNCH_ROWS and rest & (rest - 1):
        low = 1 << (rest.bit_length() - 1)
        segs.append((m0, low, 1))
        m0, rest = m0 + low, rest - low
    if rest:
        segs.append((m0, tile_rows(rest), 1))
    return segs


def storage_layout(bk: int):
    """The register layout of a [64, BK] byte tile in storage order (K contiguous) whose
    relabelling by `_to_logical` is wgmma's register A layout (bf16, k width 2; Triton 3.6's
    to_linear_layout of it: registers k+1, row+8, k+8, k+16, ...; lanes k+2, k+4, row+1, +2,
    +4; warps row+16, +32): each thread holds BK/4 contiguous bytes of each of its two rows
    (16-byte loads), where the A layout's K pairs are 2 bytes apart by 8."""
    nb = bk.bit_length() - 1
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(nb - 2)] + [[8, 0]],
        lane_bases=[[0, 1 << (nb - 2)], [0, 1 << (nb - 1)], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, bk])


@gluon.jit
def _to_logical(t, BK: gl.constexpr):
    """[R, BK] in storage order -> [R, BK] in the order wgmma sums: storage bit i of a column
    holds K bit (k1, k8, k16, ..., k_BK/2, k2, k4)[i] (`storage_layout`); both W and x go
    through it, so the product pairs the same elements and only the sum order changes."""
    R: gl.constexpr = t.shape[0]
    if BK == 128:
        t = gl.reshape(t, [R, 2, 2, 2, 2, 2, 2, 2])
        t = gl.permute(t, (0, 3, 4, 5, 6, 1, 2, 7))
    else:
        gl.static_assert(BK == 256, "BK: 128 or 256")
        t = gl.reshape(t, [R, 2, 2, 2, 2, 2, 2, 2, 2])
        t = gl.permute(t, (0, 3, 4, 5, 6, 7, 1, 2, 8))
    return gl.reshape(t, [R, BK])


@gluon.jit
def _issue_mma(w, xs, acc, ASYNC: gl.constexpr):
    """acc += w · xs^T: w bf16 [64, BK] relabelled (`_to_logical`; a trivial conversion to
    wgmma's register A layout), xs x's [MT, BK] tile in shared memory (B, transposed view)."""
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    a = gl.convert_layout(w, a_l, assert_trivial=True)
    return warpgroup_mma(a, xs.permute((1, 0)), acc, is_async=ASYNC)


@gluon.jit
def _drain(acc, ASYNC: gl.constexpr):
    """The accumulator once the last wgmma (ASYNC) and every cp.async have completed."""
    if ASYNC:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    async_copy.wait_group(0)
    return acc


@gluon.jit
def _store_tile(acc, y_ptr, scale, M, N, n0, m0, s, SPLIT: gl.constexpr):
    """acc [64, MT] fp32 (y^T of weight rows n0.., x rows m0..) -> y [M, N] bf16 times scale
    (SPLIT 1), else unscaled into the partials [SPLIT, M, N] at K range s."""
    acc_l: gl.constexpr = acc.type.layout
    orr = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
    om = m0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc_l))
    omask = (om < M)[None, :] & (orr < N)[:, None]
    if SPLIT == 1:
        gl.store(y_ptr + om.to(gl.int64)[None, :] * N + orr[:, None],
                 (acc * scale).to(gl.bfloat16), mask=omask)
    else:
        p_ptr = y_ptr + s.to(gl.int64) * M * N
        gl.store(p_ptr + om.to(gl.int64)[None, :] * N + orr[:, None], acc, mask=omask)
