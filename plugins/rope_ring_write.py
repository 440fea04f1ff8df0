"""The block drafter's RoPE on q and k plus the K/V ring write in one kernel per layer
(`DrafterPlugin._layer` / `_write_context`, attn "kernel").

Maths (the drafter's torch glue, `plugin_glue.apply_rope_rotation` + the ring's index_put):
per token t of the fused QKV rows (q | k | v heads of D, bf16) and its rotation table
m[t] = [[cos, -sin], [sin, cos]] (fp32 [2, 2, D/2], `plugin_glue.rope_rotation`), every q and
k head with halves (x1, x2) becomes
    out_a = bf16(x1 * m[t, a, 0] + x2 * m[t, a, 1])        a = 0 (first half), 1 (second)
(x converted exactly to fp32, two fp32 products, one fp32 add, one round to nearest even:
the bits of the glue's mul + add). Rotated q heads are written back in place into the q
columns; rotated k heads and the unchanged v heads go to the ring at [0 / 1, slot, row].
The k columns of qkv are left as they were. Compiled with `enable_fp_fusion=False` so the
product and the add stay two roundings (no FMA), as in the glue.

Kernel: one program per token, all its heads as one [heads, D/2] tile; writes only, so a
token's bits never depend on the other tokens (batch invariant). Tokens sharing a (slot, row)
(padding rows in the trash slot) write in an unspecified order, as the glue's index_put.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import pdl_enter, pdl_release

INDEX_DTYPES = (torch.int64, torch.int32)


@jit
def _rope_ring_write_kernel(qkv_ptr, m_ptr, kv_ptr, slot_ptr, row_ptr, s_t, ss0, ss1, sr0, sr1,
                            n_slots, ring, NB: tl.constexpr, HQ: tl.constexpr,
                            HKV: tl.constexpr, D: tl.constexpr, H_P: tl.constexpr,
                            HKV_P: tl.constexpr, HALF_P: tl.constexpr, D_P: tl.constexpr,
                            PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    a, b = t // NB, t % NB
    slot = tl.load(slot_ptr + a * ss0 + b * ss1).to(tl.int64)
    row = tl.load(row_ptr + a * sr0 + b * sr1).to(tl.int64)
    dst = kv_ptr + (slot * ring + row) * (HKV * D)          # [Hkv, D] of plane 0 (K)
    half = D // 2
    c = tl.arange(0, HALF_P)
    c_ok = c < half
    mt = m_ptr + t * (4 * half) + c                          # m[t, a, b] at (2a + b) * D/2
    m00 = tl.load(mt, mask=c_ok, other=0.0)[None, :]
    m01 = tl.load(mt + half, mask=c_ok, other=0.0)[None, :]
    m10 = tl.load(mt + 2 * half, mask=c_ok, other=0.0)[None, :]
    m11 = tl.load(mt + 3 * half, mask=c_ok, other=0.0)[None, :]
    h = tl.arange(0, H_P)[:, None]                           # q heads, then k heads
    ok = (h < HQ + HKV) & c_ok[None, :]
    src = qkv_ptr + t * s_t + h * D + c[None, :]
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=ok, other=0.0).to(tl.float32)
    o0 = (x1 * m00 + x2 * m01).to(tl.bfloat16)
    o1 = (x1 * m10 + x2 * m11).to(tl.bfloat16)
    is_q = ok & (h < HQ)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    tl.store(src, o0, mask=is_q)
    tl.store(src + half, o1, mask=is_q)
    is_k = ok & (h >= HQ)
    k_at = dst + (h - HQ) * D + c[None, :]
    tl.store(k_at, o0, mask=is_k)
    tl.store(k_at + half, o1, mask=is_k)
    hv = tl.arange(0, HKV_P)[:, None]
    d = tl.arange(0, D_P)[None, :]
    v_ok = (hv < HKV) & (d < D)
    v = tl.load(qkv_ptr + t * s_t + (HQ + HKV + hv) * D + d, mask=v_ok, other=0.0)
    plane = n_slots * ring * HKV * D                         # offset of the values in kv
    tl.store(dst + plane + hv * D + d, v, mask=v_ok)


def rope_ring_write_ref(qkv: torch.Tensor, m: torch.Tensor, kv: torch.Tensor,
                        slots: torch.Tensor, rows: torch.Tensor, num_q_heads: int) -> None:
    """Plain-torch reference of :func:`rope_ring_write` (in place): the glue's
    `apply_rope_rotation` (one fp32 product per table entry, one fp32 add rounded to bf16)
    and one index_put of keys and values into the ring."""
    t = qkv.shape[0]
    hkv, d = kv.shape[3], kv.shape[4]
    hq, half = int(num_q_heads), d // 2
    nh = hq + hkv
    x = qkv[:, :nh * d].view(t, nh, 1, 2, half)
    p = x * m.view(t, 1, 2, 2, half)                                  # fp32 [T, H, 2, 2, D/2]
    rot = torch.empty(t, nh, d, dtype=qkv.dtype, device=qkv.device)
    torch.add(p[:, :, :, 0], p[:, :, :, 1], out=rot.view(t, nh, 2, half))
    qkv[:, :hq * d].copy_(rot[:, :hq].reshape(t, hq * d))
    new = torch.empty(t, 2, hkv, d, dtype=qkv.dtype, device=qkv.device)
    new[:, 0] = rot[:, hq:]
    new[:, 1] = qkv[:, nh * d:].view(t, hkv, d)
    kv[:, slots.long(), rows.long()] = new.view(*slots.shape, 2, hkv, d).movedim(-3, 0)


@torch.library.custom_op(f"{NAMESPACE}::rope_ring_write", mutates_args=("qkv", "kv"))
def _rope_ring_write_op(qkv: torch.Tensor, m: torch.Tensor, kv: torch.Tensor,
                        slots: torch.Tensor, rows: torch.Tensor, num_q_heads: int) -> None:
    if kernel_path(qkv, "rope_ring_write") == "ref":
        rope_ring_write_ref(qkv, m, kv, slots, rows, num_q_heads)
        return
    _launch(qkv, m, kv, slots, rows, num_q_heads, False)


@_rope_ring_write_op.register_fake
def _(qkv, m, kv, slots, rows, num_q_heads):
    return None


def _launch(qkv, m, kv, slots, rows, num_q_heads, interpret):
    t = qkv.shape[0]
    hkv, d = kv.shape[3], kv.shape[4]
    s2 = slots if slots.dim() == 2 else slots.view(-1, 1)
    r2 = rows if rows.dim() == 2 else rows.view(-1, 1)
    if t:
        launch(_rope_ring_write_kernel, (t,), qkv, m, kv, s2, r2, qkv.stride(0),
               s2.stride(0), s2.stride(1), r2.stride(0), r2.stride(1), kv.shape[1], kv.shape[2],
               NB=s2.shape[1], HQ=int(num_q_heads), HKV=hkv, D=d,
               H_P=max(2, next_pow2(int(num_q_heads) + hkv)), HKV_P=max(2, next_pow2(hkv)),
               HALF_P=max(2, next_pow2(d // 2)), D_P=max(2, next_pow2(d)), num_warps=4,
               enable_fp_fusion=False, interpret=interpret)


def _check(qkv, m, kv, slots, rows, num_q_heads):
    check_tensor("kv", kv, torch.bfloat16, (2, None, None, None, None))
    dev, hkv, d = kv.device, kv.shape[3], kv.shape[4]
    if hkv == 0 or d == 0 or d % 2:
        raise ValueError(f"kv: needs >= 1 KV head and an even head dim, shape {tuple(kv.shape)}")
    if int(num_q_heads) < 0:
        raise ValueError(f"num_q_heads: {num_q_heads} is negative")
    width = (int(num_q_heads) + 2 * hkv) * d
    check_tensor("qkv", qkv, torch.bfloat16, (None, width), dev, contiguous=False)
    if qkv.stride(1) != 1:
        raise ValueError(f"qkv: the last dim must have stride 1, strides {qkv.stride()}")
    t = qkv.shape[0]
    check_tensor("m", m, torch.float32, (t, 2, 2, d // 2), dev)
    for name, idx in (("slots", slots), ("rows", rows)):
        check_tensor(name, idx, INDEX_DTYPES, device=dev, contiguous=False)
        if idx.dim() not in (1, 2) or idx.numel() != t:
            raise ValueError(f"{name}: shape {tuple(idx.shape)}, expected [T] or [S, B] with "
                             f"T = {t} elements")
    if slots.shape != rows.shape:
        raise ValueError(f"rows: shape {tuple(rows.shape)} differs from slots' "
                         f"{tuple(slots.shape)}")


def rope_ring_write(qkv, m, kv, slots, rows, num_q_heads: int, interpret: bool = False) -> None:
    """RoPE on the q and k heads of fused QKV rows, keys and values into the ring; one launch.

    Args:
        qkv: bf16 [T, (Hq + 2 Hkv) * D]: per token the q heads, the k heads, the v heads
            (last-dim stride 1, the row stride free). Mutated: the q columns are replaced by
            the rotated queries; the k and v columns are left unchanged.
        m: fp32 [T, 2, 2, D/2] contiguous, the rotation tables of the tokens' positions
            (`plugin_glue.rope_rotation`: [[cos, -sin], [sin, cos]]).
        kv: bf16 [2, slots + 1, R, Hkv, D] contiguous, one layer's ring; mutated: token t's
            rotated keys at [0, slots[t], rows[t]], its values at [1, slots[t], rows[t]].
        slots, rows: int64 / int32 of the same shape, [T] or [S, B] (S*B = T, token s*B + b;
            strides free, e.g. an expanded view): each token's ring slot and row (padding:
            the trash slot), 0 <= slot < slots + 1, 0 <= row < R (not checked).
        num_q_heads: Hq (0: keys and values only, the drafter's context rows).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device, stride or value;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: kolibri_trt/drafter/plugin_glue.py (apply_rope_rotation) and the ring writes of
    kolibri_trt/drafter/plugin_drafter.py.
    """
    _check(qkv, m, kv, slots, rows, num_q_heads)
    if interpret:
        return _launch(qkv, m, kv, slots, rows, num_q_heads, True)
    torch.ops.kolibri_plugins.rope_ring_write(qkv, m, kv, slots, rows, int(num_q_heads))
