"""gpu_check sections fold, int4, fp8attn, int4_noasm: the QK-norm + INT4 fold kernel and the
paged attention kernels (INT4 and FP8 KV cache) against their references, CUDA graph replay,
batch invariance. Run through bench/gpu_check.py."""

from __future__ import annotations

import sys

import gpu_check_base as B
import torch
from gpu_check_base import CODE_FLIP_FRAC, TOL, check_graph, record
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.fp8_paged_attention import (
    fp8_paged_attention,
    fp8_paged_attention_ref,
)
from kolibri_trt_plugins.int4_paged_attention import (
    int4_paged_attention,
    int4_paged_attention_ref,
)
from kolibri_trt_plugins.qk_norm_fold_int4 import (
    dequantize_int4_ref,
    fold_matrices,
    hadamard_rotation,
    qk_norm_fold_int4,
    qk_norm_fold_int4_ref,
)


# ---------------------------------------------------------------- fold
def fold_case(T_, blk, g, hq=20, hkv=4):
    nb = T.cdiv(max(T_, 1) * 2, blk) + 2
    q = T.randn((T_, hq, 128), g, device=B.DEV, scale=3.0)
    k = T.randn((T_, hkv, 128), g, device=B.DEV, scale=3.0)
    v = T.randn((T_, hkv, 128), g, device=B.DEV)
    mq, mk = fold_matrices(1 + 0.1 * torch.randn(128, generator=g), 1 + 0.1 * torch.randn(128, generator=g),
                           hadamard_rotation(7), 128 ** -0.5)
    slots = torch.randperm(nb * blk, generator=g)[:T_]
    if T_ > 2:
        slots[1] = -1
    caches = [torch.zeros(shape, dtype=torch.uint8, device=B.DEV)     # values dim-major
              for shape in ((nb, hkv, blk, 64), (nb, hkv, 64, blk))]
    caches += [torch.zeros((nb, hkv, blk, 2), dtype=torch.float16, device=B.DEV) for _ in range(2)]
    return q, k, v, mq.to(B.DEV), mk.to(B.DEV), slots.to(B.DEV), caches


def token_major(caches):
    """(k_codes, v_codes, k_meta, v_meta) with the value codes viewed [nb, Hkv, BLOCK, 64]."""
    return [c.transpose(2, 3) if i == 1 else c for i, c in enumerate(caches)]


def check_fold(g):
    for blk in (16, 64):
        for T_ in (1, 3, 33, 576):
            name = f"fold blk={blk} T={T_}"
            q, k, v, mq, mk, slots, caches = fold_case(T_, blk, g)
            ref_c = [c.clone() for c in caches]
            qo = qk_norm_fold_int4(q, k, v, mq, mk, slots, *caches)
            qr = qk_norm_fold_int4_ref(q, k, v, mq, mk, slots, *ref_c, 1e-6)
            e_q = T.rel_err(qo, qr)
            flips = sum(int((a != b).sum()) for a, b in zip(caches[:2], ref_c[:2]))
            frac = flips / max(1, caches[0].numel() * 2)
            tm, tr = token_major(caches), token_major(ref_c)
            deq = [(dequantize_int4_ref(tm[i], tm[i + 2]) -
                    dequantize_int4_ref(tr[i], tr[i + 2])).abs().max().item() for i in (0, 1)]
            step = max(ref_c[2][..., 0].float().max().item(), ref_c[3][..., 0].float().max().item())
            msg = f"q rel={e_q:.2e} code flips={frac:.1e} max dequant diff={max(deq):.3g} (step<={step:.3g})"
            cg = [c.clone() for c in caches]
            msg += " " + check_graph(name, lambda: [qk_norm_fold_int4(q, k, v, mq, mk, slots, *cg)] + cg,
                                     [qo] + caches)
            record(name, e_q < TOL["fold_q"] and frac < CODE_FLIP_FRAC and max(deq) <= step * 1.01 + 1e-3,
                   msg)
    # batch invariance: token 0 alone vs inside a batch of 16
    q, k, v, mq, mk, slots, caches = fold_case(16, 16, g)
    c1 = [c.clone() for c in caches]
    qb = qk_norm_fold_int4(q, k, v, mq, mk, slots, *caches)
    q1 = qk_norm_fold_int4(q[:1], k[:1], v[:1], mq, mk, slots[:1], *c1)
    s0 = int(slots[0])
    b0, o0 = s0 // caches[0].shape[2], s0 % caches[0].shape[2]   # head-major pages
    ok = torch.equal(qb[0], q1[0]) and all(torch.equal(a[b0, :, o0], b[b0, :, o0])
                                           for a, b in zip(token_major(caches), token_major(c1)))
    record("fold batch invariance 1 vs 16", ok, "bit-identical" if ok else "DIFFERS")


