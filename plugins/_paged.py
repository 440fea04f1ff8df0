"""Shared parts of the two paged-attention ops: argument checks, split sizing, the dense fp32
reference that both ``*_ref`` functions call with their own dequantizer, and the kernels' online
softmax step (`softmax_step`, a @triton.jit helper).

Conventions (plugins/LAYOUTS.md): q bf16 [total_q, Hq, 128]; cu_q_lens int32 [S+1];
seq_lens int32 [S] counts the new tokens; query t of stream s sits at position
seq_lens[s] - q_len_s + t; causal; window W > 0 keeps keys j with i - W < j <= i (W = 0: no window).
Query head n reads KV head n // (Hq // Hkv).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ._common import cdiv, check_tensor, early_launch, jit, launch, tl
from ._rows import pad_rows
from .attn_combine import launch_attn_combine

HEAD_DIM = 128
BLOCK_M = 16  # query rows (token x group head) per program, FP8 kernel: fixed, for batch invariance
LOG2E = 1.4426950408889634  # the kernels use exp2: scores are pre-scaled by log2(e)


@jit
def softmax_step(sc, m_i, l_i):
    """One key tile of the online softmax (log2 units): scores sc fp32 [M, N] (-inf: masked),
    running max m_i and sum l_i fp32 [M]. Returns (m_new, alpha = the factor that rescales what
    was accumulated, p = exp2(sc - m_new) fp32 [M, N], l_new). A row with no visible key so
    far keeps m = -inf and gets p = 0 and alpha = 0 (its accumulators are still 0)."""
    m_new = tl.maximum(m_i, tl.max(sc, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(sc - m_safe[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, 1)


@jit
def softmax_step_cols(sc, m_i, l_i):
    """`softmax_step` with the rows as columns: sc fp32 [N keys, M rows], m_i and l_i fp32 [M];
    returns (m_new, alpha, p fp32 [N, M], l_new) (the INT4 kernel's transposed tiles)."""
    m_new = tl.maximum(m_i, tl.max(sc, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(sc - m_safe[None, :])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, 0)


def check_common(q, block_tables, seq_lens, cu_q_lens, num_kv_heads, block_size, max_seq_len,
                 max_q_len, window, part, block_n):
    """Validate the arguments both paged-attention ops share; raise ValueError naming one."""
    check_tensor("q", q, torch.bfloat16, (None, None, HEAD_DIM))
    dev = q.device
    check_tensor("block_tables", block_tables, torch.int32, (None, None), dev)
    ns = block_tables.shape[0]
    check_tensor("seq_lens", seq_lens, torch.int32, (ns,), dev)
    check_tensor("cu_q_lens", cu_q_lens, torch.int32, (ns + 1,), dev)
    if q.shape[1] % num_kv_heads:
        raise ValueError(f"q: {q.shape[1]} heads is not a multiple of {num_kv_heads} KV heads")
    if block_size not in (16, 32, 64, 128):
        raise ValueError(f"k cache: BLOCK {block_size} not in (16, 32, 64, 128)")
    if max_q_len < 1:
        raise ValueError(f"max_q_len: {max_q_len} must be >= 1")
    if max_seq_len < max_q_len:
        raise ValueError(f"max_seq_len: {max_seq_len} below max_q_len {max_q_len}")
    if window < 0:
        raise ValueError(f"window: {window} must be >= 0 (0 = no window)")
    if part % block_n or part <= 0:
        raise ValueError(f"part: {part} must be a positive multiple of {block_n}")
    if block_tables.shape[1] * block_size < max_seq_len:
        raise ValueError(f"block_tables: {block_tables.shape[1]} blocks of {block_size} cannot "
                         f"hold max_seq_len {max_seq_len}")


def num_splits(max_seq_len: int, max_q_len: int, window: int, part: int) -> int:
    """Grid splits per stream: partitions of ``part`` positions that can hold a visible key."""
    if window > 0:
        span = min(window + max_q_len - 1, max_seq_len)
        return min(cdiv(span, part) + 1, cdiv(max_seq_len, part))
    return cdiv(max_seq_len, part)


def partial_buffers(total_q: int, hq: int, splits: int, device):
    """Empty fp32 partials: m, l [total_q*hq, splits] and acc [total_q*hq, splits, 128]."""
    r = total_q * hq
    return (torch.empty((r, splits), dtype=torch.float32, device=device),
            torch.empty((r, splits), dtype=torch.float32, device=device),
            torch.empty((r, splits, HEAD_DIM), dtype=torch.float32, device=device))


def paged_attention_dense_ref(q, block_tables, seq_lens, cu_q_lens, block_size: int,
                              gather_kv: Callable, sm_scale: float, window: int) -> torch.Tensor:
    """fp32 reference: per stream, gather the visible keys' slots, dequantize them with
    ``gather_kv(slots) -> (k [n, Hkv, 128], v [n, Hkv, 128]) fp32`` and run masked softmax attention.
    Keys outside the union of the stream's windows are never read. Returns bf16 like ``q``."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    hq = q.shape[1]
    bt, sl, cu = block_tables.cpu(), seq_lens.cpu(), cu_q_lens.cpu()
    for s in range(bt.shape[0]):
        q0, q1, L = int(cu[s]), int(cu[s + 1]), int(sl[s])
        if q1 == q0:
            continue
        qlen = q1 - q0
        lo = max(0, L - qlen - window + 1) if window > 0 else 0
        kpos = torch.arange(lo, L)
        slots = bt[s, kpos // block_size].long() * block_size + kpos % block_size
        k, v = gather_kv(slots.to(q.device))
        g = hq // k.shape[1]
        k = k.repeat_interleave(g, 1)
        v = v.repeat_interleave(g, 1)
        qpos = torch.arange(L - qlen, L)
        mask = kpos[None, :] <= qpos[:, None]
        if window > 0:
            mask &= kpos[None, :] > qpos[:, None] - window
        # query rows padded (`pad_rows`): a row's bits do not depend on the stream's q_len
        sc = torch.einsum("thd,nhd->htn", pad_rows(q[q0:q1].float()), k) * sm_scale
        sc = sc.masked_fill(~pad_rows(mask, True).to(q.device)[None], float("-inf"))
        p = torch.softmax(sc, -1)
        out[q0:q1] = torch.einsum("htn,nhd->thd", p, v)[:qlen]
    return out.to(torch.bfloat16)


def default_sm_scale() -> float:
    """1/sqrt(head_dim): the softmax scale when the caller did not fold it into the query."""
    return 1.0 / math.sqrt(HEAD_DIM)


def launch_paged(kernel, q, caches: tuple, block_tables, seq_lens, cu_q_lens, sm_scale: float,
                 max_seq_len: int, max_q_len: int, window: int, part: int, interpret: bool,
                 block_n: int, tune: dict, block_m: int = BLOCK_M, head_major: bool = False,
                 single: bool = False, **constexprs) -> torch.Tensor:
    """Launch one split-KV paged-attention kernel and merge its partials (`attn_combine`).

    caches: the four cache tensors the kernel reads after q (FP8: k, v, k_scale, v_scale;
    INT4: k_codes, v_codes, k_meta, v_meta); caches[0] is [num_blocks, BLOCK, Hkv, ...], or
    [num_blocks, Hkv, BLOCK, ...] with head_major (the INT4 cache).
    block_m: query rows (token x group head) per program; a row's bits must not depend on it.
    single: the kernel's SINGLE form (sliding layers): one program per row tile over the whole
    window writes the bf16 rows itself (no partials, no combine).
    Grid: (streams x KV heads x query-row tiles, splits). Returns bf16 like q.
    """
    total_q, hq, _ = q.shape
    blk, hkv = caches[0].shape[1], caches[0].shape[2]
    if head_major:
        blk, hkv = hkv, blk
    g = hq // hkv
    ns = block_tables.shape[0]
    splits = 1 if single else num_splits(max_seq_len, max_q_len, window, part)
    rt = -(-max_q_len * g // block_m)
    if total_q == 0 or ns == 0:
        return torch.empty_like(q)
    if single:   # acc_ptr is the output; m and l are not written
        m = l = torch.empty(1, dtype=torch.float32, device=q.device)
        acc, constexprs = torch.empty_like(q), dict(constexprs, SINGLE=1)
    else:
        m, l, acc = partial_buffers(total_q, hq, splits, q.device)
    launch(kernel, (ns * hkv * rt, splits), q, *caches, block_tables, seq_lens, cu_q_lens,
           m, l, acc, float(sm_scale) * LOG2E, hq, hkv, g, splits, rt, block_tables.stride(0),
           int(window), BLOCK=blk, PART=part, BLOCK_M=block_m, BLOCK_N=block_n, D=HEAD_DIM,
           DOT_F32=interpret, interpret=interpret, pdl_early=early_launch("attn", total_q),
           **constexprs, **tune)
    if single:
        return acc
    # merged here, not through the attn_combine op: this runs inside the attention op already
    return launch_attn_combine(m, l, acc, interpret,
                               early_launch("attn", total_q)).view(total_q, hq, HEAD_DIM)
