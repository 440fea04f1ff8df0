"""Per-head QK RMSNorm + rotate-half RoPE for the FP8-cache attention layers, in one kernel.

Maths (shared/spec/kolibri-1.md §Forward pass; the same lines as kolibri_trt.model.ops
rms_norm then apply_rope), per token t and head, D = 128, fp32 inside:
    n   = bf16((x * rsqrt(mean(x²) + eps)) * g)          g = q_norm or k_norm gain
    out = bf16(n * cos[t] + rotate_half(n) * sin[t])      rotate_half(n) = (-n[64:], n[:64])
n is rounded to bf16 before the rotation, as the unfused path does (rms_norm returns bf16).
With rope=False (NoPE full layers with an FP8 cache) out = n. cos/sin are the fp32 [T, 128]
tables of ops.rope_cos_sin, computed once per step by the caller. One program per token; the
reduction order is a function of (Hq, Hkv) only (batch invariant). Layouts: plugins/LAYOUTS.md.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import early_launch, pdl_enter, pdl_release

HEAD_DIM = 128


@jit
def _norm_rope_heads(x_ptr, o_ptr, g_ptr, cos_ptr, sin_ptr, t, s_t, s_h, H, eps,
                     H_P: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr):
    """One token's H heads: x at x_ptr + t*s_t + h*s_h + d, out contiguous [T, H, D]."""
    n, hm = norm_rope_values(x_ptr, g_ptr, cos_ptr, sin_ptr, t, s_t, s_h, H, eps, H_P, D, ROPE)
    h = tl.arange(0, H_P)
    d = tl.arange(0, D)
    tl.store(o_ptr + (t * H + h[:, None]) * D + d[None, :], n.to(tl.bfloat16), mask=hm)