# ---------------------------------------------------------------- attention
def attn_inputs(kind, seq_lens, q_lens, blk, g, hq=20, hkv=4):
    bt, sl, cu, nb = T.paged_layout(seq_lens, q_lens, blk, g, device=B.DEV)
    q = T.randn((sum(q_lens), hq, 128), g, device=B.DEV)
    if kind == "int4":
        cache = T.int4_cache(nb, blk, hkv, g, device=B.DEV)
    else:
        cache = T.fp8_cache(nb, blk, hkv, g, device=B.DEV) + (
            torch.tensor([0.7], device=B.DEV), torch.tensor([1.3], device=B.DEV))
    return q, cache, bt, sl, cu


def run_attn(kind, q, cache, bt, sl, cu, window, ref=False, bounds=None):
    """bounds = (max_seq_len, max_q_len): pass them when capturing (no host sync allowed)."""
    mx, mq = bounds if bounds else (int(sl.max()), int((cu[1:] - cu[:-1]).max()))
    if kind == "int4":
        if ref:
            return int4_paged_attention_ref(q, *cache, bt, sl, cu, 128 ** -0.5, window)
        return int4_paged_attention(q, *cache, bt, sl, cu, mx, mq, window=window)
    if ref:
        return fp8_paged_attention_ref(q, *cache, bt, sl, cu, 128 ** -0.5, window)
    return fp8_paged_attention(q, *cache, bt, sl, cu, mx, mq, window=window)


def attn_cases(small):
    dec = [1, 3, 33, 511, 4097] if not small else [1, 3, 33, 130]
    ver_s = [9, 40, 600, 2049] if not small else [9, 40, 200]
    ver_q = [9, 1, 5, 8][: len(ver_s)]
    return [("decode", dec, [1] * len(dec)), ("verify", ver_s, ver_q)]


def check_attention(kind, g, small):
    windows = (0, 513) if kind == "int4" else (513, 0)
    for blk in (16, 64):
        for label, seqs, qls in attn_cases(small):
            for window in windows:
                name = f"{kind} attn blk={blk} {label} window={window}"
                q, cache, bt, sl, cu = attn_inputs(kind, seqs, qls, blk, g)
                out = run_attn(kind, q, cache, bt, sl, cu, window)
                ref = run_attn(kind, q, cache, bt, sl, cu, window, ref=True)
                e = T.rel_err(out, ref)
                # a graph captured for a larger bucket (more splits, row tiles) must give the same bits
                bd = (int(sl.max()) + 777, 9)
                btp = torch.cat([bt, torch.zeros((bt.shape[0], 777 // blk + 1), dtype=bt.dtype,
                                                 device=B.DEV)], 1)
                msg = f"rel={e:.2e} " + check_graph(
                    name, lambda: run_attn(kind, q, cache, btp, sl, cu, window, bounds=bd), out)
                record(name, e < TOL["attn"], msg)
    check_attention_invariance(kind, g, small)


def check_attention_invariance(kind, g, small):
    n = 16
    seqs = [int(x) for x in torch.randint(9, 1500 if not small else 200, (n,), generator=g)]
    for qlab, qls in (("decode", [1] * n), ("verify", [int(x) for x in torch.randint(1, 10, (n,), generator=g)])):
        for window in ((0,) if kind == "int4" else (513, 0)):
            q, cache, bt, sl, cu = attn_inputs(kind, seqs, qls, 16, g)
            full = run_attn(kind, q, cache, bt, sl, cu, window)
            ok = True
            for s in (0, 7, 15):
                q0, q1 = int(cu[s]), int(cu[s + 1])
                one = run_attn(kind, q[q0:q1].contiguous(), cache, bt[s:s + 1].contiguous(), sl[s:s + 1].contiguous(),
                               torch.tensor([0, q1 - q0], dtype=torch.int32, device=B.DEV), window)
                ok &= torch.equal(one, full[q0:q1])
            record(f"{kind} attn batch invariance {qlab} window={window} 1 vs 16", ok,
                   "bit-identical" if ok else "DIFFERS")


def check_int4_noasm(g, small):
    """The plain-Triton nibble decode (USE_ASM=False) must also pass (it is the fallback)."""
    mod = sys.modules["kolibri_trt_plugins.int4_paged_attention"]
    mod.USE_ASM = False
    try:
        for label, seqs, qls in attn_cases(small):
            q, cache, bt, sl, cu = attn_inputs("int4", seqs, qls, 64, g)
            e = T.rel_err(run_attn("int4", q, cache, bt, sl, cu, 0),
                          run_attn("int4", q, cache, bt, sl, cu, 0, ref=True))
            record(f"int4 attn USE_ASM=False blk=64 {label}", e < TOL["attn"], f"rel={e:.2e}")
    finally:
        mod.USE_ASM = True
