"""Frozen copy of INT4 paged attention v5 (plugins/int4_paged_attention.py at 855f338): one tile
at a time, the loop the software-pipelined kernel replaced, plus the DEFER_SUMS option. Timed beside it by
bench/int4_attn_ab.py (the bits must be equal); remove once the plugin's kernel has given its
bits and times on the H200.
"""

from __future__ import annotations

import sys

from kolibri_trt_plugins._common import jit, pdl_enter, pdl_release, tl
from kolibri_trt_plugins._paged import launch_paged, softmax_step_cols
from kolibri_trt_plugins.int4_paged_attention import _codes_f16, _meta

IA = sys.modules["kolibri_trt_plugins.int4_paged_attention"]


@jit
def _tile(n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r, k_lo,
          k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, KS, PAGE, MASKED: tl.constexpr,
          BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
          DOT_F32: tl.constexpr, DEFER_SUMS: tl.constexpr):
    """One BLOCK_N-key tile of the online softmax, transposed: scores sc [BLOCK_N keys, BLOCK_M
    rows], acc_e/acc_o [D/2, BLOCK_M]; returns the updated (m, l, acc_e, acc_o, acc_c).
    MASKED=False: every key of the tile is visible to every row (no mask math)."""
    kpos = n0 + i_n
    kval = (kpos >= k_lo) & (kpos < k_hi)
    # code loads are not masked: a tile's rows lie in mapped pages (or page 0), and the codes of
    # invisible keys meet p = 0 and zeroed (masked) scale and offset.
    if BLOCK >= BLOCK_N:  # the whole tile lies in one page, which holds a visible key
        phys = tl.load(bt_p + n0 // BLOCK).to(tl.int64)
        base = phys * PAGE + (n0 % BLOCK) * KS
        kc = tl.load(kc_p + base * (D // 2) + offs)
        vc = tl.load(vc_p + base * (D // 2) + offs)
        ks, ko = _meta(km_p + base, i_n * KS, kval)
        vs, vo = _meta(vm_p + base, i_n * KS, kval)
    else:
        phys = tl.load(bt_p + kpos // BLOCK, mask=kval, other=0)
        kh = phys.to(tl.int64) * PAGE + (kpos % BLOCK) * KS
        b = tl.arange(0, D // 2)
        kc = tl.load(kc_p + kh[:, None] * (D // 2) + b[None, :])
        vc = tl.load(vc_p + kh[:, None] * (D // 2) + b[None, :])
        ks, ko = _meta(km_p, kh, kval)
        vs, vo = _meta(vm_p, kh, kval)
    klo, khi = _codes_f16(kc, False, True, USE_ASM)
    if DOT_F32:
        klo = klo.to(tl.float32)
        khi = khi.to(tl.float32)
    sc = tl.dot(khi, q_o, acc=tl.dot(klo, q_e, acc=bias))
    sc = sc * (ks * qk_scale)[:, None] + ko[:, None] * qsum[None, :]
    if MASKED:
        vis = (kpos[:, None] >= lo_r[None, :]) & (kpos[:, None] <= hi_r[None, :])
        sc = tl.where(vis, sc, float("-inf"))
    if DEFER_SUMS:  # bench variant: per-key sums [BLOCK_N, BLOCK_M], reduced at the end
        m_new = tl.maximum(m_i, tl.max(sc, 0))
        alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
        pr = tl.exp2(sc - tl.where(m_new == float("-inf"), 0.0, m_new)[None, :])
        l_i = l_i * alpha[None, :] + pr
        acc_c = acc_c * alpha[None, :] + pr * vo[:, None]
    else:
        m_new, alpha, pr, l_i = softmax_step_cols(sc, m_i, l_i)
        acc_c = acc_c * alpha + tl.sum(pr * vo[:, None], 0)
    vlo, vhi = _codes_f16(vc, True, False, USE_ASM)
    pv = (pr * vs[:, None]).to(tl.float16)
    if DOT_F32:
        pv = pv.to(tl.float32)
        vlo = vlo.to(tl.float32)
        vhi = vhi.to(tl.float32)
    acc_e = tl.dot(tl.trans(vlo), pv, acc=acc_e * alpha[None, :])
    acc_o = tl.dot(tl.trans(vhi), pv, acc=acc_o * alpha[None, :])
    return m_new, l_i, acc_e, acc_o, acc_c


@jit
def _int4_attn_v5_kernel(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, seq_ptr, cuq_ptr,
                      m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV, G, S, RT, bt_stride, window,
                      BLOCK: tl.constexpr, PART: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
                      DOT_F32: tl.constexpr, MASK_FREE: tl.constexpr, DEFER_SUMS: tl.constexpr,
                      PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    j = tl.program_id(1)
    rt = pid % RT
    h = (pid // RT) % HKV
    s = pid // (RT * HKV)
    q_start = tl.load(cuq_ptr + s)
    q_len = tl.load(cuq_ptr + s + 1) - q_start
    seq_len = tl.load(seq_ptr + s)
    if rt * BLOCK_M < q_len * G:
        r = rt * BLOCK_M + tl.arange(0, BLOCK_M)
        tq = r // G
        rvalid = tq < q_len
        pos = seq_len - q_len + tq
        row = ((q_start + tq) * HQ + h * G + r % G).to(tl.int64)
        lo_u = tl.where(window > 0, tl.maximum(seq_len - q_len - window + 1, 0), 0)
        p = lo_u // PART + j
        k_lo = tl.maximum(p * PART, lo_u)
        k_hi = tl.minimum((p + 1) * PART, seq_len)
        hi_r = tl.where(rvalid, tl.minimum(pos, k_hi - 1), -1)
        lo_r = tl.maximum(tl.where(window > 0, pos - window + 1, 0), k_lo)
        b = tl.arange(0, D // 2)
        qw = tl.load(q_ptr.to(tl.pointer_type(tl.uint32)) + row[None, :] * (D // 2) + b[:, None],
                     mask=rvalid[None, :], other=0)  # [D/2, BLOCK_M] bf16 pairs
        q_e = (qw << 16).to(tl.float32, bitcast=True).to(tl.float16)
        q_o = ((qw & 0xFFFF0000).to(tl.float32, bitcast=True) * 0.0625).to(tl.float16)
        se = tl.sum(q_e.to(tl.float32), 0)
        so = tl.sum(q_o.to(tl.float32), 0)
        qsum = (se + 16.0 * so) * qk_scale
        bias = tl.zeros([BLOCK_N, BLOCK_M], tl.float32) - (1024.0 * (se + so))[None, :]
        if DOT_F32:
            q_e = q_e.to(tl.float32)
            q_o = q_o.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        if DEFER_SUMS:
            l_i = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
            acc_c = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        else:
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc_c = tl.zeros([BLOCK_M], tl.float32)
        acc_e = tl.zeros([D // 2, BLOCK_M], tl.float32)
        acc_o = tl.zeros([D // 2, BLOCK_M], tl.float32)
        i_n = tl.arange(0, BLOCK_N)
        # head-major pages: a key's row is page · BLOCK·Hkv + head · BLOCK + slot (the stride of
        # consecutive keys KS = 1; token-major pages had KS = Hkv: 64-byte reads 256 bytes
        # apart; H200 32k B = 16 / 64 117.3 / 450.6 -> 109.8 / 411.1 µs,
        # bench/results/h200-2026-11-30m/my/)
        KS = 1
        HS = BLOCK
        PAGE = BLOCK * HKV
        offs = (i_n * KS)[:, None] * (D // 2) + b[None, :]
        kc_p = kc_ptr + h * HS * (D // 2)
        vc_p = vc_ptr + h * HS * (D // 2)
        km_p = km_ptr.to(tl.pointer_type(tl.uint32)) + h * HS
        vm_p = vm_ptr.to(tl.pointer_type(tl.uint32)) + h * HS
        bt_p = bt_ptr + s * bt_stride
        n_start = (k_lo // BLOCK_N) * BLOCK_N
        hi_min = tl.min(tl.where(rvalid, hi_r, k_hi), 0)
        n_mid = n_start
        if MASK_FREE:
            n_mid = tl.where(window == 0, tl.maximum(n_start, ((hi_min + 1) // BLOCK_N) * BLOCK_N),
                             n_start)
        for n0 in range(n_start, n_mid, BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, KS, PAGE, False, BLOCK,
                BLOCK_N, D, USE_ASM, DOT_F32, DEFER_SUMS)
        for n0 in range(n_mid, k_hi, BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, KS, PAGE, True, BLOCK,
                BLOCK_N, D, USE_ASM, DOT_F32, DEFER_SUMS)
        if DEFER_SUMS:
            l_i = tl.sum(l_i, 0)
            acc_c = tl.sum(acc_c, 0)
        pdl_release(PDL)
        tl.store(m_ptr + row * S + j, m_i, mask=rvalid)
        tl.store(l_ptr + row * S + j, l_i, mask=rvalid)
        ap = acc_ptr + (row * S + j)[None, :] * D + 2 * b[:, None]
        tl.store(ap, acc_e + acc_c[None, :], mask=rvalid[None, :])
        tl.store(ap + 1, acc_o + acc_c[None, :], mask=rvalid[None, :])




def int4_attention_v5(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens,
                      max_seq_len: int, max_q_len: int, defer: bool = False):
    """v5 with the plugin's PART, BLOCK_N, row tiles and launch settings (sm_scale 1/sqrt(128),
    full causal); bf16 [total_q, Hq, 128]. defer: per-key sums of p and p·offset, reduced over
    keys once per program (the plugin's DEFER_SUMS; new bits)."""
    rows = IA.rows_per_program(max_q_len, q.shape[1] // k_codes.shape[1])
    return launch_paged(_int4_attn_v5_kernel, q, (k_codes, v_codes, k_meta, v_meta), block_tables,
                        seq_lens, cu_q_lens, 128 ** -0.5, max_seq_len, max_q_len, 0, IA.PART,
                        False, IA.BLOCK_N, IA.TUNE_DECODE if rows == IA.ROWS_DECODE else IA.TUNE,
                        block_m=rows, head_major=True, USE_ASM=True, MASK_FREE=True,
                        DEFER_SUMS=defer)
