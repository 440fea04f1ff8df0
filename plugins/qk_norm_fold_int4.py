"""QK-norm + rotation fold for the full-attention (NoPE) layers, writing the rotated INT4 cache.

Maths (shared/spec/kv-cache.md, seed 002): per token and head,
    q_used   = M_q · rms(q)          M_q = R · diag(g_q ⊙ g_k)  (optionally × 1/sqrt(128))
    k_cached = M_k · rms(k)          M_k = R
    v_cached = v                      (values are not rotated)
rms(x) = x / sqrt(mean(x²) + eps) in fp32. k_cached and v are each quantized per (token, KV head)
over the 128 numbers: scale = (max-min)/15, offset = min (both stored as fp16; the codes are
computed against the stored fp16 values), code = clamp(floor((x-offset)/scale + 0.5), 0, 15),
code 0 everywhere when scale == 0. Codes pack two per byte, element 2i in the low nibble.
Pages are head-major, [num_blocks, Hkv, BLOCK, 64] and [num_blocks, Hkv, BLOCK, 2]: one head's
keys of a page are contiguous (`int4_rows`); value codes are dim-major within a page,
[num_blocks, Hkv, 64, BLOCK] (`int4_value_codes`). Layouts: plugins/LAYOUTS.md.
"""

from __future__ import annotations

import torch

from ._common import (NAMESPACE, cdiv, check_tensor, jit, kernel_path, launch, next_pow2, tl)
from ._common import early_launch, pdl_enter, pdl_release
from ._rows import linear_rows

HEAD_DIM = 128
Q_ROWS = 16   # query heads per program (tl.dot's smallest M); 20 heads -> 2 programs per token


