"""FROZEN COPY (bench only) of plugins/int4_paged_attention.py v4 (git 8d285f6: query rows as the
MMA's M, 16 per program), kept to time it next to v5 (query rows as the MMA's N) in
bench/int4_attn_t_tune.py; no op registration, no checks.

Paged attention over the rotated INT4 cache of the full-attention (NoPE) layers.

Decode (1 query token per stream) and verification (1 + k tokens, ragged) in one kernel. Keys and
values are read as 4-bit codes with a per-(token, head) fp16 scale and offset (x = c·s + o,
shared/spec/kv-cache.md); nothing is dequantized to memory:
    q·k_j = s_j·(q·c_j) + o_j·Σq          (the offset is one extra term per key)
    Σ_j p_j v_j = Σ_j (p_j s^v_j)·c^v_j + (Σ_j p_j o^v_j)·1
Split-KV: each program takes one partition of PART positions of one (stream, KV head, tile of 16
query rows = the GQA group's heads, so one decoded tile serves all of them); attn_combine merges
the partitions in a fixed order (batch invariant).

v4 (plugins/NOTES_HISTORY.md): the head dim is split by nibble, d = 2i (low nibble of byte i) and 2i+1
(high): q·c = q_even·c_lo + q_odd·c_hi and P·V = [P·v_lo, P·v_hi], so a [keys, 64] byte tile is
decoded in place (no join/reshape, 16-byte loads) into two [keys, 64] fp16 MMA operands. Key codes
keep their 1024 bias (fp16 0x64nn = 1024 + nn; the MMA accumulator starts at -1024·Σq); value codes
go through shared memory as fp16 (the P·V contraction runs across keys, not along the bytes).
"""

from __future__ import annotations

from kolibri_trt_plugins._common import jit, tl
from kolibri_trt_plugins._common import pdl_enter, pdl_release
from kolibri_trt_plugins._paged import launch_paged, softmax_step
from kolibri_trt_plugins.int4_paged_attention import _codes_f16, _meta  # unchanged in v5

PART = 512  # positions per split (fixed: the reduction order must not depend on the batch)
BLOCK_N = 32  # keys per inner step (H200 sweeps, plugins/NOTES.md)
USE_ASM = True  # PTX nibble decode on the GPU (False: the plain Triton decode, as in the interpreter)
K_IN_REGS = True  # decode K in the MMA operand registers (True) or in the load layout (False)
V_IN_REGS = False  # the same for V (True: byte gathers from shared memory; False: fp16 staging)
MASK_FREE = True  # tiles that every row sees fully skip the visibility mask (full causal only;
# same bits; H200 32k B=16 133.6 -> 131.7 µs, bench/results/h200-2026-11-30g/zk/)
# num_stages 5: two code buffers (2-4 compile to one, the page lookup takes a stage); one warp
# per program: the row max/sum stay in the warp (no barriers), more programs per SM. H200 32k
# (bench/int4_attn_tune.py, plugins/NOTES.md): B=16 187.4 µs (BLOCK_N 128, 4 warps, stages 3)
# -> 133.2 µs, B=1 21.2 -> 24.4 µs.
TUNE = dict(num_warps=1, num_stages=5)  # launch config (bench/plugins.py sweeps it)


@jit
def _tile(n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r, k_lo,
          k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, MASKED: tl.constexpr,
          BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
          K_IN_REGS: tl.constexpr, V_IN_REGS: tl.constexpr, DOT_F32: tl.constexpr):
    """One BLOCK_N-key tile of the online softmax: returns the updated (m, l, acc_e, acc_o,
    acc_c). MASKED=False: every key of the tile is visible to every row (no mask math)."""
    kpos = n0 + i_n
    kval = (kpos >= k_lo) & (kpos < k_hi)
    # code loads are not masked: a tile's rows lie in mapped pages (or page 0), and the codes of
    # invisible keys meet p = 0 and zeroed (masked) scale and offset.
    if BLOCK >= BLOCK_N:  # the whole tile lies in one page, which holds a visible key
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
    klo, khi = _codes_f16(kc, False, K_IN_REGS, USE_ASM)
    if DOT_F32:
        klo = klo.to(tl.float32)
        khi = khi.to(tl.float32)
    sc = tl.dot(q_o, tl.trans(khi), acc=tl.dot(q_e, tl.trans(klo), acc=bias))
    sc = sc * (ks * qk_scale)[None, :] + qsum[:, None] * ko[None, :]
    if MASKED:
        vis = (kpos[None, :] >= lo_r[:, None]) & (kpos[None, :] <= hi_r[:, None])
        sc = tl.where(vis, sc, float("-inf"))
    m_new, alpha, pr, l_i = softmax_step(sc, m_i, l_i)
    acc_c = acc_c * alpha + tl.sum(pr * vo[None, :], 1)
    vlo, vhi = _codes_f16(vc, True, V_IN_REGS, USE_ASM)
    pv = (pr * vs[None, :]).to(tl.float16)
    if DOT_F32:
        pv = pv.to(tl.float32)
        vlo = vlo.to(tl.float32)
        vhi = vhi.to(tl.float32)
    acc_e = tl.dot(pv, vlo, acc=acc_e * alpha[:, None])
    acc_o = tl.dot(pv, vhi, acc=acc_o * alpha[:, None])
    return m_new, l_i, acc_e, acc_o, acc_c


