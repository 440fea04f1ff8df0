"""EXPERIMENT (bench only): INT4 paged attention with the query rows in the MMA's N dimension.

The plugin (plugins/int4_paged_attention.py) computes S = Q·K^T and O = P·V with the GQA group's
rows as the MMA's M: an m16n8k16 tile has 16 rows, 5 of them used at decode (GQA 5). Here the
transposes: S^T = K·Q^T and O^T = V^T·P^T, so keys and head dims are M and the query rows N,
which the MMA tiles by 8: at decode QN = 8 columns (5 used), half the HMMAs, half the fp32
accumulator registers ([128, 8] instead of [16, 128]) and half the exp2s per key tile. Each
column's reduction order (over d for S, over keys in 16-key steps for O) does not depend on QN,
so a row gets the same bits at decode (QN 8) and verification (QN 32).

Same arguments and maths as the plugin's kernel; `_launch` mirrors `launch_paged` with QN.
"""

from __future__ import annotations

from kolibri_trt_plugins._common import jit, launch, pdl_enter, pdl_release, tl
from kolibri_trt_plugins._paged import HEAD_DIM, LOG2E, num_splits, partial_buffers
from kolibri_trt_plugins.attn_combine import launch_attn_combine
from kolibri_trt_plugins.int4_paged_attention import _codes_f16, _meta

PART = 512
BLOCK_N = 32
USE_ASM = True
MASK_FREE = True
TUNE = dict(num_warps=1, num_stages=5)


@jit
def _tile_t(n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r, k_lo,
            k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, MASKED: tl.constexpr,
            BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
            DOT_F32: tl.constexpr):
    """One key tile, transposed: sc [BLOCK_N keys, QN rows]; acc_e/acc_o [D/2, QN]."""
    kpos = n0 + i_n
    kval = (kpos >= k_lo) & (kpos < k_hi)
    if BLOCK >= BLOCK_N:  # the whole tile lies in one page
        phys = tl.load(bt_p + n0 // BLOCK).to(tl.int64)
        base = (phys * BLOCK + n0 % BLOCK) * HKV
        kc = tl.load(kc_p + base * (D // 2) + offs)
        vc = tl.load(vc_p + base * (D // 2) + offs)
        ks, ko = _meta(km_p + base, i_n * HKV, kval)
        vs, vo = _meta(vm_p + base, i_n * HKV, kval)
    else:
        phys = tl.load(bt_p + kpos // BLOCK, mask=kval, other=0)
        kh = (phys.to(tl.int64) * BLOCK + kpos % BLOCK) * HKV
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
    m_new = tl.maximum(m_i, tl.max(sc, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    pr = tl.exp2(sc - m_safe[None, :])
    l_i = l_i * alpha + tl.sum(pr, 0)
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
def _int4_attn_t_kernel(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, seq_ptr, cuq_ptr,
                        m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV, G, S, RT, bt_stride, window,
                        BLOCK: tl.constexpr, PART: tl.constexpr, QN: tl.constexpr,
                        BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
                        DOT_F32: tl.constexpr, MASK_FREE: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    j = tl.program_id(1)
    rt = pid % RT
    h = (pid // RT) % HKV
    s = pid // (RT * HKV)
    q_start = tl.load(cuq_ptr + s)
    q_len = tl.load(cuq_ptr + s + 1) - q_start
    seq_len = tl.load(seq_ptr + s)
    if rt * QN < q_len * G:
        r = rt * QN + tl.arange(0, QN)
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
                     mask=rvalid[None, :], other=0)  # [D/2, QN] bf16 pairs
        q_e = (qw << 16).to(tl.float32, bitcast=True).to(tl.float16)
        q_o = ((qw & 0xFFFF0000).to(tl.float32, bitcast=True) * 0.0625).to(tl.float16)
        se = tl.sum(q_e.to(tl.float32), 0)
        so = tl.sum(q_o.to(tl.float32), 0)
        qsum = (se + 16.0 * so) * qk_scale
        bias = tl.zeros([BLOCK_N, QN], tl.float32) - (1024.0 * (se + so))[None, :]
        if DOT_F32:
            q_e = q_e.to(tl.float32)
            q_o = q_o.to(tl.float32)
        m_i = tl.full([QN], float("-inf"), tl.float32)
        l_i = tl.zeros([QN], tl.float32)
        acc_e = tl.zeros([D // 2, QN], tl.float32)
        acc_o = tl.zeros([D // 2, QN], tl.float32)
        acc_c = tl.zeros([QN], tl.float32)
        i_n = tl.arange(0, BLOCK_N)
        offs = (i_n * HKV)[:, None] * (D // 2) + b[None, :]
        kc_p = kc_ptr + h * (D // 2)
        vc_p = vc_ptr + h * (D // 2)
        km_p = km_ptr.to(tl.pointer_type(tl.uint32)) + h
        vm_p = vm_ptr.to(tl.pointer_type(tl.uint32)) + h
        bt_p = bt_ptr + s * bt_stride
        n_start = (k_lo // BLOCK_N) * BLOCK_N
        hi_min = tl.min(tl.where(rvalid, hi_r, k_hi), 0)
        n_mid = n_start
        if MASK_FREE:
            n_mid = tl.where(window == 0, tl.maximum(n_start, ((hi_min + 1) // BLOCK_N) * BLOCK_N),
                             n_start)
        for n0 in range(n_start, n_mid, BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile_t(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, False, BLOCK, BLOCK_N,
                D, USE_ASM, DOT_F32)
        for n0 in range(n_mid, k_hi, BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile_t(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, True, BLOCK, BLOCK_N,
                D, USE_ASM, DOT_F32)
        pdl_release(PDL)
        tl.store(m_ptr + row * S + j, m_i, mask=rvalid)
        tl.store(l_ptr + row * S + j, l_i, mask=rvalid)
        ap = acc_ptr + (row * S + j)[None, :] * D + 2 * b[:, None]
        tl.store(ap, acc_e + acc_c[None, :], mask=rvalid[None, :])
        tl.store(ap + 1, acc_o + acc_c[None, :], mask=rvalid[None, :])


def qn_for(max_q_len: int, g: int) -> int:
    """Query columns per program: the smallest of 8, 16, 32 that holds max_q_len·G rows."""
    rows = max_q_len * g
    return 8 if rows <= 8 else 16 if rows <= 16 else 32


def _launch(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens, sm_scale,
            max_seq_len, max_q_len, window, part, interpret, qn=None):
    total_q, hq, _ = q.shape
    blk, hkv = k_codes.shape[1], k_codes.shape[2]
    g = hq // hkv
    ns = block_tables.shape[0]
    qn = qn_for(max_q_len, g) if qn is None else qn
    splits = num_splits(max_seq_len, max_q_len, window, part)
    rt = -(-max_q_len * g // qn)
    m, l, acc = partial_buffers(total_q, hq, splits, q.device)
    launch(_int4_attn_t_kernel, (ns * hkv * rt, splits), q, k_codes, v_codes, k_meta, v_meta,
           block_tables, seq_lens, cu_q_lens, m, l, acc, float(sm_scale) * LOG2E, hq, hkv, g,
           splits, rt, block_tables.stride(0), int(window), BLOCK=blk, PART=part, QN=qn,
           BLOCK_N=BLOCK_N, D=HEAD_DIM, USE_ASM=USE_ASM and not interpret, DOT_F32=interpret,
           MASK_FREE=MASK_FREE, interpret=interpret, **TUNE)
    return launch_attn_combine(m, l, acc, interpret).view(total_q, hq, HEAD_DIM)
