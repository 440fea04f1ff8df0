"""Write new keys and values into an FP8 paged cache (sliding layers; full layers in FP8).

For every new token t with ``slot_mapping[t] >= 0``: ``cache[slot] = e4m3(clamp(x / scale))``
for K and V, all KV heads. A negative slot means "do not write" (padding rows of a CUDA-graph
bucket), the same rule as ``qk_norm_fold_int4``. Layout: plugins/LAYOUTS.md (FP8 sliding layers).
"""

from __future__ import annotations

import torch

from ._common import (NAMESPACE, check_scalar_tensor, check_tensor, jit, kernel_path, launch,
                      next_pow2, tl)
from ._common import early_launch, pdl_enter, pdl_release

HEAD_DIM = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@jit
def _fp8_kv_write_kernel(k_ptr, v_ptr, slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
                         sk_t, sk_h, sv_t, sv_h, HKV,
                         HKV_P: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    h = tl.arange(0, HKV_P)
    d = tl.arange(0, D)
    ok = (h[:, None] < HKV) & (slot >= 0)
    k = tl.load(k_ptr + t * sk_t + h[:, None] * sk_h + d[None, :], mask=ok, other=0.0)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    fp8_store_heads(k.to(tl.float32), slot, kc_ptr, ks_ptr, h, d, ok, HKV, D)
    v = tl.load(v_ptr + t * sv_t + h[:, None] * sv_h + d[None, :], mask=ok, other=0.0)
    fp8_store_heads(v.to(tl.float32), slot, vc_ptr, vs_ptr, h, d, ok, HKV, D)


@jit
def fp8_store_heads(x, slot, c_ptr, s_ptr, h, d, ok, HKV, D: tl.constexpr):
    """e4m3(clamp(x / scale, ±448)) of one token's heads x fp32 [HKV_P, D] into the cache at
    `slot` (rows where ok). The one quantizer of every FP8 cache write."""
    q = tl.clamp(tl.math.div_rn(x, tl.load(s_ptr)), -448.0, 448.0)
    dst = slot * HKV * D + h[:, None] * D + d[None, :]
    tl.store(c_ptr + dst, q.to(tl.float8e4nv), mask=ok)


def fp8_kv_write_ref(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale) -> None:
    """Torch reference (in place): same rounding as the kernel (IEEE x / scale, clamp, e4m3 RNE)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        q = (x[keep].float() / scale.float()).clamp(-FP8_MAX, FP8_MAX)
        cache.view(-1, *cache.shape[2:])[slots] = q.to(torch.float8_e4m3fn)


@torch.library.custom_op(f"{NAMESPACE}::fp8_kv_write", mutates_args=("k_cache", "v_cache"))
def _fp8_kv_write_op(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                     v_scale: torch.Tensor) -> None:
    if kernel_path(k, "fp8_kv_write") == "ref":
        fp8_kv_write_ref(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale)
        return
    _launch(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale, False)


@_fp8_kv_write_op.register_fake
def _(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale):
    return None


def _launch(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale, interpret):
    T, hkv = k.shape[0], k.shape[1]
    if T:
        launch(_fp8_kv_write_kernel, (T,), k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale,
               k.stride(0), k.stride(1), v.stride(0), v.stride(1), hkv,
               HKV_P=max(2, next_pow2(hkv)), D=HEAD_DIM, num_warps=4, interpret=interpret,
               pdl_early=early_launch("norm", T))


def fp8_kv_write(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale,
                 interpret: bool = False) -> None:
    """Quantize new K/V to e4m3 with the layer's scales and store them at their slots (in place).

    Args:
        k, v: bf16 or fp32 [T, Hkv, 128] (last dim stride 1; token/head strides free).
        slot_mapping: int64 [T], physical slot = block*BLOCK + offset; negative = skip the token.
        k_cache, v_cache: float8_e4m3fn [num_blocks, BLOCK, Hkv, 128] contiguous.
        k_scale, v_scale: fp32 one-element tensors: stored = e4m3(clamp(x / scale, ±448)).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kv-cache.md (FP8 layers, per-layer scales).
    """
    dev = k.device
    check_tensor("k", k, (torch.bfloat16, torch.float32), (None, None, HEAD_DIM), contiguous=False)
    T, hkv = k.shape[0], k.shape[1]
    check_tensor("v", v, k.dtype, (T, hkv, HEAD_DIM), dev, contiguous=False)
    for name, x in (("k", k), ("v", v)):
        if x.stride(2) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, strides {x.stride()}")
    check_cache_args(slot_mapping, k_cache, v_cache, k_scale, v_scale, T, hkv, dev)
    if interpret:
        _launch(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale, True)
        return
    torch.ops.kolibri_plugins.fp8_kv_write(k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale)


def check_cache_args(slot_mapping, k_cache, v_cache, k_scale, v_scale, tokens: int, hkv: int,
                     device: torch.device) -> None:
    """The FP8 cache write's arguments besides k and v (ValueError naming the argument)."""
    check_tensor("slot_mapping", slot_mapping, torch.int64, (tokens,), device)
    check_tensor("k_cache", k_cache, torch.float8_e4m3fn, (None, None, hkv, HEAD_DIM), device)
    check_tensor("v_cache", v_cache, torch.float8_e4m3fn, tuple(k_cache.shape), device)
    check_scalar_tensor("k_scale", k_scale, device)
    check_scalar_tensor("v_scale", v_scale, device)
