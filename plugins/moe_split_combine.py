"""The MoE experts' split-K combine: the S fp32 partials of a split launch summed in order,
then the expert scale (and silu(gate)·up for gate/up).

``plugins/moe_experts.py`` with SPLIT_K_GATED / SPLIT_K_DOWN > 1 (off by default) stores
unscaled partials [S, G, M, k+1, Np] (G = 2: gate, up; G = 1: down); this kernel writes the
same act / out rows as the single-pass kernel would, up to the partials' sum order
(plugins/_split_k.py: s = 0..S-1, a function of the layer shape only). Reference:
`moe_split_combine_ref`; tests/plugins/test_split_k.py checks the kernel against it and the
split MoE against moe_forward_ref, in the interpreter.
"""

from __future__ import annotations

import torch

from ._common import cdiv, jit, launch, tl
from ._common import early_launch, pdl_enter, pdl_release
from ._split_k import sum_splits

BLOCK_C = 256   # columns per program


@jit
def _moe_split_combine_kernel(p_ptr, ids_ptr, ws_ptr, shs_ptr, o_ptr, N, N_SH, sp_s, sp_g, sp_r,
                              so_s, TOPK: tl.constexpr, GATED: tl.constexpr, SPLIT: tl.constexpr,
                              BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    """Row r = m·(k+1) + slot: sum the SPLIT partials in order, scale by the row's expert scale;
    GATED: act = bf16(silu(s·gate)·(s·up)), else out = fp32 s·Σ. N_SH = 0: no shared expert."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    slot = r % (TOPK + 1)
    is_shared = slot == TOPK
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    nmask = n < tl.where(is_shared, N_SH, N)
    e = tl.load(ids_ptr + (r // (TOPK + 1)) * TOPK + tl.minimum(slot, TOPK - 1))
    scale = tl.where(is_shared, tl.load(shs_ptr), tl.load(ws_ptr + e))
    poff = r.to(tl.int64) * sp_r + n
    ooff = r.to(tl.int64) * so_s + n
    g = sum_splits(p_ptr, poff, nmask, sp_s, SPLIT)
    if GATED:
        up = sum_splits(p_ptr + sp_g, poff, nmask, sp_s, SPLIT)
        gs = g * scale
        h = gs / (1.0 + tl.exp(-gs)) * (up * scale)
        tl.store(o_ptr + ooff, h.to(tl.bfloat16), mask=nmask)
    else:
        tl.store(o_ptr + ooff, g * scale, mask=nmask)
    pdl_release(PDL)      # at the end: no earlier point in this kernel (PDL 2)


def launch_split_combine(part: torch.Tensor, ids: torch.Tensor, ws: torch.Tensor,
                         shs: torch.Tensor, out: torch.Tensor, n: int, n_sh: int, gated: bool,
                         split: int, interpret: bool) -> None:
    """Sum part fp32 [S, G, M, k+1, width] over S into out (bf16 act [M, k+1, >= n] when gated,
    else fp32 [M, k+1, >= n]) with each row's expert scale (ws fp32 [E] by ids int32 [M, k];
    shs fp32 [1] for slot k; n_sh = 0: no shared expert). Called by moe_experts only (its
    arguments are checked there)."""
    M, topk = ids.shape
    width = part.shape[-1]
    launch(_moe_split_combine_kernel, (M * (topk + 1), cdiv(width, BLOCK_C)), part, ids, ws,
           shs, out, n, n_sh, part.stride(0), part.stride(1), part.stride(3), out.stride(1),
           TOPK=topk, GATED=gated, SPLIT=split, BLOCK=BLOCK_C, num_warps=4, interpret=interpret,
           pdl_early=early_launch("moe", M))


def moe_split_combine_ref(part: torch.Tensor, ids: torch.Tensor, ws: torch.Tensor,
                          shs: torch.Tensor, gated: bool) -> torch.Tensor:
    """Plain-torch reference of :func:`launch_split_combine` over all part's columns: bf16
    [M, k+1, width] (gated) or fp32. Partials summed s = 0, 1, ... in fp32."""
    g = part[0, 0]
    for s in range(1, part.shape[0]):
        g = g + part[s, 0]
    scale = torch.cat([ws[ids.long()], shs.expand(ids.shape[0], 1)], 1)[..., None]
    if not gated:
        return g * scale
    up = part[0, 1]
    for s in range(1, part.shape[0]):
        up = up + part[s, 1]
    gs = g * scale
    return (gs / (1.0 + torch.exp(-gs)) * (up * scale)).to(torch.bfloat16)
