"""The MoE's combine, the residual add and the next RMSNorm in one kernel.

    out = bf16(Σ_i w[t, i]·o[t, i] + o[t, k])       i = 0..k-1 in slot order, fp32 (moe.py)
    h   = bf16(x + out)                              (add_rms_norm.py, the same lines)
    y   = bf16(h·rsqrt(mean(h²) + eps)·g)

The decoder's `h = h + moe(x); x = norm(h)` after `moe_forward_parts`: one launch instead of
moe_forward's combine kernel and add_rms_norm, and the MoE output never goes through memory.
Both steps are the shared @jit helpers of those two kernels (`combine_row`, `add_norm_row`),
so (h, y) are bit for bit add_rms_norm(x, moe_combine(...)). One program per row: the row's
reduction order depends on H only (batch invariant).
Source: shared/spec/kolibri-1.md §Forward pass (MoE output, residual stream, RMSNorm).
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import pdl_enter
from .add_rms_norm import add_norm_row, add_rms_norm_ref
from .moe import combine_row, moe_combine_ref


@jit
def _moe_combine_norm_kernel(o_ptr, w_ptr, x_ptr, g_ptr, h_ptr, y_ptr, sx, so_m, so_s, eps,
                             N: tl.constexpr, BLOCK: tl.constexpr, TOPK: tl.constexpr,
                             HAS_SHARED: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK)
    m = n < N
    out = combine_row(o_ptr, w_ptr, t, n, m, so_m, so_s, TOPK, HAS_SHARED)
    x = tl.load(x_ptr + t * sx + n, mask=m, other=0.0).to(tl.float32)
    add_norm_row(x, out.to(tl.bfloat16).to(tl.float32), g_ptr, h_ptr, y_ptr, t, n, m, eps, N,
                 True, PDL)


def moe_combine_norm_ref(parts: torch.Tensor, weights: torch.Tensor, x: torch.Tensor,
                         gain: torch.Tensor, eps: float, has_shared: bool
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of :func:`moe_combine_norm`: add_rms_norm_ref(x, moe_combine_ref(
    parts, weights, has_shared), gain, eps)."""
    return add_rms_norm_ref(x, moe_combine_ref(parts, weights, has_shared), gain, eps)


@torch.library.custom_op(f"{NAMESPACE}::moe_combine_norm", mutates_args=())
def _moe_combine_norm_op(parts: torch.Tensor, weights: torch.Tensor, x: torch.Tensor,
                         gain: torch.Tensor, eps: float, has_shared: bool
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel_path(x, "moe_combine_norm") == "ref":
        return moe_combine_norm_ref(parts, weights, x, gain, eps, has_shared)
    return _launch(parts, weights, x, gain, eps, has_shared, False)


@_moe_combine_norm_op.register_fake
def _(parts, weights, x, gain, eps, has_shared):
    return x.new_empty(x.shape), x.new_empty(x.shape)  # new_empty: contiguous


def _launch(parts, weights, x, gain, eps, has_shared, interpret):
    T, N = x.shape
    h = torch.empty((T, N), dtype=torch.bfloat16, device=x.device)
    y = torch.empty((T, N), dtype=torch.bfloat16, device=x.device)
    if T:
        block = next_pow2(N)
        launch(_moe_combine_norm_kernel, (T,), parts, weights, x, gain, h, y, x.stride(0),
               parts.stride(0), parts.stride(1), float(eps), N=N, BLOCK=block,
               TOPK=weights.shape[1], HAS_SHARED=bool(has_shared),
               num_warps=8 if block >= 2048 else 4, enable_fp_fusion=False, interpret=interpret)
    return h, y


def moe_combine_norm(parts, weights, x, gain, eps: float = 1e-6, has_shared: bool = True,
                     interpret: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE output (from :func:`moe_forward_parts`) added to the residual stream, then
    RMSNorm with gain, per row.

    Args:
        parts: fp32 [T, k+1, N] contiguous, moe_forward_parts' expert outputs (slot k the
            shared expert's, read only when has_shared).
        weights: fp32 [T, k] contiguous, its routing weights.
        x: bf16 [T, N] (last dim stride 1; row stride free): the residual stream.
        gain: bf16 [N] contiguous, the next norm's gain; eps: its RMS epsilon.
        has_shared: whether the MoE has a shared expert (slot k is added).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        (h, y), both bf16 [T, N] contiguous: h = bf16(x + moe_out), y = bf16(norm(h)·gain),
        where moe_out = moe_combine_ref(parts, weights, has_shared); the bits of
        add_rms_norm(x, moe_out, gain, eps).
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: shared/spec/kolibri-1.md §Forward pass.
    """
    check_tensor("x", x, torch.bfloat16, (None, None), contiguous=False)
    T, N = x.shape
    if x.stride(1) != 1:
        raise ValueError(f"x: last dim must have stride 1, strides {x.stride()}")
    check_tensor("weights", weights, torch.float32, (T, None), x.device)
    k = weights.shape[1]
    if k < 1:
        raise ValueError(f"weights: shape {tuple(weights.shape)} has no expert slot")
    check_tensor("parts", parts, torch.float32, (T, k + 1, N), x.device)
    check_tensor("gain", gain, torch.bfloat16, (N,), x.device)
    if interpret:
        return _launch(parts, weights, x, gain, eps, has_shared, True)
    return torch.ops.kolibri_plugins.moe_combine_norm(parts, weights, x, gain, float(eps),
                                                      bool(has_shared))
