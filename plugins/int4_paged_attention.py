"""Paged attention over the rotated INT4 cache of the full-attention (NoPE) layers.

Decode (1 query token per stream) and verification (1 + k tokens, ragged) in one kernel. Keys and
values are read as 4-bit codes with a per-(token, head) fp16 scale and offset (x = c·s + o,
shared/spec/kv-cache.md); nothing is dequantized to memory:
    q·k_j = s_j·(q·c_j) + o_j·Σq          (the offset is one extra term per key)
    Σ_j p_j v_j = Σ_j (p_j s^v_j)·c^v_j + (Σ_j p_j o^v_j)·1
Split-KV: each program takes one partition of PART positions of one (stream, KV head, tile of
BLOCK_M query rows = the GQA group's heads, so one decoded tile serves all of them); attn_combine
merges the partitions in a fixed order (batch invariant).

v5: the query rows are the MMA's N dimension, keys and head dims its M: S^T = K·Q^T and
O^T = V^T·P^T. An m16n8k16 MMA tiles N by 8, so decode (GQA 5: 5 rows) takes 8 columns where v4
(rows as M) took 16: half the MMAs, half the fp32 accumulators ([64, 8] per nibble half instead
of [16, 64]) and half the exp2s per key. Each column's sums (over d for S, over keys in 16-key
MMA steps for O) run in the same order whatever BLOCK_M, and as v4's rows did: the outputs are
bit-identical to v4's (H200, bench/results/h200-2026-11-30m/mt/). v4: plugins/NOTES_HISTORY.md.

The head dim is split by nibble, d = 2i (low nibble of byte i) and 2i+1 (high):
q·c = q_even·c_lo + q_odd·c_hi and P·V = [P·v_lo, P·v_hi], so a [keys, 64] byte tile is decoded
in place (no join/reshape, 16-byte loads) into two [keys, 64] fp16 MMA operands. Key codes keep
their 1024 bias (fp16 0x64nn = 1024 + nn; the MMA accumulator starts at -1024·Σq). Value pages
are dim-major, [64 bytes, BLOCK keys] per (page, head): a [64, BLOCK_N] byte tile is V^T, the A
operand of O^T = V^T·P^T, whose register pairs hold consecutive keys; it is decoded in the
operand registers like the keys (before 2026-12-01 token-major value pages were decoded, then
transposed as fp16 through shared memory; H200 32k B=16 105.1 -> 99.2 µs, B=64 391.6 -> 359.1,
4 tokens at B=16 258.9 -> 239.6: bench/results/h200-2026-12-01a/nh/).
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, tl
from ._common import pdl_enter, pdl_release
from ._paged import (HEAD_DIM, check_common, default_sm_scale, launch_paged,
                     paged_attention_dense_ref, softmax_step_cols)
from .qk_norm_fold_int4 import dequantize_int4_ref, int4_rows, int4_value_codes

PART = 512  # positions per split (fixed: the reduction order must not depend on the batch)
BLOCK_N = 32  # keys per inner step (H200 sweeps, plugins/NOTES.md; it sets the bits)
ROWS_DECODE, ROWS_MAX = 8, 16  # query rows per program: 8 when max_q_len·G fits, else 16
USE_ASM = True  # PTX nibble decode on the GPU (False: the plain Triton decode, as in the interpreter)
MASK_FREE = True  # tiles that every row sees fully skip the visibility mask (full causal only;
# same bits; H200 32k B=16 133.6 -> 131.7 µs, bench/results/h200-2026-11-30g/zk/)
# num_stages 5: two code buffers (2-4 compile to one, the page lookup takes a stage); one warp
# per program: the column max/sum stay in the warp (no barriers), more programs per SM.
DEFER_SUMS = True  # the column sums of p and p·offset: False per tile (shuffles in every tile's
# chain); True per key group [8, rows] (a thread's keys of the MMA's output summed in registers),
# reduced over keys once per program (new bits; a row's bits still do not depend on 8- or 16-row
# programs). H200 32k, False -> True: decode B = 1 / 4 / 16 / 64 20.6 / 33.5 / 110.0 / 416.8 ->
# 20.0 / 32.0 / 105.2 / 390.8 µs, 4 tokens at B=16 266.1 -> 260.0 (bench/results/
# h200-2026-12-01a/ne/). Per-key sums [BLOCK_N, rows] (removed) spilled in 16-row programs.
# Pages shorter than BLOCK_N: keys loaded per page piece, as the values (`_load_tile`; same
# bytes, same bits); False: per key. AOT sm_90 at 16-token pages (`python3 bench/aot_sass.py
# int4_attn --warps 1 --stages 5 --set BLOCK=16 --set K_PIECES=1|0`), instructions per tile,
# mask-free / masked: 646 / 675 against 684 / 697; 16-row programs 887 / 951 against 920 / 972.
# H100, 16-token pages: 0-3 % faster at 9 of 12 sizes (32k B=4 36.7 -> 36.3 µs, h100-2026-12-07e/).
K_PIECES = True
TUNE = dict(num_warps=1, num_stages=5)  # launch config (bench/plugins.py sweeps it)
TUNE_DECODE = dict(TUNE)  # the same for ROWS_DECODE-row programs (registers do not set the bits)


@jit
def _codes_f16(c, EXACT: tl.constexpr, PURE: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 packed codes [N, 64] -> (low, high nibbles) as fp16 [N, 64], no int->float cvt.

    The fp16 bit pattern 0x64nn is 1024 + nn. EXACT=False returns 1024 + lo and 1024 + 16·hi (one
    prmt per 2 bytes + one lop3 per 2 codes: 0.75 instructions per code); the caller removes the
    bias (for keys: the MMA accumulator starts at -1024·Σq). EXACT=True returns lo and hi (one
    more f16x2 sub / fma per 2 codes). PURE=False keeps Triton from moving the decode past the
    layout conversion: it runs in the 16-byte load layout and the fp16 tile reaches the MMA through
    shared memory (ldmatrix); PURE=True lets it decode the staged bytes in the MMA operand
    registers (less shared-memory traffic; operand kWidth 4, the other operand gets shuffled)."""
    if USE_ASM and EXACT:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 k, p, c0, c1, c2; mov.b32 k, 0x64; mov.b32 c0, 0x64006400; "
            "mov.b32 c1, 0x2C002C00; mov.b32 c2, 0xD400D400; "
            "prmt.b32 p, $4, k, 0x4140; and.b32 $0, p, 0xFF0FFF0F; sub.rn.f16x2 $0, $0, c0; "
            "and.b32 $2, p, 0xFFF0FFF0; fma.rn.f16x2 $2, $2, c1, c2; "
            "prmt.b32 p, $4, k, 0x4342; and.b32 $1, p, 0xFF0FFF0F; sub.rn.f16x2 $1, $1, c0; "
            "and.b32 $3, p, 0xFFF0FFF0; fma.rn.f16x2 $3, $3, c1, c2; }",
            "=r,=r,=r,=r,r", [c], dtype=(tl.float16, tl.float16), is_pure=PURE, pack=4)
    elif USE_ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 k, p; mov.b32 k, 0x64; "
            "prmt.b32 p, $4, k, 0x4140; and.b32 $0, p, 0xFF0FFF0F; and.b32 $2, p, 0xFFF0FFF0; "
            "prmt.b32 p, $4, k, 0x4342; and.b32 $1, p, 0xFF0FFF0F; and.b32 $3, p, 0xFFF0FFF0; }",
            "=r,=r,=r,=r,r", [c], dtype=(tl.float16, tl.float16), is_pure=PURE, pack=4)
    else:
        c16 = c.to(tl.uint16)
        lo = ((c16 & 15) | 0x6400).to(tl.float16, bitcast=True)
        hi = ((c16 & 0xF0) | 0x6400).to(tl.float16, bitcast=True)
        if EXACT:
            lo = lo - 1024.0
            hi = hi * 0.0625 - 64.0
    return lo, hi


