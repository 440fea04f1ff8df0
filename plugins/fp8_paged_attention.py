"""Paged (sliding-window) attention over the FP8 e4m3 cache of the sliding layers.

Decode (1 query token per stream) and verification (1 + k tokens, ragged) in one kernel. K and V
are e4m3 with one fp32 scale per layer each (dequant = fp8 · scale, shared/spec/kv-cache.md); the
fp8 values convert exactly to bf16/fp16 in registers and the scales multiply the scores and the
output. Window W > 0: query at position i sees keys j with i - W < j <= i (Kolibri-1: W = 513);
keys outside the window are never loaded (the runtime may reuse their blocks as a ring). W = 0
gives full causal attention (the stock FP8 full layers; used as the INT4 kernel's baseline).
Split-KV at fixed absolute partitions of PART positions + attn_combine (batch invariant);
SINGLE_SPLIT (off): sliding layers in one program per window, no combine.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_scalar_tensor, check_tensor, jit, kernel_path, tl
from ._common import pdl_enter, pdl_release
from ._paged import (HEAD_DIM, check_common, default_sm_scale, launch_paged,
                     paged_attention_dense_ref, softmax_step)

# Launch settings per layer kind (each fixed: PART and BLOCK_N set the reduction order, which
# must not depend on the batch). Sliding layers (window > 0: at most window + q keys): splits of
# 64 positions, 9-10 per stream, from bench/sliding_tune.py on the H200 at 32k (bench/results/
# h200-2026-11-30k/kk/; gpu_check's FP8 attention checks 12/12 under them): B=1 10.2 -> 6.1 µs
# per layer, B=64 29.5 -> 33.4 µs (the sweep's best sum of time / old time over both; the old
# 256 came from the first sweep, plugins/NOTES_HISTORY.md, v2).
PART = 64  # positions per split, sliding layers
BLOCK_N = 64  # keys per inner step, sliding layers
TUNE = dict(num_warps=4, num_stages=2)  # launch config, sliding layers (bench/plugins.py sweeps it)
# One program per (stream, KV head, row tile) over the whole window, the output normalised in
# the launch (no partials, no attn_combine launch): a row's keys are still visited in tiles of
# BLOCK_N at absolute positions from its stream's first visible key, so its bits depend on its
# own stream alone (batch invariant), but differ from the split form's, so it cannot be chosen
# by batch size. Off: on the H100 at 32k (`python3 bench/sliding_tune.py --single`) 14.8 / 15.0
# / 14.9 / 19.1 µs at B = 1 / 4 / 16 / 64 against the splits' 6.0 / 7.6 / 12.6 / 34.2; stages
# 2-5 (1-2 K / V buffers) alike, 7 and 9 slower (bench/results/h100-2026-12-07b/ss/, -07c/ss/):
# at B = 1 its 4 programs read the window at one SM's load rate each.
SINGLE_SPLIT = False
TUNE_SINGLE = dict(num_warps=4, num_stages=5)  # launch config of the SINGLE_SPLIT form (-07c/ss/)
# Full causal (window = 0: the FP8-KV option of the full layers), from bench/int4_attn_tune.py
# on the H200 at 32k (plugins/NOTES.md, "Pipelined loads"): num_stages 5 gives two K/V buffers
# (2-4 compile to one: the page lookup takes a stage); one warp per program keeps the row
# max/sum in the warp (no barriers) and lets more programs share an SM. B=16: 263.2 µs (the
# sliding settings) -> 163.7 µs (3.28 TB/s); B=1: 30.6 -> 30.5 µs.
PART_FULL = 512
BLOCK_N_FULL = 32
TUNE_FULL = dict(num_warps=1, num_stages=5)


def settings(window: int) -> tuple[int, int, dict]:
    """(default PART, BLOCK_N, launch config) of the layer kind: sliding (window > 0) or full."""
    return (PART, BLOCK_N, TUNE) if window > 0 else (PART_FULL, BLOCK_N_FULL, TUNE_FULL)


@jit
def _fp8_attn_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, seq_ptr, cuq_ptr,
                     m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV, G, S, RT, bt_stride, window,
                     BLOCK: tl.constexpr, PART: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, D: tl.constexpr, DOT_F32: tl.constexpr,
                     SINGLE: tl.constexpr = 0, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    j = tl.program_id(1)
    rt = pid % RT
    h = (pid // RT) % HKV
    s = pid // (RT * HKV)
    q_start = tl.load(cuq_ptr + s)
    q_len = tl.load(cuq_ptr + s + 1) - q_start
    if rt * BLOCK_M < q_len * G:
        seq_len = tl.load(seq_ptr + s)
        r = rt * BLOCK_M + tl.arange(0, BLOCK_M)
        tq = r // G
        rvalid = tq < q_len
        pos = seq_len - q_len + tq
        hq = h * G + r % G
        row = ((q_start + tq) * HQ + hq).to(tl.int64)
        d = tl.arange(0, D)
        lo_u = tl.where(window > 0, tl.maximum(seq_len - q_len - window + 1, 0), 0)
        if SINGLE:  # one program per row tile reads the whole window (SINGLE_SPLIT)
            k_lo = lo_u
            k_hi = seq_len
        else:
            p = lo_u // PART + j
            k_lo = tl.maximum(p * PART, lo_u)
            k_hi = tl.minimum((p + 1) * PART, seq_len)
        q = tl.load(q_ptr + row[:, None] * D + d[None, :], mask=rvalid[:, None], other=0.0)
        q = q.to(tl.float16)  # e4m3 converts to fp16 in one instruction; bf16 -> fp16 is exact
        if DOT_F32:
            q = q.to(tl.float32)
        qk_scale = qk_scale * tl.load(ks_ptr)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for n0 in range((k_lo // BLOCK_N) * BLOCK_N, k_hi, BLOCK_N):
            kpos = n0 + tl.arange(0, BLOCK_N)
            kval = (kpos >= k_lo) & (kpos < k_hi)
            if BLOCK >= BLOCK_N:  # the whole tile lies in one page, which holds a visible key
                phys = tl.load(bt_ptr + s * bt_stride + n0 // BLOCK).to(tl.int64)
                kh = (phys * BLOCK + n0 % BLOCK + tl.arange(0, BLOCK_N)) * HKV + h
            else:
                phys = tl.load(bt_ptr + s * bt_stride + kpos // BLOCK, mask=kval, other=0)
                kh = (phys.to(tl.int64) * BLOCK + kpos % BLOCK) * HKV + h
            kt = tl.load(k_ptr + kh[:, None] * D + d[None, :], mask=kval[:, None], other=0.0)
            kt = kt.to(tl.float16).to(tl.float32) if DOT_F32 else kt.to(tl.float16)
            sc = tl.dot(q, tl.trans(kt)) * qk_scale
            vis = rvalid[:, None] & kval[None, :] & (kpos[None, :] <= pos[:, None])
            vis = vis & ((window <= 0) | (kpos[None, :] > pos[:, None] - window))
            sc = tl.where(vis, sc, float("-inf"))
            m_new, alpha, pr, l_i = softmax_step(sc, m_i, l_i)
            vt = tl.load(v_ptr + kh[:, None] * D + d[None, :], mask=kval[:, None], other=0.0)
            if DOT_F32:
                pv_dot = tl.dot(pr.to(tl.float16).to(tl.float32), vt.to(tl.float32))
            else:
                pv_dot = tl.dot(pr.to(tl.float16), vt.to(tl.float16))
            acc = acc * alpha[:, None] + pv_dot
            m_i = m_new
        acc = acc * tl.load(vs_ptr)
        pdl_release(PDL)      # the next kernel may launch now (PDL 2)
        if SINGLE:  # attn_combine's formula for one split; acc_ptr is the bf16 output
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(acc_ptr + row[:, None] * D + d[None, :], out.to(tl.bfloat16),
                     mask=rvalid[:, None])
        else:
            tl.store(m_ptr + row * S + j, m_i, mask=rvalid)
            tl.store(l_ptr + row * S + j, l_i, mask=rvalid)
            tl.store(acc_ptr + (row * S + j)[:, None] * D + d[None, :], acc,
                     mask=rvalid[:, None])


def fp8_paged_attention_ref(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens,
                            cu_q_lens, sm_scale, window):
    """fp32 torch reference of :func:`fp8_paged_attention` (dequantize, then dense attention)."""
    blk, hkv = k_cache.shape[1], k_cache.shape[2]

    def gather(slots):
        k = k_cache.view(-1, hkv, HEAD_DIM)[slots].float() * k_scale.float().reshape(())
        v = v_cache.view(-1, hkv, HEAD_DIM)[slots].float() * v_scale.float().reshape(())
        return k, v

    return paged_attention_dense_ref(q, block_tables, seq_lens, cu_q_lens, blk, gather, sm_scale,
                                     window)


@torch.library.custom_op(f"{NAMESPACE}::fp8_paged_attention", mutates_args=())
def _fp8_attn_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 k_scale: torch.Tensor, v_scale: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, cu_q_lens: torch.Tensor, sm_scale: float,
                 max_seq_len: int, max_q_len: int, window: int, part: int) -> torch.Tensor:
    if kernel_path(q, "fp8_paged_attention") == "ref":
        return fp8_paged_attention_ref(q, k_cache, v_cache, k_scale, v_scale, block_tables,
                                       seq_lens, cu_q_lens, sm_scale, window)
    return _launch(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, cu_q_lens,
                   sm_scale, max_seq_len, max_q_len, window, part, False)


@_fp8_attn_op.register_fake
def _(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, cu_q_lens, sm_scale,
      max_seq_len, max_q_len, window, part):
    return torch.empty_like(q)


def _launch(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, cu_q_lens, sm_scale,
            max_seq_len, max_q_len, window, part, interpret):
    _, block_n, tune = settings(window)
    single = window > 0 and SINGLE_SPLIT
    return launch_paged(_fp8_attn_kernel, q, (k_cache, v_cache, k_scale, v_scale), block_tables,
                        seq_lens, cu_q_lens, sm_scale, max_seq_len, max_q_len, window, part,
                        interpret, block_n, TUNE_SINGLE if single else tune, single=single)


def fp8_paged_attention(q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, cu_q_lens,
                        max_seq_len: int, max_q_len: int, window: int,
                        sm_scale: float | None = None, part: int | None = None,
                        interpret: bool = False):
    """Causal (sliding-window) paged attention, decode or verification, over the FP8 cache.

    Args:
        q: bf16 [total_q, Hq, 128] (RoPE already applied), contiguous.
        k_cache, v_cache: float8_e4m3fn [num_blocks, BLOCK, Hkv, 128]; BLOCK in (16, 32, 64, 128).
        k_scale, v_scale: fp32 one-element tensors (0-dim or [1]): dequant = fp8 * scale.
        block_tables: int32 [num_seqs, max_blocks_per_seq]; seq_lens: int32 [num_seqs] (new tokens
            included); cu_q_lens: int32 [num_seqs + 1].
        max_seq_len, max_q_len: host ints bounding seq_lens and the per-stream query counts.
        window: 513 for Kolibri-1's sliding layers; 0 = full causal.
        sm_scale: softmax scale (None = 1/sqrt(128)).
        part: positions per split (a multiple of the layer kind's BLOCK_N; None = PART for
            sliding layers, PART_FULL for full causal); keep it fixed (it sets the reduction
            order).
        interpret: run the Triton kernels in the interpreter on CPU tensors (tests only).
    Returns: bf16 [total_q, Hq, 128].
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kv-cache.md (FP8 sliding layers), kolibri-1.md (window 513, GQA).
    """
    check_tensor("k_cache", k_cache, torch.float8_e4m3fn, (None, None, None, HEAD_DIM), q.device)
    nb, blk, hkv = k_cache.shape[:3]
    default_part, block_n, _ = settings(window)
    part = default_part if part is None else part
    check_common(q, block_tables, seq_lens, cu_q_lens, hkv, blk, max_seq_len, max_q_len, window,
                 part, block_n)
    check_tensor("v_cache", v_cache, torch.float8_e4m3fn, tuple(k_cache.shape), q.device)
    check_scalar_tensor("k_scale", k_scale, q.device)
    check_scalar_tensor("v_scale", v_scale, q.device)
    sm_scale = default_sm_scale() if sm_scale is None else float(sm_scale)
    args = (q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, cu_q_lens, sm_scale,
            int(max_seq_len), int(max_q_len), int(window), int(part))
    if interpret:
        return _launch(*args, True)
    return torch.ops.kolibri_plugins.fp8_paged_attention(*args)