@jit
def norm_rope_values(x_ptr, g_ptr, cos_ptr, sin_ptr, t, s_t, s_h, H, eps,
                     H_P: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr):
    """One token's H heads normalised (and rotated): (fp32 [H_P, D] before the final bf16
    rounding, head mask [H_P, 1]). Launch with enable_fp_fusion=False."""
    h = tl.arange(0, H_P)
    d = tl.arange(0, D)
    hm = h[:, None] < H
    row = x_ptr + t * s_t + h[:, None] * s_h
    x = tl.load(row + d[None, :], mask=hm, other=0.0).to(tl.float32)
    inv = tl.math.rsqrt(tl.sum(x * x, 1) * (1.0 / D) + eps)[:, None]
    g = tl.load(g_ptr + d).to(tl.float32)[None, :]
    n = ((x * inv) * g).to(tl.bfloat16).to(tl.float32)
    if ROPE:
        # rotate_half partner of element d: -n[d + 64] for d < 64, n[d - 64] above; the partner
        # is re-normalised from its own raw load (same per-head factor, same bf16 rounding)
        dp = (d + D // 2) % D
        xp = tl.load(row + dp[None, :], mask=hm, other=0.0).to(tl.float32)
        gp = tl.load(g_ptr + dp).to(tl.float32)[None, :]
        npart = ((xp * inv) * gp).to(tl.bfloat16).to(tl.float32)
        rot = tl.where(d[None, :] < D // 2, -npart, npart)
        c = tl.load(cos_ptr + t * D + d)[None, :]
        s = tl.load(sin_ptr + t * D + d)[None, :]
        n = n * c + rot * s
    return n, hm


@jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, gq_ptr, gk_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
                         sq_t, sq_h, sk_t, sk_h, HQ, HKV, eps,
                         HQ_P: tl.constexpr, HKV_P: tl.constexpr, D: tl.constexpr,
                         ROPE: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    _norm_rope_heads(q_ptr, qo_ptr, gq_ptr, cos_ptr, sin_ptr, t, sq_t, sq_h, HQ, eps, HQ_P, D, ROPE)
    _norm_rope_heads(k_ptr, ko_ptr, gk_ptr, cos_ptr, sin_ptr, t, sk_t, sk_h, HKV, eps, HKV_P, D,
                     ROPE)
    pdl_release(PDL)      # at the end: no earlier point in this kernel (PDL 2)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """kolibri_trt.model.ops.rms_norm, line for line (plugins never import kolibri_trt)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y * weight.float()
    return y.to(x.dtype)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """kolibri_trt.model.ops.apply_rope, line for line: x [T, heads, D], cos/sin fp32 [T, D]."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return (xf * c + rotated * s).to(x.dtype)


def qk_norm_rope_ref(q, k, q_norm, k_norm, cos, sin, eps: float, rope: bool = True):
    """Plain-torch reference of :func:`qk_norm_rope`: ``ops.rms_norm`` per head, then (rope)
    ``ops.apply_rope``, then ``.contiguous()``; bit-identical to that composition."""
    q, k = _rms_norm(q, q_norm, eps), _rms_norm(k, k_norm, eps)
    if rope:
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
    return q.contiguous(), k.contiguous()


@torch.library.custom_op(f"{NAMESPACE}::qk_norm_rope", mutates_args=())
def _qk_norm_rope_op(q: torch.Tensor, k: torch.Tensor, q_norm: torch.Tensor,
                     k_norm: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                     eps: float, rope: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel_path(q, "qk_norm_rope") == "ref":
        return qk_norm_rope_ref(q, k, q_norm, k_norm, cos, sin, eps, rope)
    return _launch(q, k, q_norm, k_norm, cos, sin, eps, rope, False)


@_qk_norm_rope_op.register_fake
def _(q, k, q_norm, k_norm, cos, sin, eps, rope):
    return q.new_empty(q.shape), k.new_empty(k.shape)  # new_empty: contiguous


def _launch(q, k, q_norm, k_norm, cos, sin, eps, rope, interpret):
    T, hq, _ = q.shape
    hkv = k.shape[1]
    q_out = torch.empty((T, hq, HEAD_DIM), dtype=torch.bfloat16, device=q.device)
    k_out = torch.empty((T, hkv, HEAD_DIM), dtype=torch.bfloat16, device=q.device)
    if T:
        cs = (cos, sin) if rope else (q_out, q_out)  # never read without ROPE
        launch(_qk_norm_rope_kernel, (T,), q, k, q_norm, k_norm, *cs, q_out, k_out,
               q.stride(0), q.stride(1), k.stride(0), k.stride(1), hq, hkv, float(eps),
               HQ_P=max(2, next_pow2(hq)), HKV_P=max(2, next_pow2(hkv)), D=HEAD_DIM,
               ROPE=bool(rope), num_warps=4, enable_fp_fusion=False, interpret=interpret,
               pdl_early=early_launch("norm", T))
    return q_out, k_out


def _check(q, k, q_norm, k_norm, cos, sin, rope):
    check_tensor("q", q, torch.bfloat16, (None, None, HEAD_DIM), contiguous=False)
    T, dev = q.shape[0], q.device
    check_tensor("k", k, torch.bfloat16, (T, None, HEAD_DIM), dev, contiguous=False)
    for name, t in (("q", q), ("k", k)):
        if t.stride(2) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, strides {t.stride()}")
    check_tensor("q_norm", q_norm, torch.bfloat16, (HEAD_DIM,), dev)
    check_tensor("k_norm", k_norm, torch.bfloat16, (HEAD_DIM,), dev)
    if rope:
        check_tensor("cos", cos, torch.float32, (T, HEAD_DIM), dev)
        check_tensor("sin", sin, torch.float32, (T, HEAD_DIM), dev)


def qk_norm_rope(q, k, q_norm, k_norm, cos=None, sin=None, eps: float = 1e-6,
                 rope: bool = True, interpret: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise q and k per head with their gains, then (rope) rotate them; contiguous outputs.

    Args:
        q: bf16 [T, Hq, 128], k: bf16 [T, Hkv, 128]: raw q_proj / k_proj outputs; views of the
            fused QKV output are fine (last-dim stride 1, token/head strides free).
        q_norm, k_norm: bf16 [128] contiguous, the per-head RMSNorm gains.
        cos, sin: fp32 [T, 128] contiguous (ops.rope_cos_sin of the step's positions); ignored
            (None allowed) when rope is False.
        eps: RMS epsilon (config rms_norm_eps).
        rope: apply rotate-half RoPE (sliding layers); False for NoPE full layers.
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        (q_out bf16 [T, Hq, 128], k_out bf16 [T, Hkv, 128]), both contiguous.
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: shared/spec/kolibri-1.md §Forward pass (QK-norm, RoPE on sliding layers); the maths
    of kolibri_trt.model.ops.rms_norm and ops.apply_rope.
    """
    _check(q, k, q_norm, k_norm, cos, sin, rope)
    if not rope:
        cos = sin = None
    if interpret:
        return _launch(q, k, q_norm, k_norm, cos, sin, eps, rope, True)
    return torch.ops.kolibri_plugins.qk_norm_rope(q, k, q_norm, k_norm, cos, sin, float(eps),
                                                  bool(rope))
