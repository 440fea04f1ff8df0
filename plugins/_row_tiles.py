"""Up to four 16-row tiles of activations per program in the GEMV kernels (fp8_gemv, nvfp4_gemv,
moe_route): one fp32 accumulator per tile, acc0..acc3, chosen by the compile-time tile index t.
Triton has no arrays of tensors, so the four are passed and returned together."""

from __future__ import annotations

from ._common import jit, tl


@jit
def dot_into(t: tl.constexpr, xt, w_t, acc0, acc1, acc2, acc3):
    """(acc0..acc3) with row tile t's accumulator advanced by tl.dot(xt, w_t)."""
    if t == 0:
        acc0 = tl.dot(xt, w_t, acc0)
    elif t == 1:
        acc1 = tl.dot(xt, w_t, acc1)
    elif t == 2:
        acc2 = tl.dot(xt, w_t, acc2)
    else:
        acc3 = tl.dot(xt, w_t, acc3)
    return acc0, acc1, acc2, acc3


@jit
def tile_acc(t: tl.constexpr, acc0, acc1, acc2, acc3):
    """Row tile t's accumulator."""
    return acc0 if t == 0 else (acc1 if t == 1 else (acc2 if t == 2 else acc3))
