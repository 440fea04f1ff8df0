"""The torch glue of `DrafterPlugin` (`plugin_drafter.py`) written for few kernel launches: RoPE
as rotation tables (made once for every position, `rope_table`; a step gathers its rows), a
round's host-computed indices (`RoundIndex`), the ring's visibility mask and the ring
attention. Each function gives
the bits of the plain formulation it replaces (named in its docstring) on every device:
products and sums are the same IEEE operations on the same operands, only grouped into
fewer elementwise ops, and copies replace `.float()` / `.to()` / `reshape` where those
only converted exactly or moved values. `bench/count_drafter_ops.py` counts the launches.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

ROPE_CHUNK = 64      # positions per `rope_rotation` call while `rope_table` builds the table


# ============================================================================ RoPE
def rope_rotation(positions: torch.Tensor, inv_freq_half: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of `positions` (int64 [T]) as fp32 [T, 2, 2, D/2] tables m: for the
    halves (x1, x2) of a head, out_a = x1 * m[a, 0] + x2 * m[a, 1], i.e.
    m = [[cos, -sin], [sin, cos]] per frequency. inv_freq_half: float64 [D/2] (the first half
    of `ops.rope_inv_freq`, which repeats it). cos and sin are the float64 values of
    `ops.rope_tables` rounded to fp32 (the same angle products, the same functions over
    contiguous rows of D/2); four launches (angles, cos, sin, one negation)."""
    t, half = positions.shape[0], inv_freq_half.shape[0]
    angles = positions[:, None] * inv_freq_half                       # float64 [T, D/2]
    m = torch.empty(t, 4, half, dtype=torch.float32, device=angles.device)
    both = angles[:, None].expand(t, 2, half)
    torch.cos(both, out=m[:, 0::3])                                  # (0, 0), (1, 1)
    torch.sin(both, out=m[:, 1:3])                                   # (0, 1), (1, 0)
    m[:, 1].neg_()
    return m.view(t, 2, 2, half)


def rope_table(positions: int, inv_freq_half: torch.Tensor, chunk: int = ROPE_CHUNK
               ) -> torch.Tensor:
    """`rope_rotation` of positions 0 .. positions - 1 as one table, fp32 [P, 2, 2, D/2] on
    inv_freq_half's device (float64 [D/2], as `rope_rotation`); 8 * D bytes per position
    (4 tables of D/2 fp32: 1 KiB at D = 128). Row t holds the bits a step's
    `rope_rotation` gives for position t: the same ops, called on `chunk` positions at a time
    (each row's elementwise ops run over its own D/2 values, as in a step of few rows; small
    calls also keep CPU threads from splitting a row). Made once (`DrafterPlugin.rope_table`):
    a step then gathers its rows with one index_select instead of four launches."""
    pos = torch.arange(positions, dtype=torch.long, device=inv_freq_half.device)
    return torch.cat([rope_rotation(pos[a:a + chunk], inv_freq_half)
                      for a in range(0, positions, chunk)])


class RoundIndex(NamedTuple):
    """What the passes of a round index, made on the host (`DrafterRunner`) for S streams with
    anchors p, depth passes of B block rows, ring R rows (device tensors):
    anchors int64 [depth, S]: pass r's anchor p + r*B; pos int64 [depth, S, B]: block row j's
    position p + r*B + j; rows int64 [depth, S, B]: its ring row pos % R; rope fp32
    [depth, S*B, 2, 2, D/2]: its rotation table (rows of `rope_table`). Every pass's slice
    [r] is contiguous (the plugins' layouts). Padding streams: anchor 0, the trash slot."""
    anchors: torch.Tensor
    pos: torch.Tensor
    rows: torch.Tensor
    rope: torch.Tensor


