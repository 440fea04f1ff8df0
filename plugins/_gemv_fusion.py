"""The fused prologue and epilogue of the GEMV kernels (fp8_gemv): the drafter's glue around a
linear, done in the linear's own program, each step the bf16 torch op it replaces (fp32 inside,
rounded to bf16 where torch rounds):
- ``norm``: x is first RMS-normalised per row with a bf16 gain [K]
  (``bf16((x·rsqrt(mean(x²) + eps))·gain)``, add_rms_norm's maths; the row's Σx² is walked in
  BLOCK_K chunks, so its order is a function of K only);
- ``residual``: y = bf16(y + r) (torch's bf16 add);
- ``act="silu"``: y = bf16(y / (1 + exp(-y))) after the residual (F.silu on bf16);
- ``act="swiglu"``: the weight's rows interleave gate and up (row 2i gate_i, 2i+1 up_i;
  ``interleave_rows``) and y[:, i] = bf16(bf16(silu(g_i)) · u_i), [M, N/2].

The pieces:
- `_row_rstd` / `_col_rstd`: per row (and per segment of K) rsqrt(mean(x²) + eps), the RMSNorm
  applied to x as it is loaded (add_rms_norm's maths: fp32 Σx² in a fixed order, times 1/len);
- `_store_out`: bf16 rounding of the product, then SwiGLU over interleaved gate/up columns, or
  a residual add and silu, each rounded to bf16 where the torch op it replaces rounds;
- `dot_swapped`: one K step of the small-batch form W·x^T (fp8_gemv.SWAP_ROWS);
- `Fusion` (one call's fused options) and `check_fused` (their argument checks);
- `interleave_rows`: the swiglu weight layout (fp8_gemv re-exports it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import check_tensor, jit, tl
from ._k_blocks import k_blocks


@jit
def x_rows(ids_ptr, m, M, s_ids, X_ROWS: tl.constexpr):
    """int64 [R]: the x row read for output rows m [R]: ids[m] (a gather, e.g. embedding rows
    by token id; stride s_ids) with X_ROWS, else m itself."""
    if X_ROWS:
        return tl.load(ids_ptr + m.to(tl.int64) * s_ids, mask=m < M, other=0).to(tl.int64)
    return m.to(tl.int64)


@jit
def _row_rstd(x_ptr, xr, valid, K, sx_m, eps, BLOCK_K: tl.constexpr, NSEG: tl.constexpr,
              NSEG_P: tl.constexpr):
    """rsqrt(mean(x[xr, seg]²) + eps) fp32 [R, NSEG_P] for bf16 rows xr [R] (int64; valid:
    bool [R]) and the NSEG segments of K / NSEG columns (Σ in BLOCK_K chunks, in order; the
    mean as torch's: the fp32 sum times the fp32 factor 1 / (K / NSEG))."""
    seg_len = K // NSEG
    seg = tl.arange(0, NSEG_P)
    ss = tl.zeros([xr.shape[0], NSEG_P], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kx = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + xr[:, None] * sx_m + kx[None, :],
                     mask=valid[:, None] & (kx < K)[None, :], other=0.0).to(tl.float32)
        sq = xt * xt
        if NSEG == 1:
            ss += tl.sum(sq, 1)[:, None]
        else:
            for s in tl.static_range(NSEG):
                part = tl.sum(tl.where((kx // seg_len == s)[None, :], sq, 0.0), 1)
                ss += tl.where((seg == s)[None, :], part[:, None], 0.0)
    return tl.math.rsqrt(ss * (1.0 / seg_len) + eps)


@jit
def tile_rstds(x_ptr, ids_ptr, s_ids, m0, M, K, sx_m, eps, ROWS: tl.constexpr,
               MT: tl.constexpr, BLOCK_K: tl.constexpr, NSEG: tl.constexpr,
               NSEG_P: tl.constexpr, X_ROWS: tl.constexpr):
    """`_row_rstd` of the MT row tiles m0 + t * ROWS + 0..ROWS-1 (x rows by `x_rows`): four
    fp32 [ROWS, NSEG_P] (tiles past MT zero); NSEG 0: no norm, all zero."""
    rows = tl.arange(0, ROWS)
    rs0 = tl.zeros([ROWS, NSEG_P], tl.float32)
    rs1 = rs0
    rs2 = rs0
    rs3 = rs0
    if NSEG > 0:
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            rs = _row_rstd(x_ptr, x_rows(ids_ptr, m, M, s_ids, X_ROWS), m < M, K, sx_m, eps,
                           BLOCK_K, NSEG, NSEG_P)
            if t == 0:
                rs0 = rs
            elif t == 1:
                rs1 = rs
            elif t == 2:
                rs2 = rs
            else:
                rs3 = rs
    return rs0, rs1, rs2, rs3


@jit
def _col_rstd(rs, kx, K, NSEG: tl.constexpr, NSEG_P: tl.constexpr):
    """The rstd of each (row, column kx): rs [R, NSEG_P] (`_row_rstd`) -> fp32 [R, BLOCK_K]
    (column kx lies in segment kx // (K / NSEG))."""
    if NSEG == 1:
        return tl.sum(rs, 1)[:, None] + tl.zeros([1, kx.shape[0]], tl.float32)
    seg = tl.arange(0, NSEG_P)
    out = tl.zeros([rs.shape[0], kx.shape[0]], tl.float32)
    for s in tl.static_range(NSEG):
        col = tl.sum(tl.where((seg == s)[None, :], rs, 0.0), 1)
        out += tl.where((kx // (K // NSEG) == s)[None, :], col[:, None], 0.0)
    return out


@jit
def _store_out(y_ptr, r_ptr, out, m, c0, M, N, sr_m, C: tl.constexpr, ACT: tl.constexpr,
               RES: tl.constexpr):
    """Store fp32 out [R, C] (scaled; weight rows c0 .. c0 + C - 1 of N, rows m [R]) as bf16:
    ACT 2 (swiglu) pairs columns (gate, up) into output columns c0/2 .. of N/2; RES adds bf16
    r [M, ·] (row stride sr_m); ACT 1 applies silu after it."""
    yb = out.to(tl.bfloat16)
    if ACT == 2:
        g, u = tl.split(tl.reshape(yb, (out.shape[0], C // 2, 2)))
        gf = g.to(tl.float32)
        gs = (gf / (1.0 + tl.exp(-gf))).to(tl.bfloat16)
        yb = (gs.to(tl.float32) * u.to(tl.float32)).to(tl.bfloat16)
        cols = c0 // 2 + tl.arange(0, C // 2)
        n_out = N // 2
    else:
        cols = c0 + tl.arange(0, C)
        n_out = N
    mask = (m < M)[:, None] & (cols < n_out)[None, :]
    if RES:
        r = tl.load(r_ptr + m[:, None].to(tl.int64) * sr_m + cols[None, :], mask=mask, other=0.0)
        yb = (yb.to(tl.float32) + r.to(tl.float32)).to(tl.bfloat16)
    if ACT == 1:
        yf = yb.to(tl.float32)
        yb = (yf / (1.0 + tl.exp(-yf))).to(tl.bfloat16)
    tl.store(y_ptr + m[:, None].to(tl.int64) * n_out + cols[None, :], yb, mask=mask)


@jit
def dot_swapped(x_ptr, ids_ptr, wb, kx, kmask, m, M, s_ids, sx_m, acc, X_ROWS: tl.constexpr,
                DOT_F32: tl.constexpr, KB: tl.constexpr = 1):
    """acc [BLOCK_N, ROWS] += W_tile · x^T: the decoded weights wb [BLOCK_N, BLOCK_K] as the MMA's
    A operand, the rows m [ROWS] of x (columns kx) as its N. KB > 1: acc [KB, BLOCK_N, ROWS],
    one batch per block of the step (`_k_blocks`)."""
    xr = x_rows(ids_ptr, m, M, s_ids, X_ROWS)
    xt = tl.load(x_ptr + xr[None, :] * sx_m + kx[:, None], mask=kmask[:, None] & (m < M)[None, :],
                 other=0.0)
    if KB > 1:
        wb, xt = k_blocks(wb, xt, KB)
    if DOT_F32:
        return tl.dot(wb.to(tl.float32), xt.to(tl.float32), acc)
    return tl.dot(wb, xt, acc)


ACTS = ("none", "silu", "swiglu")   # the epilogue's activation, ACT = ACTS.index(act)
MAX_NORM_SEGMENTS = 8                # norm_segments: unrolled per K step in the kernel


class Fusion(NamedTuple):
    """The fused glue of one call (`fp8_gemv`'s keyword arguments; all off by default)."""
    norm: torch.Tensor | None = None       # bf16 [K] gain of the RMSNorm prologue
    eps: float = 1e-6                      # its epsilon
    act: str = "none"                      # one of ACTS
    residual: torch.Tensor | None = None   # bf16 [M, N], added in the epilogue
    norm_segments: int = 1                 # the norm per K / norm_segments-column segment
    x_rows: torch.Tensor | None = None     # int64 [M]: output row m reads x row x_rows[m]

    @property
    def plain(self) -> bool:
        return self.norm is None and self.act == "none" and self.residual is None \
            and self.x_rows is None


NO_FUSION = Fusion()


def check_fused(x, n, f: Fusion) -> None:
    """The fused options' arguments (ValueError naming the bad one)."""
    K = x.shape[1]
    M = x.shape[0] if f.x_rows is None else f.x_rows.shape[0]
    if f.act not in ACTS:
        raise ValueError(f"act: must be one of {list(ACTS)}, got {f.act!r}")
    if f.x_rows is not None:
        check_tensor("x_rows", f.x_rows, torch.int64, (None,), x.device, contiguous=False)
    if f.norm is not None:
        check_tensor("norm", f.norm, torch.bfloat16, (K,), x.device)
    ns = f.norm_segments
    if not isinstance(ns, int) or not 1 <= ns <= MAX_NORM_SEGMENTS or K % ns:
        raise ValueError(f"norm_segments: must divide K = {K}, 1..{MAX_NORM_SEGMENTS}, got "
                         f"{ns!r}")
    if f.act == "swiglu" and n % 2:
        raise ValueError(f"act: swiglu needs an even number of weight rows, got {n}")
    if f.residual is not None:
        if f.act == "swiglu":
            raise ValueError("residual: not supported with act='swiglu'")
        check_tensor("residual", f.residual, torch.bfloat16, (M, n), x.device, contiguous=False)
        if f.residual.stride(1) != 1:
            raise ValueError(f"residual: last dim must have stride 1, strides "
                             f"{f.residual.stride()}")


def interleave_rows(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """[I, ...] gate and up rows (weights, or their per-row scales) -> [2I, ...] with row 2i
    gate_i and row 2i + 1 up_i: the weight layout of ``act="swiglu"`` (exact: rows move)."""
    if gate.shape != up.shape:
        raise ValueError(f"gate/up: shapes {tuple(gate.shape)} and {tuple(up.shape)} differ")
    return torch.stack([gate, up], 1).reshape(2 * gate.shape[0], *gate.shape[1:]).contiguous()
