"""FROZEN COPY (bench only) of plugins/int4_paged_attention.py v3 (git 5e805d8), kept to time the
old kernel next to the new one (bench/int4_attn_tune.py); no op registration, no checks.

Paged attention over the rotated INT4 cache of the full-attention (NoPE) layers.

Decode (1 query token per stream) and verification (1 + k tokens, ragged) in one kernel. Keys and
values are read as 4-bit codes with a per-(token, head) fp16 scale and offset (x = c·s + o,
shared/spec/kv-cache.md); nothing is dequantized to memory:
    q·k_j = s_j·(q·c_j) + o_j·Σq          (the offset is one extra term per key)
    Σ_j p_j v_j = Σ_j (p_j s^v_j)·c^v_j + (Σ_j p_j o^v_j)·1
Split-KV: each program takes one partition of PART positions of one (stream, KV head, tile of 16
query rows); attn_combine merges the partitions in a fixed order (batch invariant).
"""

from __future__ import annotations


from kolibri_trt_plugins._common import jit, tl
from kolibri_trt_plugins._paged import launch_paged

PART = 512  # positions per split (fixed: the reduction order must not depend on the batch)
BLOCK_N = 128  # keys per inner step (H200 sweep, plugins/NOTES.md)
USE_ASM = True  # PTX nibble decode on the GPU (False: the plain Triton decode, as in the interpreter)
TUNE = dict(num_warps=4, num_stages=3)  # launch config (bench/plugins.py sweeps it)


@jit
def _nibbles_f16(c):
    """uint8 nibble values (0..15) -> exact fp16 via the 1024 + n bit pattern (no int->float cvt)."""
    return (c.to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True) - 1024.0


@jit
def _codes_f16(c, USE_ASM: tl.constexpr):
    """uint8 packed codes -> (low nibbles, high nibbles) as exact fp16 values 0..15.

    GPU: inline PTX on four bytes at a time: prmt builds (0x64, byte) fp16 pairs = 1024 + byte,
    lop3 masks one nibble, and one f16x2 sub / fma removes the 1024 (and the ×16 of the high
    nibble) exactly: ~1.3 instructions per code instead of an int->float conversion each."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 k, p, c0, c1, c2; mov.b32 k, 0x64; mov.b32 c0, 0x64006400; "
            "mov.b32 c1, 0x2C002C00; mov.b32 c2, 0xD400D400; "
            "prmt.b32 p, $4, k, 0x4140; and.b32 $0, p, 0xFF0FFF0F; sub.rn.f16x2 $0, $0, c0; "
            "and.b32 $2, p, 0xFFF0FFF0; fma.rn.f16x2 $2, $2, c1, c2; "
            "prmt.b32 p, $4, k, 0x4342; and.b32 $1, p, 0xFF0FFF0F; sub.rn.f16x2 $1, $1, c0; "
            "and.b32 $3, p, 0xFFF0FFF0; fma.rn.f16x2 $3, $3, c1, c2; }",
            "=r,=r,=r,=r,r", [c], dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        lo = _nibbles_f16(c & 15)
        hi = _nibbles_f16(c >> 4)
    return lo, hi


@jit
def _int4_attn_kernel(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, seq_ptr, cuq_ptr,
                      m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV, G, S, RT, bt_stride, window,
                      BLOCK: tl.constexpr, PART: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
                      DOT_F32: tl.constexpr):
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
        row = ((q_start + tq) * HQ + h * G + r % G).to(tl.int64)
        d = tl.arange(0, D)
        lo_u = tl.where(window > 0, tl.maximum(seq_len - q_len - window + 1, 0), 0)
        p = lo_u // PART + j
        k_lo = tl.maximum(p * PART, lo_u)
        k_hi = tl.minimum((p + 1) * PART, seq_len)
        q = tl.load(q_ptr + row[:, None] * D + d[None, :], mask=rvalid[:, None], other=0.0)
        q = q.to(tl.float16)  # codes are exact in fp16; bf16 -> fp16 keeps every q bit
        qsum = tl.sum(q.to(tl.float32), 1)
        if DOT_F32:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        acc_o = tl.zeros([BLOCK_M], tl.float32)
        b = tl.arange(0, D // 2)
        two = tl.arange(0, 2)
        for n0 in range((k_lo // BLOCK_N) * BLOCK_N, k_hi, BLOCK_N):
            kpos = n0 + tl.arange(0, BLOCK_N)
            kval = (kpos >= k_lo) & (kpos < k_hi)
            if BLOCK >= BLOCK_N:  # the whole tile lies in one page, which holds a visible key
                phys = tl.load(bt_ptr + s * bt_stride + n0 // BLOCK).to(tl.int64)
                kh = (phys * BLOCK + n0 % BLOCK + tl.arange(0, BLOCK_N)) * HKV + h
            else:
                phys = tl.load(bt_ptr + s * bt_stride + kpos // BLOCK, mask=kval, other=0)
                kh = (phys.to(tl.int64) * BLOCK + kpos % BLOCK) * HKV + h
            kc = tl.load(kc_ptr + kh[:, None] * (D // 2) + b[None, :], mask=kval[:, None], other=0)
            kmeta = tl.load(km_ptr + kh[:, None] * 2 + two[None, :], mask=kval[:, None], other=0.0)
            ks, ko = tl.split(kmeta.to(tl.float32))
            klo, khi = _codes_f16(kc, USE_ASM)
            kcf = tl.reshape(tl.join(klo, khi), (BLOCK_N, D))
            if DOT_F32:
                kcf = kcf.to(tl.float32)
            sc = tl.dot(q, tl.trans(kcf))
            sc = (sc * ks[None, :] + qsum[:, None] * ko[None, :]) * qk_scale
            vis = rvalid[:, None] & kval[None, :] & (kpos[None, :] <= pos[:, None])
            vis = vis & ((window <= 0) | (kpos[None, :] > pos[:, None] - window))
            sc = tl.where(vis, sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            pr = tl.exp2(sc - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(pr, 1)
            vc = tl.load(vc_ptr + kh[:, None] * (D // 2) + b[None, :], mask=kval[:, None], other=0)
            vmeta = tl.load(vm_ptr + kh[:, None] * 2 + two[None, :], mask=kval[:, None], other=0.0)
            vs, vo = tl.split(vmeta.to(tl.float32))
            vlo, vhi = _codes_f16(vc, USE_ASM)
            vcf = tl.reshape(tl.join(vlo, vhi), (BLOCK_N, D))
            pv = (pr * vs[None, :]).to(tl.float16)
            if DOT_F32:
                pv_dot = tl.dot(pv.to(tl.float32), vcf.to(tl.float32))
            else:
                pv_dot = tl.dot(pv, vcf)
            acc = acc * alpha[:, None] + pv_dot
            acc_o = acc_o * alpha + tl.sum(pr * vo[None, :], 1)
            m_i = m_new
        acc = acc + acc_o[:, None]
        tl.store(m_ptr + row * S + j, m_i, mask=rvalid)
        tl.store(l_ptr + row * S + j, l_i, mask=rvalid)
        tl.store(acc_ptr + (row * S + j)[:, None] * D + d[None, :], acc, mask=rvalid[:, None])


def _launch(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens, sm_scale,
            max_seq_len, max_q_len, window, part, interpret):
    return launch_paged(_int4_attn_kernel, q, (k_codes, v_codes, k_meta, v_meta), block_tables,
                        seq_lens, cu_q_lens, sm_scale, max_seq_len, max_q_len, window, part,
                        interpret, BLOCK_N, TUNE, USE_ASM=USE_ASM and not interpret)