def apply_rope_rotation(x: torch.Tensor, m: torch.Tensor, out: torch.Tensor | None = None
                        ) -> torch.Tensor:
    """`ops.apply_rope(x, cos, sin)` in two launches, bit for bit: x bf16 [T, H, D] (a view
    with the last dim contiguous), m `rope_rotation`'s [T, 2, 2, D/2] -> bf16 [T, H, D]
    (into `out` when given, a [T, H, D] view with contiguous last dim).

    apply_rope's first half is x1*cos + (-x2)*sin, its second x2*cos + x1*sin (fp32, then
    bf16). Here one product p[a, b] = x_b * m[a, b] (x converted exactly to fp32) and one sum
    p[a, 0] + p[a, 1] rounded to bf16 as it is stored: (-x2)*sin == x2*(-sin) exactly (signs
    multiply), and x2*cos + x1*sin == x1*sin + x2*cos (IEEE addition commutes)."""
    t, h, d = x.shape
    half = d // 2
    p = x.view(t, h, 1, 2, half) * m.view(t, 1, 2, 2, half)          # fp32 [T, H, 2, 2, D/2]
    if out is None:
        out = torch.empty(t, h, d, dtype=x.dtype, device=x.device)
    torch.add(p[:, :, :, 0], p[:, :, :, 1], out=out.view(t, h, 2, half))
    return out


# ============================================================================ attention
class RoundMask(NamedTuple):
    """What a pass's attention needs to tell visible ring rows: visible bool [S, B, L]
    (`visible_rows`; None for attn "kernel", which tests positions in the kernel), the ring's
    positions int64 [slots + 1, R], anchors int64 [S] and block positions int64 [S, B]."""
    visible: torch.Tensor | None
    ring_pos: torch.Tensor
    anchors: torch.Tensor
    pos: torch.Tensor


def visible_rows(ring_pos: torch.Tensor, slots: torch.Tensor, anchors: torch.Tensor,
                 pos: torch.Tensor, context_window: int, length: int) -> torch.Tensor:
    """bool [S, B, L]: ring row l of stream s is visible to block row j iff its position lies
    in [max(p - context_window, 0), p + j] (-1 = empty never is). The same booleans as
    (rp >= 0) & (rp >= p - cw) & (rp <= p + j), one comparison fewer."""
    rp = ring_pos[:, :length].index_select(0, slots)[:, None, :]                # [S, 1, L]
    lo = (anchors - context_window).clamp_(min=0)[:, None, None]
    return (rp >= lo) & (rp <= pos[:, :, None])


def ring_attention(q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor,
                   visible: torch.Tensor, length: int, impl: str) -> torch.Tensor:
    """q bf16 [S, B, Hq, D] over the first `length` ring rows of each stream's slot -> bf16
    [S*B, Hq*D]. kv: one layer's ring, bf16 [2, slots + 1, R, Hkv, D] (keys with RoPE, then
    values). GQA: query head n reads KV head n // (Hq / Hkv); softmax scale 1/sqrt(D).

    impl "dense": fp32 matmul + softmax over the rows, masked to -inf where not visible;
    "sdpa": `F.scaled_dot_product_attention` on bf16 with the boolean mask. Operands have the
    shapes and strides of the per-tensor formulation (keys and values gathered and converted
    apart, q permuted by `reshape`, the output by `reshape` + `.to`), so the products are the
    same calls on the same layouts; K and V are gathered (and converted) in one op each."""
    s, b, hq, d = q.shape
    hkv = kv.shape[3]
    g = hq // hkv
    kv = kv[:, :, :length].index_select(1, slots)                     # [2, S, L, Hkv, D]
    qv = q.reshape(s, b, hkv, g, d).permute(0, 2, 3, 1, 4)            # [S, Hkv, g, B, D]
    if impl == "sdpa":
        k, v = kv[0].transpose(1, 2), kv[1].transpose(1, 2)           # [S, Hkv, L, D]
        vis = visible[:, None, None].expand(s, 1, g, b, length).reshape(s, 1, g * b, length)
        out = F.scaled_dot_product_attention(qv.reshape(s, hkv, g * b, d), k, v,
                                             attn_mask=vis)
    else:
        kvf = kv.float()
        k, v = kvf[0].transpose(1, 2), kvf[1].transpose(1, 2)
        qg = torch.empty(s, hkv, g * b, d, dtype=torch.float32, device=q.device)
        qg.view(s, hkv, g, b, d).copy_(qv)
        scores = torch.matmul(qg, k.transpose(-1, -2)) / math.sqrt(d)
        scores = torch.where(visible[:, None, None], scores.view(s, hkv, g, b, length),
                             float("-inf")).view(s, hkv, g * b, length)
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
    res = torch.empty(s * b, hq * d, dtype=torch.bfloat16, device=q.device)
    res.view(s, b, hkv, g, d).copy_(out.view(s, hkv, g, b, d).permute(0, 3, 1, 2, 4))
    return res
