"""The block drafter's ring attention in one kernel per layer (`DrafterPlugin._attend`, attn
"kernel"): each stream's block rows attend to the rows of its ring slot that are visible by
position, read straight from the ring (no gather, no mask tensor).

Maths (the dense path of the drafter's torch glue, `plugin_glue.ring_attention` +
`visible_rows`): for stream s (ring slot slots[s], anchor p = anchors[s]) and block row j
(position pos[s, j]), ring row l < length is visible iff
    max(p - context_window, 0) <= ring_pos[slot, l] <= pos[s, j]      (-1 = empty: never)
and query head n (KV head n // (Hq / Hkv)) gets softmax(q·kᵀ / sqrt(D)) · v over the visible
rows, fp32 scores and sums, bf16 out. A row with no visible key (never in the drafter: each
block row's own position is written into the ring before the round) yields zeros here; the
torch dense path would give NaN (softmax of all -inf).

Kernel: one program per (stream, KV head, split of the ring rows); its rows are the g = Hq / Hkv
query heads times the B block rows (padded to >= 16 for tl.dot); its ring rows (SPLIT_ROWS of
them: flash-decoding's split-KV) in BLOCK_L tiles with an online softmax (running max and sum,
log2 units) in a fixed tile order. With one split the program writes the output; with more,
each writes its partial (m, l, acc) and `attn_combine` merges a row's splits in a fixed order.
The number of splits depends on `length` alone, so a row's bits never depend on the other
streams of the call (batch invariance). Probabilities enter the P·V product as bf16 (the
tensor-core operand type), the sums stay fp32. Ring layout: the drafter's (see `ring_attention`).

Why split: a round attends L = 256 .. 4096 ring rows with 1-8 streams and 2 KV heads, so one
program per (stream, head) left the H200 nearly idle: 22 µs per layer at L = 1024, one stream
(bench/results/h200-2026-11-30d/k_drafter.log).
"""

from __future__ import annotations

import math

import torch

from ._common import NAMESPACE, cdiv, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import pdl_enter, pdl_release
from .attn_combine import launch_attn_combine

BLOCK_L = 64
SPLIT_ROWS = 128     # ring rows per program (a multiple of BLOCK_L): 8 splits at L = 1024
LOG2E = 1.4426950408889634
INDEX_DTYPES = (torch.int64, torch.int32)