@jit
def _qk_fold_int4_kernel(
    q_ptr, k_ptr, v_ptr, mq_ptr, mk_ptr, slot_ptr,
    kc_ptr, vc_ptr, km_ptr, vm_ptr, qo_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
    HQ, HKV, BLK, eps,
    Q_ROWS: tl.constexpr, HKV_P: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr = 0,
):
    """Grid (T, cdiv(HQ, Q_ROWS) + 1): programs 0.. of axis 1 take Q_ROWS query heads each, the
    last one the token's keys and values, so the two 64 KB fold matrices load in parallel."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    d = tl.arange(0, D)
    if part < tl.num_programs(1) - 1:
        # ---- query: rms, then y = rms(q) @ M_q^T (3xTF32 on the tensor cores: ~fp32) ----
        hq = part * Q_ROWS + tl.arange(0, Q_ROWS)
        qm = hq[:, None] < HQ
        x = tl.load(q_ptr + t * sq_t + hq[:, None] * sq_h + d[None, :], mask=qm,
                    other=0.0).to(tl.float32)
        x = x * (1.0 / tl.sqrt(tl.sum(x * x, 1) / D + eps))[:, None]
        mq_t = tl.load(mq_ptr + d[None, :] * D + d[:, None])  # [i, j] = M_q[j, i]
        y = tl.dot(x, mq_t, input_precision="tf32x3")
        pdl_release(PDL)      # the next kernel may launch now (PDL 2)
        tl.store(qo_ptr + (t * HQ + hq[:, None]) * D + d[None, :], y.to(tl.bfloat16), mask=qm)
    else:
        _fold_kv(k_ptr, v_ptr, mk_ptr, slot_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr,
                 t, sk_t, sk_h, sv_t, sv_h, HKV, BLK, eps, HKV_P, D, PDL)


@jit
def _fold_kv(k_ptr, v_ptr, mk_ptr, slot_ptr, kc_ptr, vc_ptr, km_ptr, vm_ptr,
             t, sk_t, sk_h, sv_t, sv_h, HKV, BLK, eps,
             HKV_P: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr):
    """One token's keys (rms + rotation) and values (as they are), each quantized to INT4 and
    written at its slot of the head-major pages."""
    d = tl.arange(0, D)
    slot = tl.load(slot_ptr + t)
    hk = tl.arange(0, HKV_P)
    km = hk[:, None] < HKV
    xk = tl.load(k_ptr + t * sk_t + hk[:, None] * sk_h + d[None, :], mask=km, other=0.0).to(tl.float32)
    xk = xk * (1.0 / tl.sqrt(tl.sum(xk * xk, 1) / D + eps))[:, None]
    mk_t = tl.load(mk_ptr + d[None, :] * D + d[:, None])
    xk = tl.dot(xk, mk_t, input_precision="tf32x3")
    xv = tl.load(v_ptr + t * sv_t + hk[:, None] * sv_h + d[None, :], mask=km, other=0.0).to(tl.float32)
    pdl_release(PDL)
    wmask = (hk < HKV) & (slot >= 0)
    for which in tl.static_range(2):
        if which == 0:
            xs = xk
            c_ptr = kc_ptr
            m_ptr = km_ptr
        else:
            xs = xv
            c_ptr = vc_ptr
            m_ptr = vm_ptr
        mx = tl.max(xs, 1)
        mn = tl.min(xs, 1)
        scale_h = ((mx - mn) / 15.0).to(tl.float16)
        off_h = mn.to(tl.float16)
        sc = scale_h.to(tl.float32)
        inv = tl.where(sc > 0, 1.0 / sc, 0.0)
        code = tl.floor((xs - off_h.to(tl.float32)[:, None]) * inv[:, None] + 0.5)
        code = tl.minimum(tl.maximum(code, 0.0), 15.0).to(tl.int32)
        lo, hi = tl.split(tl.reshape(code, (HKV_P, D // 2, 2)))
        packed = (lo | (hi << 4)).to(tl.uint8)
        row = ((slot // BLK) * HKV + hk) * BLK + slot % BLK  # int64 flat row (int4_rows)
        b = tl.arange(0, D // 2)
        if which == 0:   # keys: token-major [BLOCK, 64] per (page, head)
            cp = c_ptr + row[:, None] * (D // 2) + b[None, :]
        else:            # values: dim-major [64, BLOCK] per (page, head) (int4_value_codes)
            cp = c_ptr + (row - slot % BLK)[:, None] * (D // 2) + b[None, :] * BLK + slot % BLK
        tl.store(cp, packed, mask=wmask[:, None])
        tl.store(m_ptr + row * 2, scale_h, mask=wmask)
        tl.store(m_ptr + row * 2 + 1, off_h, mask=wmask)


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain RMS normalisation over the last dim in fp32 (no gain): x / sqrt(mean(x²) + eps)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def quantize_int4_ref(x: torch.Tensor):
    """Asymmetric INT4 quantization over the last dim (128) of fp32 ``x`` [..., 128].

    Returns (codes uint8 [..., 64] packed, meta fp16 [..., 2] = (scale, offset)). Maths as in the
    module docstring (kv-cache.md)."""
    x = x.float()
    mx, mn = x.amax(-1), x.amin(-1)
    scale_h = ((mx - mn) / 15.0).half()
    off_h = mn.half()
    sc = scale_h.float()
    inv = torch.where(sc > 0, 1.0 / torch.where(sc > 0, sc, torch.ones_like(sc)), torch.zeros_like(sc))
    code = torch.floor((x - off_h.float()[..., None]) * inv[..., None] + 0.5).clamp(0, 15).to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed, torch.stack([scale_h, off_h], -1)


def int4_rows(slots: torch.Tensor, hkv: int, block: int) -> torch.Tensor:
    """Flat rows of head-major pages: slots int64 [n] (block·BLOCK + offset) -> int64 [n, hkv],
    row (block·hkv + head)·BLOCK + offset of a cache viewed as [-1, 64] (codes) or [-1, 2]
    (meta)."""
    heads = torch.arange(hkv, device=slots.device)
    return ((slots // block)[:, None] * hkv + heads[None, :]) * block + (slots % block)[:, None]


def int4_value_codes(v_codes: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The value codes of slots int64 [n] from dim-major pages v_codes uint8 [num_blocks, Hkv,
    64, BLOCK]: uint8 [n, Hkv, 64] (byte i of head h at v_codes[slot // BLOCK, h, i, slot %
    BLOCK])."""
    return v_codes.transpose(2, 3)[slots // v_codes.shape[3], :, slots % v_codes.shape[3]]


def set_int4_value_codes(v_codes: torch.Tensor, slots: torch.Tensor,
                         codes: torch.Tensor) -> None:
    """Write codes uint8 [n, Hkv, 64] at slots int64 [n] of dim-major v_codes (in place; the
    inverse of `int4_value_codes`)."""
    v_codes.transpose(2, 3)[slots // v_codes.shape[3], :, slots % v_codes.shape[3]] = codes


def dequantize_int4_ref(codes: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., 64] + meta fp16 [..., 2] -> fp32 [..., 128]: code * scale + offset."""
    lo = (codes & 15).float()
    hi = (codes >> 4).float()
    c = torch.stack([lo, hi], -1).flatten(-2)
    return c * meta[..., :1].float() + meta[..., 1:].float()


def qk_norm_fold_int4_ref(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta, eps):
    """Plain-torch reference of :func:`qk_norm_fold_int4` (same arguments, same effects)."""
    q_out = linear_rows(rms(q, eps), m_q.float()).to(torch.bfloat16)
    k_rot = linear_rows(rms(k, eps), m_k.float())
    kc, kmeta = quantize_int4_ref(k_rot)
    vc, vmeta = quantize_int4_ref(v.float())
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    rows = int4_rows(slots, k_codes.shape[1], k_codes.shape[2])
    for cache, val in ((k_codes, kc), (k_meta, kmeta), (v_meta, vmeta)):
        cache.view(-1, cache.shape[-1])[rows] = val[keep]
    set_int4_value_codes(v_codes, slots, vc[keep])
    return q_out


def _check(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta):
    check_tensor("q", q, torch.bfloat16, (None, None, HEAD_DIM), contiguous=False)
    T = q.shape[0]
    dev = q.device
    check_tensor("k", k, torch.bfloat16, (T, None, HEAD_DIM), dev, contiguous=False)
    check_tensor("v", v, torch.bfloat16, tuple(k.shape), dev, contiguous=False)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(2) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, strides {t.stride()}")
    for name, m in (("m_q", m_q), ("m_k", m_k)):
        check_tensor(name, m, torch.float32, (HEAD_DIM, HEAD_DIM), dev)
    check_tensor("slot_mapping", slot_mapping, torch.int64, (T,), dev)
    hkv = k.shape[1]
    check_tensor("k_codes", k_codes, torch.uint8, (None, hkv, None, HEAD_DIM // 2), dev)
    nb, blk = k_codes.shape[0], k_codes.shape[2]
    check_tensor("v_codes", v_codes, torch.uint8, (nb, hkv, HEAD_DIM // 2, blk), dev)
    check_tensor("k_meta", k_meta, torch.float16, (nb, hkv, blk, 2), dev)
    check_tensor("v_meta", v_meta, torch.float16, (nb, hkv, blk, 2), dev)


@torch.library.custom_op(f"{NAMESPACE}::qk_norm_fold_int4",
                         mutates_args=("k_codes", "v_codes", "k_meta", "v_meta"))
def _qk_norm_fold_int4_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m_q: torch.Tensor,
                          m_k: torch.Tensor, slot_mapping: torch.Tensor, k_codes: torch.Tensor,
                          v_codes: torch.Tensor, k_meta: torch.Tensor, v_meta: torch.Tensor,
                          eps: float) -> torch.Tensor:
    if kernel_path(q, "qk_norm_fold_int4") == "ref":
        return qk_norm_fold_int4_ref(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta,
                                     v_meta, eps)
    return _launch(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta, eps, False)


@_qk_norm_fold_int4_op.register_fake
def _(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta, eps):
    return torch.empty((q.shape[0], q.shape[1], HEAD_DIM), dtype=torch.bfloat16, device=q.device)


def _launch(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta, eps, interpret):
    T, hq, _ = q.shape
    hkv = k.shape[1]
    q_out = torch.empty((T, hq, HEAD_DIM), dtype=torch.bfloat16, device=q.device)
    if T == 0:
        return q_out
    launch(_qk_fold_int4_kernel, (T, cdiv(hq, Q_ROWS) + 1), q, k, v, m_q, m_k, slot_mapping,
           k_codes, v_codes, k_meta, v_meta, q_out, q.stride(0), q.stride(1), k.stride(0),
           k.stride(1), v.stride(0), v.stride(1), hq, hkv, k_codes.shape[2], float(eps), Q_ROWS=Q_ROWS,
           HKV_P=max(16, next_pow2(hkv)), D=HEAD_DIM, num_warps=4, interpret=interpret,
           pdl_early=early_launch("norm", T))
    return q_out


def qk_norm_fold_int4(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta,
                      eps: float = 1e-6, interpret: bool = False) -> torch.Tensor:
    """Normalise, rotate and cache one full-attention layer's new tokens; return the query.

    Args:
        q: bf16 [T, Hq, 128] raw q_proj output (last dim stride 1; token/head strides free).
        k, v: bf16 [T, Hkv, 128] raw k_proj / v_proj output (same stride rule).
        m_q: fp32 [128, 128] = R·diag(g_q⊙g_k) (times 1/sqrt(128) if the caller folds it).
        m_k: fp32 [128, 128] = R.
        slot_mapping: int64 [T], physical slot = block*BLOCK + offset; negative = do not write.
        k_codes: uint8 [num_blocks, Hkv, BLOCK, 64] (head-major pages), written in place at the
            slots; v_codes: uint8 [num_blocks, Hkv, 64, BLOCK] (head-major, dim-major pages).
        k_meta, v_meta: fp16 [num_blocks, Hkv, BLOCK, 2] (scale, offset), written in place.
        eps: RMS epsilon (config rms_norm_eps).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        bf16 [T, Hq, 128] contiguous: M_q·rms(q) per head.
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: shared/spec/kv-cache.md (fold and INT4 format), seed 002.
    """
    _check(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta)
    if interpret:
        return _launch(q, k, v, m_q, m_k, slot_mapping, k_codes, v_codes, k_meta, v_meta, eps, True)
    return torch.ops.kolibri_plugins.qk_norm_fold_int4(q, k, v, m_q, m_k, slot_mapping, k_codes,
                                                       v_codes, k_meta, v_meta, float(eps))


def hadamard_rotation(seed: int, dim: int = HEAD_DIM) -> torch.Tensor:
    """R = H·diag(s)/sqrt(dim) (fp32 [dim, dim]): Sylvester Hadamard H, random signs s from ``seed``.

    Orthogonal: (R q)·(R k) = q·k. Source: shared/spec/kv-cache.md."""
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 2, (dim,), generator=g).float() * 2 - 1
    return h * s[None, :] / dim ** 0.5


def fold_matrices(g_q: torch.Tensor, g_k: torch.Tensor, rotation: torch.Tensor,
                  sm_scale: float = 1.0):
    """(M_q, M_k) fp32 [128,128]: M_q = sm_scale·R·diag(g_q⊙g_k), M_k = R (kv-cache.md)."""
    gains = g_q.float() * g_k.float()
    return (rotation.float() * gains[None, :] * sm_scale).contiguous(), rotation.float().contiguous()