@jit
def _meta(m_ptr, off, mask):
    """(scale, offset) fp32 of the keys at uint32 pointer m_ptr + off: one 4-byte load per key
    (masked keys read as 0, 0)."""
    w = tl.load(m_ptr + off, mask=mask, other=0)
    s = (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    o = (w >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return s, o


@jit
def _load_tile(n0, k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, KS, PAGE,
               BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
               K_PIECES: tl.constexpr):
    """The tile at n0: key codes uint8 [BLOCK_N, D/2], value codes V^T uint8 [D/2, BLOCK_N]
    (dim-major pages) and the keys' and values' (scale, offset) fp32 [BLOCK_N] each. Code loads
    are not masked: a tile's rows lie in mapped pages (or page 0), and the codes of invisible keys
    meet p = 0 and zeroed (masked) scale and offset."""
    kpos = n0 + i_n
    kval = (kpos >= k_lo) & (kpos < k_hi)
    b = tl.arange(0, D // 2)
    if BLOCK >= BLOCK_N:  # the whole tile lies in one page, which holds a visible key
        phys = tl.load(bt_p + n0 // BLOCK).to(tl.int64)
        base = phys * PAGE + (n0 % BLOCK) * KS
        kc = tl.load(kc_p + base * (D // 2) + offs)
        slot0 = tl.multiple_of(n0 % BLOCK, BLOCK_N)
        vc = tl.load(vc_p + phys * PAGE * (D // 2) + b[:, None] * BLOCK + (slot0 + i_n)[None, :])
        ks, ko = _meta(km_p + base, i_n * KS, kval)
        vs, vo = _meta(vm_p + base, i_n * KS, kval)
    else:
        # BLOCK_N / BLOCK page pieces, one address per page: values as [D/2, pieces, BLOCK]
        # (16-byte rows; per-key addresses made 64 byte loads, 2x slower: h200-2026-12-01a/ni/),
        # keys (K_PIECES) as [pieces, BLOCK, D/2]; each viewed as the [.., BLOCK_N] tile.
        sub = tl.arange(0, BLOCK_N // BLOCK)
        pg = tl.load(bt_p + n0 // BLOCK + sub, mask=n0 + sub * BLOCK < k_hi, other=0)
        o = tl.arange(0, BLOCK)
        pk = tl.multiple_of(pg.to(tl.int64) * PAGE, BLOCK)
        kb = tl.multiple_of(pk * (D // 2), BLOCK * (D // 2))
        if K_PIECES:
            kh = tl.reshape(pk[:, None] + o[None, :], (BLOCK_N,))
            kc = tl.load(kc_p + kb[:, None, None] + (o * (D // 2))[None, :, None]
                         + b[None, None, :])
            kc = tl.reshape(kc, (BLOCK_N, D // 2))
        else:
            phys = tl.load(bt_p + kpos // BLOCK, mask=kval, other=0)
            kh = phys.to(tl.int64) * PAGE + (kpos % BLOCK) * KS
            kc = tl.load(kc_p + kh[:, None] * (D // 2) + b[None, :])
        vc = tl.load(vc_p + kb[None, :, None] + (b * BLOCK)[:, None, None] + o[None, None, :])
        vc = tl.reshape(vc, (D // 2, BLOCK_N))
        ks, ko = _meta(km_p, kh, kval)
        vs, vo = _meta(vm_p, kh, kval)
    return kc, vc, ks, ko, vs, vo


@jit
def _softmax_cols(sc, vo, m_i, l_i, acc_c, BLOCK_N: tl.constexpr, DEFER_SUMS: tl.constexpr):
    """Online-softmax step over the columns of sc [BLOCK_N keys, rows] (log2 units, -inf:
    masked): returns (m_new, alpha, p [BLOCK_N, rows], l, acc_c), acc_c += Σ p·offset.
    DEFER_SUMS False: l, acc_c [rows], summed over keys here (shuffles in every tile's chain);
    True: [8, rows] per group of keys k + 8·i (one thread's rows of the MMA's output layout,
    summed in registers), the sum over keys left to the caller, once per program."""
    if DEFER_SUMS:
        m_new = tl.maximum(m_i, tl.max(sc, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        pr = tl.exp2(sc - m_safe[None, :])
        l_i = l_i * alpha[None, :] + tl.sum(tl.reshape(pr, (BLOCK_N // 8, 8, pr.shape[1])), 0)
        pc = pr * vo[:, None]
        acc_c = acc_c * alpha[None, :] + tl.sum(tl.reshape(pc, (BLOCK_N // 8, 8, pc.shape[1])), 0)
    else:
        m_new, alpha, pr, l_i = softmax_step_cols(sc, m_i, l_i)
        acc_c = acc_c * alpha + tl.sum(pr * vo[:, None], 0)
    return m_new, alpha, pr, l_i, acc_c


@jit
def _tile(n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r, k_lo,
          k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, KS, PAGE, MASKED: tl.constexpr,
          BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
          DOT_F32: tl.constexpr, DEFER_SUMS: tl.constexpr, K_PIECES: tl.constexpr):
    """One BLOCK_N-key tile of the online softmax, transposed: scores sc [BLOCK_N keys, BLOCK_M
    rows], acc_e/acc_o [D/2, BLOCK_M]; returns the updated (m, l, acc_e, acc_o, acc_c) (l and
    acc_c as `_softmax_cols` keeps them). MASKED=False: every key of the tile is visible to
    every row (no mask math)."""
    kc, vc, ks, ko, vs, vo = _load_tile(n0, k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p,
                                        KS, PAGE, BLOCK, BLOCK_N, D, K_PIECES)
    klo, khi = _codes_f16(kc, False, True, USE_ASM)
    if DOT_F32:
        klo = klo.to(tl.float32)
        khi = khi.to(tl.float32)
    sc = tl.dot(khi, q_o, acc=tl.dot(klo, q_e, acc=bias))
    sc = sc * (ks * qk_scale)[:, None] + ko[:, None] * qsum[None, :]
    if MASKED:
        kpos = n0 + i_n
        vis = (kpos[:, None] >= lo_r[None, :]) & (kpos[:, None] <= hi_r[None, :])
        sc = tl.where(vis, sc, float("-inf"))
    m_new, alpha, pr, l_i, acc_c = _softmax_cols(sc, vo, m_i, l_i, acc_c, BLOCK_N, DEFER_SUMS)
    vlo, vhi = _codes_f16(vc, True, True, USE_ASM)   # V^T [D/2, BLOCK_N]: the A operand
    pv = (pr * vs[:, None]).to(tl.float16)
    if DOT_F32:
        pv = pv.to(tl.float32)
        vlo = vlo.to(tl.float32)
        vhi = vhi.to(tl.float32)
    acc_e = tl.dot(vlo, pv, acc=acc_e * alpha[None, :])
    acc_o = tl.dot(vhi, pv, acc=acc_o * alpha[None, :])
    return m_new, l_i, acc_e, acc_o, acc_c


@jit
def _rows(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV,
          G, S, bt_stride, window, s, h, j, r0, q_start, q_len, seq_len, BLOCK: tl.constexpr,
          PART: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
          USE_ASM: tl.constexpr, DOT_F32: tl.constexpr, MASK_FREE: tl.constexpr,
          DEFER_SUMS: tl.constexpr, K_PIECES: tl.constexpr, PDL: tl.constexpr):
    """Query rows r0 .. r0 + ROWS - 1 (token x group head) of stream s, KV head h, over split j:
    the online softmax over the split's keys, then its partial m, l and acc (attn_combine)."""
    r = r0 + tl.arange(0, ROWS)
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
                 mask=rvalid[None, :], other=0)  # [D/2, ROWS] bf16 pairs
    q_e = (qw << 16).to(tl.float32, bitcast=True).to(tl.float16)
    q_o = ((qw & 0xFFFF0000).to(tl.float32, bitcast=True) * 0.0625).to(tl.float16)
    se = tl.sum(q_e.to(tl.float32), 0)
    so = tl.sum(q_o.to(tl.float32), 0)
    qsum = (se + 16.0 * so) * qk_scale
    bias = tl.zeros([BLOCK_N, ROWS], tl.float32) - (1024.0 * (se + so))[None, :]
    if DOT_F32:
        q_e = q_e.to(tl.float32)
        q_o = q_o.to(tl.float32)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    if DEFER_SUMS:
        l_i = tl.zeros([8, ROWS], tl.float32)
        acc_c = tl.zeros([8, ROWS], tl.float32)
    else:
        l_i = tl.zeros([ROWS], tl.float32)
        acc_c = tl.zeros([ROWS], tl.float32)
    acc_e = tl.zeros([D // 2, ROWS], tl.float32)
    acc_o = tl.zeros([D // 2, ROWS], tl.float32)
    i_n = tl.arange(0, BLOCK_N)
    # head-major pages: a key's row is page · BLOCK·Hkv + head · BLOCK + slot (the stride of
    # consecutive keys KS = 1; token-major pages had KS = Hkv: 64-byte reads 256 bytes apart;
    # H200 32k B = 16 / 64 117.3 / 450.6 -> 109.8 / 411.1 µs, bench/results/h200-2026-11-30m/my/)
    KS = 1
    PAGE = BLOCK * HKV
    offs = (i_n * KS)[:, None] * (D // 2) + b[None, :]
    kc_p = kc_ptr + h * BLOCK * (D // 2)
    vc_p = vc_ptr + h * BLOCK * (D // 2)
    km_p = km_ptr.to(tl.pointer_type(tl.uint32)) + h * BLOCK
    vm_p = vm_ptr.to(tl.pointer_type(tl.uint32)) + h * BLOCK
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
            BLOCK_N, D, USE_ASM, DOT_F32, DEFER_SUMS, K_PIECES)
    for n0 in range(n_mid, k_hi, BLOCK_N):
        m_i, l_i, acc_e, acc_o, acc_c = _tile(
            n0, m_i, l_i, acc_e, acc_o, acc_c, q_e, q_o, bias, qsum, qk_scale, lo_r, hi_r,
            k_lo, k_hi, i_n, offs, kc_p, vc_p, km_p, vm_p, bt_p, KS, PAGE, True, BLOCK,
            BLOCK_N, D, USE_ASM, DOT_F32, DEFER_SUMS, K_PIECES)
    if DEFER_SUMS:
        l_i = tl.sum(l_i, 0)
        acc_c = tl.sum(acc_c, 0)
    pdl_release(PDL)
    tl.store(m_ptr + row * S + j, m_i, mask=rvalid)
    tl.store(l_ptr + row * S + j, l_i, mask=rvalid)
    ap = acc_ptr + (row * S + j)[None, :] * D + 2 * b[:, None]
    tl.store(ap, acc_e + acc_c[None, :], mask=rvalid[None, :])
    tl.store(ap + 1, acc_o + acc_c[None, :], mask=rvalid[None, :])


@jit
def _int4_attn_kernel(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, seq_ptr, cuq_ptr,
                      m_ptr, l_ptr, acc_ptr, qk_scale, HQ, HKV, G, S, RT, bt_stride, window,
                      BLOCK: tl.constexpr, PART: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, D: tl.constexpr, USE_ASM: tl.constexpr,
                      DOT_F32: tl.constexpr, MASK_FREE: tl.constexpr, DEFER_SUMS: tl.constexpr,
                      K_PIECES: tl.constexpr = True, PDL: tl.constexpr = 0):
    """Grid (streams x Hkv x row tiles of BLOCK_M, splits): one `_rows` call per program."""
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
        _rows(q_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr, bt_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, HQ,
              HKV, G, S, bt_stride, window, s, h, j, rt * BLOCK_M, q_start, q_len, seq_len,
              BLOCK, PART, BLOCK_M, BLOCK_N, D, USE_ASM, DOT_F32, MASK_FREE, DEFER_SUMS,
              K_PIECES, PDL)


def int4_paged_attention_ref(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens,
                             cu_q_lens, sm_scale, window=0):
    """fp32 torch reference of :func:`int4_paged_attention` (dequantize, then dense attention)."""
    hkv, blk = k_codes.shape[1], k_codes.shape[2]

    def gather(slots):
        rows = int4_rows(slots, hkv, blk)
        kc = k_codes.view(-1, HEAD_DIM // 2)[rows]
        vc = int4_value_codes(v_codes, slots)
        km, vm = (m.view(-1, 2)[rows] for m in (k_meta, v_meta))
        return dequantize_int4_ref(kc, km), dequantize_int4_ref(vc, vm)

    return paged_attention_dense_ref(q, block_tables, seq_lens, cu_q_lens, blk, gather, sm_scale,
                                     window)


@torch.library.custom_op(f"{NAMESPACE}::int4_paged_attention", mutates_args=())
def _int4_attn_op(q: torch.Tensor, k_codes: torch.Tensor, v_codes: torch.Tensor,
                  k_meta: torch.Tensor, v_meta: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, cu_q_lens: torch.Tensor, sm_scale: float,
                  max_seq_len: int, max_q_len: int, window: int, part: int) -> torch.Tensor:
    if kernel_path(q, "int4_paged_attention") == "ref":
        return int4_paged_attention_ref(q, k_codes, v_codes, k_meta, v_meta, block_tables,
                                        seq_lens, cu_q_lens, sm_scale, window)
    return _launch(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens,
                   sm_scale, max_seq_len, max_q_len, window, part, False)


@_int4_attn_op.register_fake
def _(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens, sm_scale,
      max_seq_len, max_q_len, window, part):
    return torch.empty_like(q)


def rows_per_program(max_q_len: int, group: int) -> int:
    """Query rows per program (the MMA's N): ROWS_DECODE when max_q_len · group fits, else
    ROWS_MAX (more row tiles). A row's bits do not depend on it (see the module docstring)."""
    return ROWS_DECODE if max_q_len * group <= ROWS_DECODE else ROWS_MAX


def _launch(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens, sm_scale,
            max_seq_len, max_q_len, window, part, interpret):
    rows = rows_per_program(max_q_len, q.shape[1] // k_codes.shape[1])
    return launch_paged(_int4_attn_kernel, q, (k_codes, v_codes, k_meta, v_meta), block_tables,
                        seq_lens, cu_q_lens, sm_scale, max_seq_len, max_q_len, window, part,
                        interpret, BLOCK_N, TUNE_DECODE if rows == ROWS_DECODE else TUNE,
                        block_m=rows, head_major=True, USE_ASM=USE_ASM and not interpret,
                        MASK_FREE=MASK_FREE, DEFER_SUMS=DEFER_SUMS, K_PIECES=K_PIECES)


def int4_paged_attention(q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens,
                         max_seq_len: int, max_q_len: int, sm_scale: float | None = None,
                         window: int = 0, part: int | None = None, interpret: bool = False):
    """Causal paged attention (decode or verification) over the rotated INT4 cache.

    Args:
        q: bf16 [total_q, Hq, 128], already M_q·rms(q) (see qk_norm_fold_int4), contiguous.
        k_codes: uint8 [num_blocks, Hkv, BLOCK, 64] (head-major pages); BLOCK in
            (16, 32, 64, 128).
        v_codes: uint8 [num_blocks, Hkv, 64, BLOCK] (head-major, dim-major pages).
        k_meta, v_meta: fp16 [num_blocks, Hkv, BLOCK, 2] = (scale, offset).
        block_tables: int32 [num_seqs, max_blocks_per_seq]; seq_lens: int32 [num_seqs] (positions
            in the cache, new tokens included); cu_q_lens: int32 [num_seqs + 1].
        max_seq_len, max_q_len: host ints bounding seq_lens and the per-stream query counts (they
            size the grid; fix them per CUDA graph).
        sm_scale: softmax scale (None = 1/sqrt(128); pass 1.0 when M_q already holds it).
        window: 0 = full causal (these layers); > 0 keeps keys j with i - window < j <= i.
        part: positions per split (a multiple of BLOCK_N; None = module PART). Keep it fixed: it
            sets the reduction order.
        interpret: run the Triton kernels in the interpreter on CPU tensors (tests only).
    Returns: bf16 [total_q, Hq, 128].
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kv-cache.md (INT4 format), kolibri-1.md (GQA, masks), seed 002.
    """
    hkv = k_codes.shape[1] if k_codes.dim() == 4 else 1
    check_tensor("k_codes", k_codes, torch.uint8, (None, None, None, HEAD_DIM // 2), q.device)
    nb, blk = k_codes.shape[0], k_codes.shape[2]
    part = PART if part is None else part
    check_common(q, block_tables, seq_lens, cu_q_lens, hkv, blk, max_seq_len, max_q_len, window,
                 part, BLOCK_N)
    check_tensor("v_codes", v_codes, torch.uint8, (nb, hkv, HEAD_DIM // 2, blk), q.device)
    check_tensor("k_meta", k_meta, torch.float16, (nb, hkv, blk, 2), q.device)
    check_tensor("v_meta", v_meta, torch.float16, (nb, hkv, blk, 2), q.device)
    sm_scale = default_sm_scale() if sm_scale is None else float(sm_scale)
    args = (q, k_codes, v_codes, k_meta, v_meta, block_tables, seq_lens, cu_q_lens, sm_scale,
            int(max_seq_len), int(max_q_len), int(window), int(part))
    if interpret:
        return _launch(*args, True)
    return torch.ops.kolibri_plugins.int4_paged_attention(*args)
