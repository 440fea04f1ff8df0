"""EXPERIMENT (bench only): INT4 paged attention v5 with W warps per program, each warp an
independent online softmax over every W-th 32-key tile of the partition, merged in a fixed order
at the end. The reduction order depends on W and PART only (not on the batch), so it stays batch
invariant; a partition's W * 32 keys per step run on W warps at once: less latency per program
where few programs run (one stream, short contexts). W = 1 is v5's maths.
"""

from __future__ import annotations

from kolibri_trt_plugins._common import jit, launch, pdl_enter, pdl_release, tl
from kolibri_trt_plugins._paged import HEAD_DIM, LOG2E, num_splits, partial_buffers
from kolibri_trt_plugins.attn_combine import launch_attn_combine
from kolibri_trt_plugins.int4_paged_attention import _codes_f16, _meta, rows_per_program

PART, BLOCK_N, W, STAGES, USE_ASM, MASK_FREE = 512, 32, 4, 5, True, True


@jit
def _tile_w(n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r, k_lo,
            k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, MASKED: tl.constexpr,
            BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
            USE_ASM: tl.constexpr, DOT_F32: tl.constexpr):
    """W key tiles at once, tile w on warp w: sc [W, BLOCK_N, M], acc_e/acc_o [W, D/2, M]."""
    n0w = n0 + tl.arange(0, W) * BLOCK_N
    kpos = n0w[:, None] + i_n[None, :]
    kval = (kpos >= k_lo) & (kpos < k_hi)
    if BLOCK >= BLOCK_N:
        phys = tl.load(bt_p + n0w // BLOCK, mask=n0w < k_hi, other=0).to(tl.int64)
        base = (phys * BLOCK + n0w % BLOCK) * HKV
        kc = tl.load(kc_p + base[:, None, None] * (D // 2) + offs[None, :, :])
        vc = tl.load(vc_p + base[:, None, None] * (D // 2) + offs[None, :, :])
        ks, ko = _meta(km_p + base[:, None], i_n[None, :] * HKV, kval)
        vs, vo = _meta(vm_p + base[:, None], i_n[None, :] * HKV, kval)
    else:
        phys = tl.load(bt_p + kpos // BLOCK, mask=kval, other=0)
        kh = (phys.to(tl.int64) * BLOCK + kpos % BLOCK) * HKV
        b = tl.arange(0, D // 2)
        kc = tl.load(kc_p + kh[:, :, None] * (D // 2) + b[None, None, :])
        vc = tl.load(vc_p + kh[:, :, None] * (D // 2) + b[None, None, :])
        ks, ko = _meta(km_p, kh, kval)
        vs, vo = _meta(vm_p, kh, kval)
    klo, khi = _codes_f16(kc, False, True, USE_ASM)
    if DOT_F32:
        klo = klo.to(tl.float32)
        khi = khi.to(tl.float32)
    sc = tl.dot(khi, q_o, acc=tl.dot(klo, q_e, acc=bias))
    sc = sc * (ks * qk_scale)[:, :, None] + ko[:, :, None] * qsum[None, None, :]
    if MASKED:
        vis = (kpos[:, :, None] >= lo_r[None, None, :]) & (kpos[:, :, None] <= hi_r[None, None, :])
        sc = tl.where(vis, sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    pr = tl.exp2(sc - m_safe[:, None, :])
    l_i = l_i * alpha + tl.sum(pr, 1)
    acc_c = acc_c * alpha + tl.sum(pr * vo[:, :, None], 1)
    vlo, vhi = _codes_f16(vc, True, False, USE_ASM)
    pv = (pr * vs[:, :, None]).to(tl.float16)
    if DOT_F32:
        pv = pv.to(tl.float32)
        vlo = vlo.to(tl.float32)
        vhi = vhi.to(tl.float32)
    acc_e = tl.dot(tl.permute(vlo, (0, 2, 1)), pv, acc=acc_e * alpha[:, None, :])
    acc_o = tl.dot(tl.permute(vhi, (0, 2, 1)), pv, acc=acc_o * alpha[:, None, :])
    return m_new, l_i, acc_e, acc_o, acc_c


@jit
def _int4_attn_w_kernel(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, seq_ptr, cuq_ptr,
                        m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV, G, S, RT, bt_stride, window,
                        BLOCK: tl.constexpr, PART: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, W: tl.constexpr, D: tl.constexpr,
                        USE_ASM: tl.constexpr, DOT_F32: tl.constexpr, MASK_FREE: tl.constexpr,
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
                     mask=rvalid[None, :], other=0)
        q_e = (qw << 16).to(tl.float32, bitcast=True).to(tl.float16)
        q_o = ((qw & 0xFFFF0000).to(tl.float32, bitcast=True) * 0.0625).to(tl.float16)
        se = tl.sum(q_e.to(tl.float32), 0)
        so = tl.sum(q_o.to(tl.float32), 0)
        qsum = (se + 16.0 * so) * qk_scale
        bias = tl.zeros([W, BLOCK_N, BLOCK_M], tl.float32) - (1024.0 * (se + so))[None, None, :]
        if DOT_F32:
            q_e = q_e.to(tl.float32)
            q_o = q_o.to(tl.float32)
        q_e = tl.broadcast_to(q_e[None, :, :], (W, D // 2, BLOCK_M))
        q_o = tl.broadcast_to(q_o[None, :, :], (W, D // 2, BLOCK_M))
        m_i = tl.full([W, BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([W, BLOCK_M], tl.float32)
        acc_e = tl.zeros([W, D // 2, BLOCK_M], tl.float32)
        acc_o = tl.zeros([W, D // 2, BLOCK_M], tl.float32)
        acc_c = tl.zeros([W, BLOCK_M], tl.float32)
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
            n_mid = tl.where(window == 0, n_start + tl.maximum(hi_min + 1 - n_start, 0)
                             // (W * BLOCK_N) * (W * BLOCK_N), n_start)
        for n0 in range(n_start, n_mid, W * BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile_w(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, False, BLOCK, BLOCK_N,
                W, D, USE_ASM, DOT_F32)
        for n0 in range(n_mid, k_hi, W * BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile_w(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, True, BLOCK, BLOCK_N,
                W, D, USE_ASM, DOT_F32)
        pdl_release(PDL)
        # merge the W warps' states in a fixed order (the reduction over axis 0)
        m_all = tl.max(m_i, 0)
        f = tl.exp2(m_i - tl.where(m_all == float("-inf"), 0.0, m_all)[None, :])
        l_all = tl.sum(l_i * f, 0)
        c_all = tl.sum(acc_c * f, 0)
        e_all = tl.sum(acc_e * f[:, None, :], 0)
        o_all = tl.sum(acc_o * f[:, None, :], 0)
        tl.store(m_ptr + row * S + j, m_all, mask=rvalid)
        tl.store(l_ptr + row * S + j, l_all, mask=rvalid)
        ap = acc_ptr + (row * S + j)[None, :] * D + 2 * b[:, None]
        tl.store(ap, e_all + c_all[None, :], mask=rvalid[None, :])
        tl.store(ap + 1, o_all + c_all[None, :], mask=rvalid[None, :])


def _launch(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens, sm_scale,
            max_seq_len, max_q_len, window, part, interpret):
    total_q, hq, _ = q.shape
    blk, hkv = k_codes.shape[1], k_codes.shape[2]
    g = hq // hkv
    rows = rows_per_program(max_q_len, g)
    splits = num_splits(max_seq_len, max_q_len, window, part)
    rt = -(-max_q_len * g // rows)
    m, l, acc = partial_buffers(total_q, hq, splits, q.device)
    launch(_int4_attn_w_kernel, (block_tables.shape[0] * hkv * rt, splits), q, k_codes, v_codes,
           k_meta, v_meta, block_tables, seq_lens, cu_q_lens, m, l, acc,
           float(sm_scale) * LOG2E, hq, hkv, g, splits, rt, block_tables.stride(0), int(window),
           BLOCK=blk, PART=part, BLOCK_M=rows, BLOCK_N=BLOCK_N, W=W, D=HEAD_DIM,
           USE_ASM=USE_ASM and not interpret, DOT_F32=interpret, MASK_FREE=MASK_FREE,
           interpret=interpret, num_warps=W, num_stages=STAGES)
    return launch_attn_combine(m, l, acc, interpret).view(total_q, hq, HEAD_DIM)
