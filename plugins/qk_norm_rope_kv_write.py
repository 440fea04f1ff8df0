"""QK-norm + RoPE and the FP8 cache write of the new K/V, in one kernel (FP8-cache layers).

    q_out = qk_norm_rope(q)                                    (plugins/qk_norm_rope.py)
    k_cache[slot] = e4m3(clamp(bf16(qk_norm_rope(k)) / k_scale, ±448))   (fp8_kv_write.py)
    v_cache[slot] = e4m3(clamp(v / v_scale, ±448))

The decoder's `q, k = qk_norm_rope(...); fp8_kv_write(k, v, ...)` as one launch: the normalised
keys go from registers to the cache and never through memory. Both steps are the shared @jit
helpers of those two kernels (`norm_rope_values`, `fp8_store_heads`), so q_out and the cache
bytes are bit for bit those of the two ops. One program per token (batch invariant); a negative
slot writes nothing (padding rows). Layouts: plugins/LAYOUTS.md.
Source: shared/spec/kolibri-1.md §Forward pass (QK-norm, RoPE on sliding layers),
shared/spec/kv-cache.md (FP8 layers, per-layer scales).
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import early_launch, pdl_enter, pdl_release
from .fp8_kv_write import check_cache_args, fp8_kv_write_ref, fp8_store_heads
from .qk_norm_rope import HEAD_DIM, _check, _norm_rope_heads, norm_rope_values, qk_norm_rope_ref


@jit
def _qk_norm_rope_kv_write_kernel(q_ptr, k_ptr, v_ptr, gq_ptr, gk_ptr, cos_ptr, sin_ptr,
                                  slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, qo_ptr,
                                  sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, HQ, HKV, eps,
                                  HQ_P: tl.constexpr, HKV_P: tl.constexpr, D: tl.constexpr,
                                  ROPE: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    _norm_rope_heads(q_ptr, qo_ptr, gq_ptr, cos_ptr, sin_ptr, t, sq_t, sq_h, HQ, eps, HQ_P, D,
                     ROPE)
    k, hm = norm_rope_values(k_ptr, gk_ptr, cos_ptr, sin_ptr, t, sk_t, sk_h, HKV, eps, HKV_P, D,
                             ROPE)
    slot = tl.load(slot_ptr + t)
    h = tl.arange(0, HKV_P)
    d = tl.arange(0, D)
    ok = hm & (slot >= 0)
    v = tl.load(v_ptr + t * sv_t + h[:, None] * sv_h + d[None, :], mask=ok, other=0.0)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    fp8_store_heads(k.to(tl.bfloat16).to(tl.float32), slot, kc_ptr, ks_ptr, h, d, ok, HKV, D)
    fp8_store_heads(v.to(tl.float32), slot, vc_ptr, vs_ptr, h, d, ok, HKV, D)


def qk_norm_rope_kv_write_ref(q, k, v, q_norm, k_norm, cos, sin, slot_mapping, k_cache,
                              v_cache, k_scale, v_scale, eps: float, rope: bool = True
                              ) -> torch.Tensor:
    """Plain-torch reference of :func:`qk_norm_rope_kv_write`: qk_norm_rope_ref, then
    fp8_kv_write_ref of its keys and v (in place); returns q_out."""
    q_out, k_out = qk_norm_rope_ref(q, k, q_norm, k_norm, cos, sin, eps, rope)
    fp8_kv_write_ref(k_out, v, slot_mapping, k_cache, v_cache, k_scale, v_scale)
    return q_out


@torch.library.custom_op(f"{NAMESPACE}::qk_norm_rope_kv_write", mutates_args=("k_cache", "v_cache"))
def _qk_norm_rope_kv_write_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              q_norm: torch.Tensor, k_norm: torch.Tensor,
                              cos: torch.Tensor | None, sin: torch.Tensor | None,
                              slot_mapping: torch.Tensor, k_cache: torch.Tensor,
                              v_cache: torch.Tensor, k_scale: torch.Tensor,
                              v_scale: torch.Tensor, eps: float, rope: bool) -> torch.Tensor:
    args = (q, k, v, q_norm, k_norm, cos, sin, slot_mapping, k_cache, v_cache, k_scale, v_scale,
            eps, rope)
    if kernel_path(q, "qk_norm_rope_kv_write") == "ref":
        return qk_norm_rope_kv_write_ref(*args)
    return _launch(*args, False)


@_qk_norm_rope_kv_write_op.register_fake
def _(q, k, v, q_norm, k_norm, cos, sin, slot_mapping, k_cache, v_cache, k_scale, v_scale, eps,
      rope):
    return q.new_empty(q.shape)  # new_empty: contiguous


def _launch(q, k, v, q_norm, k_norm, cos, sin, slots, k_cache, v_cache, k_scale, v_scale, eps,
            rope, interpret):
    T, hq, _ = q.shape
    hkv = k.shape[1]
    q_out = torch.empty((T, hq, HEAD_DIM), dtype=torch.bfloat16, device=q.device)
    if T:
        cs = (cos, sin) if rope else (q_out, q_out)  # never read without ROPE
        launch(_qk_norm_rope_kv_write_kernel, (T,), q, k, v, q_norm, k_norm, *cs, slots,
               k_cache, v_cache, k_scale, v_scale, q_out, q.stride(0), q.stride(1), k.stride(0),
               k.stride(1), v.stride(0), v.stride(1), hq, hkv, float(eps),
               HQ_P=max(2, next_pow2(hq)), HKV_P=max(2, next_pow2(hkv)), D=HEAD_DIM,
               ROPE=bool(rope), num_warps=4, enable_fp_fusion=False, interpret=interpret,
               pdl_early=early_launch("norm", T))
    return q_out


def qk_norm_rope_kv_write(q, k, v, q_norm, k_norm, cos, sin, slot_mapping, k_cache, v_cache,
                          k_scale, v_scale, eps: float = 1e-6, rope: bool = True,
                          interpret: bool = False) -> torch.Tensor:
    """Normalise (and rotate) q and k per head, return q, and write k and v into the FP8
    paged cache at their slots (in place).

    Args:
        q: bf16 [T, Hq, 128], k, v: bf16 [T, Hkv, 128]: views of the fused QKV output are fine
            (last-dim stride 1, token/head strides free).
        q_norm, k_norm, cos, sin, eps, rope: as :func:`qk_norm_rope`.
        slot_mapping, k_cache, v_cache, k_scale, v_scale: as :func:`fp8_kv_write`.
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        q_out bf16 [T, Hq, 128] contiguous; k_cache / v_cache hold the new tokens.
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    """
    _check(q, k, q_norm, k_norm, cos, sin, rope)
    T, hkv, dev = k.shape[0], k.shape[1], q.device
    check_tensor("v", v, torch.bfloat16, (T, hkv, HEAD_DIM), dev, contiguous=False)
    if v.stride(2) != 1:
        raise ValueError(f"v: last dim must have stride 1, strides {v.stride()}")
    check_cache_args(slot_mapping, k_cache, v_cache, k_scale, v_scale, T, hkv, dev)
    if not rope:
        cos = sin = None
    args = (q, k, v, q_norm, k_norm, cos, sin, slot_mapping, k_cache, v_cache, k_scale, v_scale,
            float(eps), bool(rope))
    if interpret:
        return _launch(*args, True)
    return torch.ops.kolibri_plugins.qk_norm_rope_kv_write(*args)
