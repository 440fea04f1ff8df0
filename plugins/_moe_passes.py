"""One pass of the MoE's grouped expert GEMM over an expert's weight tile for one row tile
(plugins/moe_experts.py): x·W^T with the tokens as the MMA's M (`_plain_pass`), or W·x^T with
the weights as its A operand (`_swapped_pass`, every chunk by default; K_BLOCKS > 1: blocks
of each K step on as many warps, `_k_blocks`), then the tile's epilogue (`_store_tile`, and
with split-K summed in the launch `_fixup_tile`).
"""

from __future__ import annotations

from ._common import jit, tl
from ._e4m3_decode import e4m3_to_bf16
from ._k_blocks import k_blocks
from ._split_k import sum_splits


@jit
def _plain_pass(a_ptr, wb, arow, valid, n, nmask, n_out, k_in, k_lo, k_hi, GATED: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                DOT_F32: tl.constexpr, DECODE: tl.constexpr):
    """g, up [ROWS, BLOCK_N] fp32 = x·W^T over K range [k_lo, k_hi): tokens as the MMA's M."""
    g = tl.zeros([ROWS, BLOCK_N], tl.float32)
    up = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kx = k0 + tl.arange(0, BLOCK_K)
        wm = nmask[:, None] & (kx < k_in)[None, :]
        wg = tl.load(wb + n[:, None].to(tl.int64) * k_in + kx[None, :], mask=wm, other=0.0)
        wg = tl.trans(wg.to(tl.float32) if DOT_F32 else e4m3_to_bf16(wg, DECODE))
        xt = tl.load(a_ptr + arow[:, None] + kx[None, :],
                     mask=valid[:, None] & (kx < k_in)[None, :], other=0.0)
        if DOT_F32:
            xt = xt.to(tl.float32)
        g = tl.dot(xt, wg, g)
        if GATED:
            wu = tl.load(wb + (n + n_out)[:, None].to(tl.int64) * k_in + kx[None, :],
                         mask=wm, other=0.0)
            wu = tl.trans(wu.to(tl.float32) if DOT_F32 else e4m3_to_bf16(wu, DECODE))
            up = tl.dot(xt, wu, up)
    return g, up


@jit
def _swapped_pass(a_ptr, wb, arow, valid, n_out, k_in, k_lo, k_hi, GATED: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                  DOT_F32: tl.constexpr, DECODE: tl.constexpr, KB: tl.constexpr):
    """g, up [ROWS, BLOCK_N] fp32 as `_plain_pass`, computed as W·x^T: the weight tile (gate
    rows over up rows when GATED) is the MMA's A operand, the ROWS tokens its N. KB > 1: each
    step as KB blocks on KB warps, an accumulator each, summed after the loop (`_k_blocks`)."""
    WR: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    rr = tl.arange(0, WR)
    col = tl.program_id(0) * BLOCK_N + rr % BLOCK_N
    wrow = (col + (rr >= BLOCK_N).to(tl.int32) * n_out).to(tl.int64)   # up rows follow gate's
    wmask_n = col < n_out
    acc = tl.zeros([WR, ROWS] if KB == 1 else [KB, WR, ROWS], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kx = k0 + tl.arange(0, BLOCK_K)
        kin = kx < k_in
        w = tl.load(wb + wrow[:, None] * k_in + kx[None, :], mask=wmask_n[:, None] & kin[None, :],
                    other=0.0)
        w = w.to(tl.float32) if DOT_F32 else e4m3_to_bf16(w, DECODE)
        xt = tl.load(a_ptr + arow[None, :] + kx[:, None], mask=kin[:, None] & valid[None, :],
                     other=0.0)
        if DOT_F32:
            xt = xt.to(tl.float32)
        if KB > 1:
            w, xt = k_blocks(w, xt, KB)
        acc = tl.dot(w, xt, acc)
    if KB > 1:
        acc = tl.sum(acc, 0)
    if GATED:
        g, up = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N, ROWS]), [1, 2, 0]))
    else:
        g = acc
        up = acc
    return tl.trans(g), tl.trans(up)


@jit
def _store_tile(o_ptr, tok, tslot, valid, g, up, scale, n, nmask, so_s, sp_s, sp_g,
                TOPK: tl.constexpr, GATED: tl.constexpr, SPLIT: tl.constexpr):
    """Write a row tile's outputs (rows tok, slots tslot, where valid): unscaled partials
    (SPLIT > 1), bf16 silu(s·g)·(s·up) (GATED) or fp32 s·g."""
    orow = (tok.to(tl.int64) * (TOPK + 1) + tslot) * so_s
    omask = valid[:, None] & nmask[None, :]
    if SPLIT > 1:  # unscaled partials of K range program_id(2)
        pb = o_ptr + tl.program_id(2).to(tl.int64) * sp_s + orow[:, None] + n[None, :]
        tl.store(pb, g, mask=omask)
        if GATED:
            tl.store(pb + sp_g, up, mask=omask)
    elif GATED:
        gs = g * scale
        h = gs / (1.0 + tl.exp(-gs)) * (up * scale)
        tl.store(o_ptr + orow[:, None] + n[None, :], h.to(tl.bfloat16), mask=omask)
    else:
        tl.store(o_ptr + orow[:, None] + n[None, :], g * scale, mask=omask)


@jit
def _fixup_tile(p_ptr, y_ptr, cnt_ptr, tile, tok, tslot, valid, scale, n, nmask, sp_r, sp_s,
                sp_g, sy_s, TOPK: tl.constexpr, GATED: tl.constexpr, SPLIT: tl.constexpr):
    """Split-K summed in the launch (moe_experts FIXUP): after this program's partial of row
    tile `tile` is stored, the tile's counter counts it (release: every thread's stores first,
    by the barrier); the program that counts last (acquire) sums the SPLIT partials in the
    order s = 0..SPLIT-1 (read past L1), writes the rows as moe_split_combine would (the same
    bits) into y (bf16 act or fp32 out, slot stride sy_s) and zeroes the counter for the next
    launch. sp_r: the partials' slot stride, sp_s their split stride, sp_g up's offset."""
    tl.debug_barrier()
    done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if done == SPLIT - 1:
        tl.debug_barrier()
        row = tok.to(tl.int64) * (TOPK + 1) + tslot
        omask = valid[:, None] & nmask[None, :]
        po = (row * sp_r)[:, None] + n[None, :]
        g = sum_splits(p_ptr, po, omask, sp_s, SPLIT, True)
        yo = y_ptr + (row * sy_s)[:, None] + n[None, :]
        if GATED:
            up = sum_splits(p_ptr + sp_g, po, omask, sp_s, SPLIT, True)
            gs = g * scale
            h = gs / (1.0 + tl.exp(-gs)) * (up * scale)
            tl.store(yo, h.to(tl.bfloat16), mask=omask)
        else:
            tl.store(yo, g * scale, mask=omask)
        tl.store(cnt_ptr + tile, 0)