@jit
def _int4_attn_kernel(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, seq_ptr, cuq_ptr,
                      m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV, G, S, RT, bt_stride, window,
                      BLOCK: tl.constexpr, PART: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
                      K_IN_REGS: tl.constexpr, V_IN_REGS: tl.constexpr, DOT_F32: tl.constexpr,
                      MASK_FREE: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    j = tl.program_id(1)
    rt = pid % RT
    h = (pid // RT) % HKV
    s = pid // (RT * HKV)
    q_start = tl.load(cuq_ptr + s)
    q_len = tl.load(cuq_ptr + s + 1) - q_start
    seq_len = tl.load(seq_ptr + s)  # issued with the cu_q_lens loads (one latency less)
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
        # visible keys of each row: lo_r <= key <= hi_r (causal, window, this partition)
        hi_r = tl.where(rvalid, tl.minimum(pos, k_hi - 1), -1)
        lo_r = tl.maximum(tl.where(window > 0, pos - window + 1, 0), k_lo)
        # d = 2i + e is split by parity e (the nibble it lives in): q·k = q_e·c_lo + q_o·c_hi
        b = tl.arange(0, D // 2)
        qw = tl.load(q_ptr.to(tl.pointer_type(tl.uint32)) + row[:, None] * (D // 2) + b[None, :],
                     mask=rvalid[:, None], other=0)  # bf16 pairs (q_2i, q_2i+1)
        q_e = (qw << 16).to(tl.float32, bitcast=True).to(tl.float16)
        q_o = ((qw & 0xFFFF0000).to(tl.float32, bitcast=True) * 0.0625).to(tl.float16)
        se = tl.sum(q_e.to(tl.float32), 1)
        so = tl.sum(q_o.to(tl.float32), 1)
        qsum = (se + 16.0 * so) * qk_scale  # Σq as the dot sees it (log2 units)
        # key codes come as 1024 + c (low) and 1024 + 16·c (high, against q_o = q_odd/16): the
        # accumulator starts at -1024·Σ(q_e + q_o) (the cancellation costs ~10 of fp32's 24 bits)
        bias = tl.zeros([BLOCK_M, BLOCK_N], tl.float32) - (1024.0 * (se + so))[:, None]
        if DOT_F32:
            q_e = q_e.to(tl.float32)
            q_o = q_o.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc_e = tl.zeros([BLOCK_M, D // 2], tl.float32)
        acc_o = tl.zeros([BLOCK_M, D // 2], tl.float32)
        acc_c = tl.zeros([BLOCK_M], tl.float32)
        i_n = tl.arange(0, BLOCK_N)
        offs = (i_n * HKV)[:, None] * (D // 2) + b[None, :]  # a page's keys: stride HKV rows
        kc_p = kc_ptr + h * (D // 2)
        vc_p = vc_ptr + h * (D // 2)
        km_p = km_ptr.to(tl.pointer_type(tl.uint32)) + h
        vm_p = vm_ptr.to(tl.pointer_type(tl.uint32)) + h
        bt_p = bt_ptr + s * bt_stride
        n_start = (k_lo // BLOCK_N) * BLOCK_N
        # tiles whose keys every valid row sees (full causal: from k_lo, which is tile-aligned, to
        # the lowest row's last key) run without the visibility mask; the rest with it
        hi_min = tl.min(tl.where(rvalid, hi_r, k_hi), 0)
        n_mid = n_start
        if MASK_FREE:
            n_mid = tl.where(window == 0, tl.maximum(n_start, ((hi_min + 1) // BLOCK_N) * BLOCK_N),
                             n_start)
        for n0 in range(n_start, n_mid, BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, False, BLOCK, BLOCK_N,
                D, USE_ASM, K_IN_REGS, V_IN_REGS, DOT_F32)
        for n0 in range(n_mid, k_hi, BLOCK_N):
            m_i, l_i, acc_e, acc_o, acc_c = _tile(
                n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
                k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, HKV, True, BLOCK, BLOCK_N,
                D, USE_ASM, K_IN_REGS, V_IN_REGS, DOT_F32)
        pdl_release(PDL)      # the next kernel may launch now (PDL 2)
        tl.store(m_ptr + row * S + j, m_i, mask=rvalid)
        tl.store(l_ptr + row * S + j, l_i, mask=rvalid)
        ap = acc_ptr + (row * S + j)[:, None] * D + 2 * b[None, :]
        tl.store(ap, acc_e + acc_c[:, None], mask=rvalid[:, None])
        tl.store(ap + 1, acc_o + acc_c[:, None], mask=rvalid[:, None])


def _launch(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens, sm_scale,
            max_seq_len, max_q_len, window, part, interpret):
    return launch_paged(_int4_attn_kernel, q, (k_codes, v_codes, k_meta, v_meta), block_tables,
                        seq_lens, cu_q_lens, sm_scale, max_seq_len, max_q_len, window, part,
                        interpret, BLOCK_N, TUNE, USE_ASM=USE_ASM and not interpret,
                        K_IN_REGS=K_IN_REGS, V_IN_REGS=V_IN_REGS, MASK_FREE=MASK_FREE)
