"""An FP8 GEMV and the residual add + RMSNorm after it, the split-K sum and the norm in one
launch: the decoder's ``h = h + o_proj(a); x = post_attention_layernorm(h)``.

    p[s] = x · Wᵀ over K range s              fp8_gemv's main kernel (plugins/_split_k.py)
    o    = bf16(scale · Σ_s p[s])              s = 0..S-1 in order (fp8_gemv's reduce)
    h    = bf16(residual + o)                  (add_rms_norm)
    y    = bf16((h · rsqrt(mean(h²) + eps)) · gain)

This file's kernel does the last three lines, one program per row: it replaces fp8_gemv's
split-K reduce and the add_rms_norm launch after it (one launch per decoder layer fewer). The
maths and the orders are theirs, so the result is add_rms_norm(residual, fp8_gemv(x, W, s),
gain) (h then read back as bf16 for the norm, as add_rms_norm's kernel holds it). Shapes that
fp8_gemv does not split (``fp8_gemv.split_k_for`` 1) launch fp8_gemv then add_rms_norm: the
same maths in two launches. Source: shared/spec/kolibri-1.md §Forward pass.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, tl
from ._common import early_launch, pdl_enter, pdl_release
from ._gemv_reduce import scaled_sum
from .add_rms_norm import add_rms_norm_ref, launch_add_rms_norm, norm_config, rms_norm_row
from .fp8_gemv import (NO_FUSION, check_args, fp8_gemv_ref, launch_fp8_gemv, launch_partials,
                       scale_mode)


@jit
def _splitk_add_rms_norm_kernel(p_ptr, s_ptr, r_ptr, g_ptr, h_ptr, y_ptr, M, sr_m, eps,
                                N: tl.constexpr, MODE: tl.constexpr, SPLIT: tl.constexpr,
                                BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    """Row t = program_id(0): o = bf16(scale·Σ_s p[s, t]) (MODE 0 per tensor, 1 per channel,
    2 block scales, already applied: 1), h[t] = bf16(r[t] + o), y[t] = norm(h[t])."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK)
    m = n < N
    o = scaled_sum(p_ptr, s_ptr, t * N + n, n, m, M * N, SPLIT, MODE)
    o = o.to(tl.bfloat16).to(tl.float32)
    r = tl.load(r_ptr + t * sr_m + n, mask=m, other=0.0).to(tl.float32)
    tl.store(h_ptr + t * N + n, (r + o).to(tl.bfloat16), mask=m)
    tl.debug_barrier()    # h written by every thread of the program before it is read back
    y = rms_norm_row(h_ptr, g_ptr, t, eps, N, BLOCK)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    tl.store(y_ptr + t * N + n, y.to(tl.bfloat16), mask=m)


def fp8_gemv_add_rms_norm_ref(x, weight, weight_scale, residual, norm_weight, eps):
    """Torch reference: add_rms_norm_ref(residual, fp8_gemv_ref(x, weight, weight_scale),
    norm_weight, eps); returns (h, y), bf16 [M, N] each."""
    return add_rms_norm_ref(residual, fp8_gemv_ref(x, weight, weight_scale), norm_weight,
                                eps)


def _launch(x, weight, weight_scale, residual, norm_weight, eps, interpret):
    part = launch_partials(x, weight, weight_scale, interpret)
    if part is None:    # an unsplit shape: the GEMV's own epilogue, then the norm
        y = launch_fp8_gemv(x, weight, weight_scale, NO_FUSION, interpret)
        return launch_add_rms_norm(residual, y, norm_weight, eps, interpret)
    M, N = residual.shape
    h = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    if M:
        launch(_splitk_add_rms_norm_kernel, (M,), part, weight_scale, residual, norm_weight, h,
               y, M, residual.stride(0), float(eps), N=N,
               MODE=scale_mode(weight, weight_scale), SPLIT=part.shape[0],
               **norm_config(N), enable_fp_fusion=False, interpret=interpret,
               pdl_early=early_launch("gemv", M))
    return h, y


@torch.library.custom_op(f"{NAMESPACE}::fp8_gemv_add_rms_norm", mutates_args=())
def _op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
        residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel_path(x, "fp8_gemv_add_rms_norm") == "ref":
        return fp8_gemv_add_rms_norm_ref(x, weight, weight_scale, residual, norm_weight, eps)
    return _launch(x, weight, weight_scale, residual, norm_weight, eps, False)


@_op.register_fake
def _(x, weight, weight_scale, residual, norm_weight, eps):
    return residual.new_empty(residual.shape), residual.new_empty(residual.shape)


def fp8_gemv_add_rms_norm(x, weight, weight_scale, residual, norm_weight, eps: float = 1e-6,
                          interpret: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm(residual, fp8_gemv(x, weight, weight_scale), norm_weight, eps)``, the
    split-K sum, residual add and norm in one launch (the module docstring).

    Args:
        x: bf16 [M, K] (last dim stride 1), weight: float8_e4m3fn [N, K], weight_scale: fp32
            (one element, [N] or [N, K/64]): as :func:`fp8_gemv` (plain, no fused options).
        residual: bf16 [M, N] (last dim stride 1): the residual stream h.
        norm_weight: bf16 [N] contiguous, the norm gain; eps: its epsilon (rms_norm_eps).
        interpret: run the Triton kernels in the interpreter on CPU tensors (tests only).
    Returns: (h, y): h = bf16(residual + bf16(x·(W·scale)ᵀ)) and y = RMSNorm(h)·gain, bf16
        [M, N] each, contiguous.
    Raises: ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kolibri-1.md §Forward pass; the maths of fp8_gemv and add_rms_norm.
    """
    check_args(x, weight, weight_scale)
    M, N = x.shape[0], weight.shape[0]
    check_tensor("residual", residual, torch.bfloat16, (M, N), x.device, contiguous=False)
    if residual.stride(1) != 1:
        raise ValueError(f"residual: last dim must have stride 1, strides {residual.stride()}")
    check_tensor("norm_weight", norm_weight, torch.bfloat16, (N,), x.device)
    if interpret:
        return _launch(x, weight, weight_scale, residual, norm_weight, eps, True)
    return torch.ops.kolibri_plugins.fp8_gemv_add_rms_norm(x, weight, weight_scale, residual,
                                                           norm_weight, float(eps))
