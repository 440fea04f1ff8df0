"""Residual add + RMSNorm in one kernel (the decoder's `h = h + out; x = norm(h)` glue).

Maths (shared/spec/kolibri-1.md §Forward pass; the same lines as kolibri_trt.model.ops.rms_norm):
    h = bf16(x + r)                                  (fp32 sum rounded once, as torch's bf16 add)
    y = bf16((h * rsqrt(mean(h²) + eps)) * w)        (fp32 inside, h read back from its bf16)
Without a residual, h = x (nothing is written). One program per row; the row's reduction order
is a function of N only, so a row's bits never depend on how many rows share the call.
Layouts: plugins/LAYOUTS.md (norms).
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import early_launch, pdl_enter, pdl_release


@jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, sx, sr, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr,
                         PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK)
    m = n < N
    x = tl.load(x_ptr + t * sx + n, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + t * sr + n, mask=m, other=0.0).to(tl.float32)
        hb = (x + r).to(tl.bfloat16)
        tl.store(h_ptr + t * N + n, hb, mask=m)
        x = hb.to(tl.float32)
    ms = tl.sum(x * x, 0) * (1.0 / N)  # torch's mean: fp32 sum times the fp32 factor 1/N
    w = tl.load(w_ptr + n, mask=m, other=0.0).to(tl.float32)
    y = (x * tl.math.rsqrt(ms + eps)) * w
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    tl.store(y_ptr + t * N + n, y.to(tl.bfloat16), mask=m)


@jit
def rms_norm_row(h_ptr, w_ptr, t, eps, N: tl.constexpr, BLOCK: tl.constexpr):
    """fp32 [BLOCK] (zero past N): bf16 row t of h [*, N] (contiguous) read back, then
    ``(h * rsqrt(mean(h²) + eps)) * w``, this file's maths, for kernels that write h first
    (fp8_gemv_add_rms_norm): the row read back as bf16 is summed as `_add_rms_norm_kernel`
    sums it (the same bits on the H200); a barrier before the call makes h visible."""
    n = tl.arange(0, BLOCK)
    m = n < N
    x = tl.load(h_ptr + t * N + n, mask=m, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, 0) * (1.0 / N)
    w = tl.load(w_ptr + n, mask=m, other=0.0).to(tl.float32)
    return (x * tl.math.rsqrt(ms + eps)) * w


def norm_config(n: int) -> dict:
    """Launch settings of a row-per-program norm over n columns (BLOCK, num_warps): the ones
    add_rms_norm launches with, for the kernels that end in `rms_norm_row`."""
    block = next_pow2(n)
    return dict(BLOCK=block, num_warps=8 if block >= 2048 else 4)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """kolibri_trt.model.ops.rms_norm, line for line (plugins never import kolibri_trt)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y * weight.float()
    return y.to(x.dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of :func:`add_rms_norm`: ``h = x + residual`` (bf16 torch add) and
    ``ops.rms_norm(h, weight, eps)``; bit-identical to that composition. h is x itself when
    residual is None."""
    h = x if residual is None else x + residual
    return h, _rms_norm(h, weight, eps)


@torch.library.custom_op(f"{NAMESPACE}::add_rms_norm", mutates_args=())
def _add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel_path(x, "add_rms_norm") == "ref":
        return add_rms_norm_ref(x, residual, weight, eps)
    return launch_add_rms_norm(x, residual, weight, eps, False)


@_add_rms_norm_op.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)  # new_empty: contiguous


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if kernel_path(x, "rms_norm") == "ref":
        return _rms_norm(x, weight, eps)
    return launch_add_rms_norm(x, None, weight, eps, False)[1]


@_rms_norm_op.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


def launch_add_rms_norm(x, residual, weight, eps, interpret):
    """The kernel launch without argument checks or op dispatch (checked arguments, as
    :func:`add_rms_norm`); returns (h, y), h is x when residual is None."""
    T, N = x.shape
    y = torch.empty((T, N), dtype=torch.bfloat16, device=x.device)
    h = x if residual is None else torch.empty((T, N), dtype=torch.bfloat16, device=x.device)
    if T:
        r = x if residual is None else residual  # never read without HAS_RES
        launch(_add_rms_norm_kernel, (T,), x, r, weight, h, y, x.stride(0), r.stride(0),
               float(eps), N=N, HAS_RES=residual is not None, **norm_config(N),
               enable_fp_fusion=False, interpret=interpret, pdl_early=early_launch("norm", T))
    return h, y


def add_rms_norm(x, residual, weight, eps: float = 1e-6, interpret: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Optional residual add, then RMSNorm with gain, per row.

    Args:
        x: bf16 [T, N] (last dim stride 1; row stride free): the residual stream.
        residual: bf16 [T, N] (same stride rule) added to x, or None (h = x, nothing written).
        weight: bf16 [N] contiguous, the norm gain.
        eps: RMS epsilon (config rms_norm_eps).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        (h, y): h = bf16(x + residual) [T, N] contiguous (x itself without a residual);
        y = bf16(h·rsqrt(mean(h²) + eps)·weight) [T, N] contiguous, fp32 inside.
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: shared/spec/kolibri-1.md §Forward pass (RMSNorm, residual stream); the maths of
    kolibri_trt.model.ops.rms_norm.
    """
    check_tensor("x", x, torch.bfloat16, (None, None), contiguous=False)
    T, N = x.shape
    dev = x.device
    if x.stride(1) != 1:
        raise ValueError(f"x: last dim must have stride 1, strides {x.stride()}")
    if residual is not None:
        check_tensor("residual", residual, torch.bfloat16, (T, N), dev, contiguous=False)
        if residual.stride(1) != 1:
            raise ValueError(f"residual: last dim must have stride 1, strides {residual.stride()}")
    check_tensor("weight", weight, torch.bfloat16, (N,), dev)
    if interpret:
        return launch_add_rms_norm(x, residual, weight, eps, True)
    if residual is None:
        return x, torch.ops.kolibri_plugins.rms_norm(x, weight, float(eps))
    return torch.ops.kolibri_plugins.add_rms_norm(x, residual, weight, float(eps))
