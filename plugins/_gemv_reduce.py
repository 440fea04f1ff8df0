"""The second launch of a split-K fp8_gemv: the S fp32 partials summed in the order s = 0..S-1
(`_split_k.sum_splits`), times the per-tensor or per-channel scale (block scales are applied
in the main kernel), rounded to bf16, then the fused epilogue (`_gemv_fusion._store_out`:
residual add, silu or SwiGLU). plugins/fp8_gemv.py's docstring gives the contract."""

from __future__ import annotations

from ._common import cdiv, early_launch, jit, launch, pdl_enter, pdl_release, tl
from ._gemv_fusion import ACTS, Fusion, _store_out
from ._split_k import sum_splits

BLOCK_R = 1024      # columns per program of the split-K reduce


@jit
def scaled_sum(p_ptr, s_ptr, offs, n, mask, stride_s, SPLIT: tl.constexpr, MODE: tl.constexpr):
    """fp32 scale · Σ_s p[s·stride_s + offs] (s = 0..SPLIT-1 in order) for columns n: MODE 0 the
    per-tensor scale, 1 per channel, 2 block scales (already applied in the partials: 1)."""
    out = sum_splits(p_ptr, offs, mask, stride_s, SPLIT)
    if MODE == 0:
        out = out * tl.load(s_ptr)
    elif MODE == 1:
        out = out * tl.load(s_ptr + n, mask=mask, other=0.0)
    return out


@jit
def _fp8_gemv_reduce_kernel(p_ptr, s_ptr, y_ptr, r_ptr, M, N, sr_m, MODE: tl.constexpr,
                            SPLIT: tl.constexpr, BLOCK: tl.constexpr, ACT: tl.constexpr = 0,
                            RES: tl.constexpr = False, PDL: tl.constexpr = 0):
    """y[m, n] = bf16(scale · Σ_s p[s, m, n]), s = 0..SPLIT-1 in order, then the epilogue
    (`_store_out`); grid (M, N / BLOCK)."""
    pdl_enter(PDL)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    nmask = n < N
    offs = tl.program_id(0).to(tl.int64) * N + n
    out = scaled_sum(p_ptr, s_ptr, offs, n, nmask, M * N, SPLIT, MODE)
    m = tl.program_id(0) + tl.arange(0, 1)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    _store_out(y_ptr, r_ptr, out[None, :], m, tl.program_id(1) * BLOCK, M, N, sr_m,
               BLOCK, ACT, RES)


def launch_reduce(part, weight_scale, y, f: Fusion, mode: int, interpret: bool) -> None:
    """y bf16 [M, N'] from the partials part fp32 [S, M, N] (mode: fp8_gemv's scale layout,
    0 per tensor, 1 per channel, 2 block scales already applied; f: the fused options)."""
    split, M, N = part.shape
    r = y if f.residual is None else f.residual
    launch(_fp8_gemv_reduce_kernel, (M, cdiv(N, BLOCK_R)), part, weight_scale, y, r, M, N,
           0 if f.residual is None else f.residual.stride(0), MODE=mode, SPLIT=split,
           BLOCK=BLOCK_R, ACT=ACTS.index(f.act), RES=f.residual is not None, num_warps=4,
           interpret=interpret, pdl_early=early_launch("gemv", M),
           **({} if f.plain else dict(enable_fp_fusion=False)))