@jit
def _ring_attention_kernel(q_ptr, kv_ptr, rpos_ptr, slot_ptr, anchor_ptr, pos_ptr, out_ptr,
                           m_ptr, l_ptr, acc_ptr, sq_s, sq_b, n_slots, ring, length, window,
                           scale, span, B: tl.constexpr, G: tl.constexpr, HKV: tl.constexpr,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_L: tl.constexpr, SPLIT: tl.constexpr,
                           DOT_F32: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    split = tl.program_id(2)
    m = tl.arange(0, BLOCK_M)                       # row m: query head h*G + m // B, block row m % B
    row_ok = m < G * B
    j = m % B
    head = h * G + m // B
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + s * sq_s + j[:, None] * sq_b + head[:, None] * D + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_F32:   # the interpreter: bf16 dot operands as their exact fp32 values
        q = q.to(tl.float32)
    row_pos = tl.load(pos_ptr + s * B + j, mask=row_ok, other=-2).to(tl.int64)
    slot = tl.load(slot_ptr + s).to(tl.int64)
    lo = tl.maximum(tl.load(anchor_ptr + s).to(tl.int64) - window, 0)
    plane = n_slots * ring * HKV * D                # offset of the values in kv
    k_base = kv_ptr + slot * ring * HKV * D + h * D
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    first = split * span                            # this program's ring rows: first .. stop - 1
    stop = tl.minimum(length, first + span)
    for start in range(first, stop, BLOCK_L):
        l = start + tl.arange(0, BLOCK_L)
        l_ok = l < stop
        rp = tl.load(rpos_ptr + slot * ring + l, mask=l_ok, other=-1).to(tl.int64)
        at = k_base + l[:, None].to(tl.int64) * (HKV * D) + d[None, :]
        kv_ok = l_ok[:, None] & d_ok[None, :]
        k = tl.load(at, mask=kv_ok, other=0.0)
        v = tl.load(at + plane, mask=kv_ok, other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        vis = (rp[None, :] >= lo) & (rp[None, :] <= row_pos[:, None]) & l_ok[None, :]
        sc = tl.where(vis, tl.dot(q, tl.trans(k)) * scale, float("-inf"))   # log2 units
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # nothing visible yet: no NaN
        p = tl.exp2(sc - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = p.to(tl.bfloat16)
        if DOT_F32:
            pv = pv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v)
        m_i = m_new
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    out_row = s * B + j
    if SPLIT == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]    # no visible key: zeros
        tl.store(out_ptr + out_row[:, None] * (G * HKV * D) + head[:, None] * D + d[None, :],
                 o.to(tl.bfloat16), mask=row_ok[:, None] & d_ok[None, :])
    else:      # partials of row (out_row, head), split `split`: attn_combine's layout
        part = (out_row * (G * HKV) + head) * SPLIT + split
        tl.store(m_ptr + part, m_i, mask=row_ok)
        tl.store(l_ptr + part, l_i, mask=row_ok)
        tl.store(acc_ptr + part[:, None] * D + d[None, :], acc,
                 mask=row_ok[:, None] & d_ok[None, :])


def ring_attention_ref(q: torch.Tensor, kv: torch.Tensor, ring_pos: torch.Tensor,
                       slots: torch.Tensor, anchors: torch.Tensor, pos: torch.Tensor,
                       context_window: int, length: int) -> torch.Tensor:
    """Plain-torch reference of :func:`ring_attention`: the drafter glue's dense path (gather,
    fp32 matmul, -inf mask, softmax, fp32 matmul, bf16) with the visibility rule; rows with no
    visible key are zeros."""
    s, b, hq, d = q.shape
    hkv = kv.shape[3]
    g = hq // hkv
    slots = slots.long()
    rp = ring_pos[:, :length].index_select(0, slots).long()[:, None, :]         # [S, 1, L]
    lo = (anchors.long() - context_window).clamp(min=0)[:, None, None]
    visible = (rp >= lo) & (rp <= pos.long()[:, :, None])                       # [S, B, L]
    kvf = kv[:, :, :length].index_select(1, slots).float()                     # [2, S, L, Hkv, D]
    k, v = kvf[0].transpose(1, 2), kvf[1].transpose(1, 2)                       # [S, Hkv, L, D]
    qg = q.float().reshape(s, b, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(s, hkv, g * b, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)) / math.sqrt(d)
    vis = visible[:, None, None].expand(s, 1, g, b, length).reshape(s, 1, g * b, length)
    probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)
    out = torch.matmul(probs.nan_to_num(0.0), v)                  # all -inf rows: NaN -> 0
    out = out.view(s, hkv, g, b, d).permute(0, 3, 1, 2, 4).reshape(s * b, hq * d)
    return out.to(torch.bfloat16)


@torch.library.custom_op(f"{NAMESPACE}::ring_attention", mutates_args=())
def _ring_attention_op(q: torch.Tensor, kv: torch.Tensor, ring_pos: torch.Tensor,
                       slots: torch.Tensor, anchors: torch.Tensor, pos: torch.Tensor,
                       context_window: int, length: int) -> torch.Tensor:
    if kernel_path(q, "ring_attention") == "ref":
        return ring_attention_ref(q, kv, ring_pos, slots, anchors, pos, context_window, length)
    return _launch(q, kv, ring_pos, slots, anchors, pos, context_window, length, False)


@_ring_attention_op.register_fake
def _(q, kv, ring_pos, slots, anchors, pos, context_window, length):
    s, b, hq, d = q.shape
    return q.new_empty(s * b, hq * d)


def _warps(d: int) -> int:
    """8 warps from D = 128 up: sm_90 ptxas spills with 4 (255 registers at BLOCK_L 64, D 128)."""
    return 8 if d >= 128 else 4


def num_splits(length: int, d: int) -> int:
    """Programs per (stream, KV head): one per SPLIT_ROWS ring rows; 1 when D is not a power
    of two (attn_combine's tile) or the rows fit one split. Depends on length and D only."""
    if d != next_pow2(d) or d < 16:
        return 1
    return cdiv(int(length), SPLIT_ROWS)


def _launch(q, kv, ring_pos, slots, anchors, pos, context_window, length, interpret):
    s, b, hq, d = q.shape
    hkv = kv.shape[3]
    dev = q.device
    split = num_splits(length, d)
    out = torch.empty(s * b, hq * d, dtype=torch.bfloat16, device=dev)
    if not s:
        return out
    rows = s * b * hq
    if split > 1:
        m = torch.empty(rows, split, dtype=torch.float32, device=dev)
        l = torch.empty_like(m)
        acc = torch.empty(rows, split, d, dtype=torch.float32, device=dev)
    else:
        m = l = acc = out                      # not written
    launch(_ring_attention_kernel, (s, hkv, split), q, kv, ring_pos, slots, anchors, pos, out,
           m, l, acc, q.stride(0), q.stride(1), kv.shape[1], kv.shape[2], int(length),
           int(context_window), LOG2E / math.sqrt(d), SPLIT_ROWS if split > 1 else int(length),
           B=b, G=hq // hkv, HKV=hkv, D=d,
           BLOCK_M=max(16, next_pow2((hq // hkv) * b)), BLOCK_D=max(16, next_pow2(d)),
           BLOCK_L=BLOCK_L, SPLIT=split, DOT_F32=interpret, num_warps=_warps(d), num_stages=2,
           interpret=interpret)
    if split > 1:
        out = launch_attn_combine(m, l, acc, interpret).view(s * b, hq * d)
    return out


def ring_attention(q, kv, ring_pos, slots, anchors, pos, context_window: int, length: int,
                   interpret: bool = False) -> torch.Tensor:
    """Ring attention of S streams' block rows over their ring slots: one launch, plus one
    `attn_combine` launch when the rows are split (`num_splits`: length > SPLIT_ROWS).

    Args:
        q: bf16 [S, B, Hq, D], queries with RoPE; heads and head dims contiguous, the strides
            of dims 0, 1 free (e.g. the q columns of the fused QKV product).
        kv: bf16 [2, slots + 1, R, Hkv, D] contiguous, one layer's ring (keys with RoPE, values).
        ring_pos: int64 / int32 [slots + 1, R] contiguous: the position each ring row holds,
            -1 = empty.
        slots: int64 / int32 [S]: each stream's ring slot. anchors: int64 / int32 [S]: p.
        pos: int64 / int32 [S, B] contiguous: block row j's position (p + j in the drafter).
        context_window: keys at positions < p - context_window are not visible.
        length: ring rows attended, 0 < length <= R.
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        bf16 [S*B, Hq*D]: row s*B + j, columns of query head n at n*D (zeros for a row that
        sees no key).
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device, stride or value;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: kolibri_trt/drafter/plugin_glue.py (ring_attention "dense", visible_rows).
    """
    check_tensor("q", q, torch.bfloat16, (None, None, None, None), contiguous=False)
    s, b, hq, d = q.shape
    dev = q.device
    if q.stride(3) != 1 or q.stride(2) != d:
        raise ValueError(f"q: heads and head dims must be contiguous, strides {q.stride()}")
    check_tensor("kv", kv, torch.bfloat16, (2, None, None, None, d), dev)
    n_slots, r, hkv = kv.shape[1:4]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"kv: {hkv} KV heads do not divide the {hq} query heads")
    check_tensor("ring_pos", ring_pos, INDEX_DTYPES, (n_slots, r), dev)
    check_tensor("slots", slots, INDEX_DTYPES, (s,), dev)
    check_tensor("anchors", anchors, INDEX_DTYPES, (s,), dev)
    check_tensor("pos", pos, INDEX_DTYPES, (s, b), dev)
    if not 0 < int(length) <= r:
        raise ValueError(f"length: {length} is not in 1 .. R = {r}")
    if int(context_window) < 0:
        raise ValueError(f"context_window: {context_window} is negative")
    if interpret:
        return _launch(q, kv, ring_pos, slots, anchors, pos, context_window, length, True)
    return torch.ops.kolibri_plugins.ring_attention(q, kv, ring_pos, slots, anchors, pos,
                                                    int(context_window), int(length))
