"""NVFP4 weight-only GEMM on Hopper's wgmma for every row count (LM head, drafter head slice).

y = x · wᵀ with w in ModelOpt's NVFP4 format (plugins/nvfp4_gemv.py), the weight's packed
bytes stored permuted within each block of 128 bytes (`to_wgmma_storage`, once, at load time;
the on-disk layout stays ModelOpt's) so that the kernel's 16-byte shared-memory reads, decoded
in registers, are wgmma's register A operand after a relabelling (plugins/_wgmma_gluon.py);
x is wgmma's B. The kernel is Gluon (plugins/_nvfp4_wgmma_gluon.py), imported at launch: it
needs Triton >= 3.6 and an sm_90 GPU; on CPU the op runs `nvfp4_wgmma_ref`.

Sums: fp32, K in steps of 256 in order, one program per 64 weight rows and power-of-two tile
of rows (`row_segments`); a row's bits do not depend on how many rows are in the batch (H200:
row 0 alone and inside 16 / 64 / 144 rows bit-identical, bench/results/h200-2026-12-02e/gn3/)
but differ from nvfp4_gemv's (mma.sync, h200-2026-12-02d/wb/): a model takes one of the two
for every row count. H200, µs at 1 / 16 / 64 / 144 rows, LM head 131072x2560: nvfp4_gemv 61.0
/ 78.1 / 238.2 / 695.0, this kernel's form in the probe 67.0 / 72.8 / 121.1 / 341.9 (`gn3/`).
"""

from __future__ import annotations

import torch

from ._common import (NAMESPACE, check_scalar_tensor, check_tensor, early_launch, kernel_path,
                      launch, require_triton)
from .nvfp4_gemv import nvfp4_gemv_ref

BLOCK_BYTES = 128    # a K step of 256 values: the permutation's block
PAIR_BITS = (2, 3, 4, 5, 6, 0, 1)   # the pair index bit held by storage byte bit i
STAGES = 2    # ring buffers (H200, gn3/: 4 -> 2 at 64 rows 186.7 -> 121.1 µs, one row 69.5 -> 67.0)


def _source_pairs(device) -> torch.Tensor:
    """int64 [128]: storage byte b of a block holds pair Σ_i bit_i(b) << PAIR_BITS[i]."""
    return torch.tensor([sum(((b >> i) & 1) << PAIR_BITS[i] for i in range(7))
                         for b in range(BLOCK_BYTES)], device=device)


def to_wgmma_storage(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] packed pairs (ModelOpt order) -> the same bytes with each block of 128
    permuted for the kernel (exact: bytes move). Raises ValueError if K/2 is not a multiple of
    128 or the dtype is not uint8."""
    if weight.dtype != torch.uint8 or weight.dim() != 2 or weight.shape[1] % BLOCK_BYTES:
        raise ValueError(f"weight: uint8 [N, K/2] with K/2 % {BLOCK_BYTES} == 0, got "
                         f"{weight.dtype} {tuple(weight.shape)}")
    n, kb = weight.shape
    src = _source_pairs(weight.device)
    return weight.view(n, kb // BLOCK_BYTES, BLOCK_BYTES)[:, :, src].reshape(n, kb).contiguous()


def from_wgmma_storage(stored: torch.Tensor) -> torch.Tensor:
    """The inverse of `to_wgmma_storage`: uint8 [N, K/2] in ModelOpt's order."""
    n, kb = stored.shape
    inverse = torch.argsort(_source_pairs(stored.device))
    return stored.view(n, kb // BLOCK_BYTES, BLOCK_BYTES)[:, :, inverse].reshape(n, kb)


def relabelled_columns() -> torch.Tensor:
    """int64 [256]: the logical K column that the kernel's column c of a step holds after the
    decode, the join of the low and high nibbles and `_to_logical` at BK 256 (the same
    reshape and permute, in torch), given `to_wgmma_storage`'s bytes. The identity when the
    relabelling pairs every column with its own weight (tests/plugins/test_nvfp4_wgmma.py)."""
    joined = torch.arange(256).reshape([1] + [2] * 8).permute(0, 3, 4, 5, 6, 7, 1, 2, 8)
    joined = joined.reshape(256)                 # logical k <- joined column 2b + nibble
    pair = _source_pairs("cpu")[joined // 2]
    return pair * 2 + joined % 2


def nvfp4_wgmma_ref(x, weight_stored, weight_scale, weight_scale_2) -> torch.Tensor:
    """Plain torch: nvfp4_gemv_ref on the weight in ModelOpt's order (fp32 sums, bf16 out)."""
    return nvfp4_gemv_ref(x, from_wgmma_storage(weight_stored), weight_scale, weight_scale_2)


@torch.library.custom_op(f"{NAMESPACE}::nvfp4_wgmma", mutates_args=())
def _nvfp4_wgmma_op(x: torch.Tensor, weight_stored: torch.Tensor, weight_scale: torch.Tensor,
                    weight_scale_2: torch.Tensor) -> torch.Tensor:
    if kernel_path(x, "nvfp4_wgmma") == "ref":
        return nvfp4_wgmma_ref(x, weight_stored, weight_scale, weight_scale_2)
    return _launch(x, weight_stored, weight_scale, weight_scale_2)


@_nvfp4_wgmma_op.register_fake
def _(x, weight_stored, weight_scale, weight_scale_2):
    return x.new_empty((x.shape[0], weight_stored.shape[0]))


def _launch(x, weight_stored, weight_scale, weight_scale_2) -> torch.Tensor:
    require_triton("nvfp4_wgmma")
    major, _ = torch.cuda.get_device_capability(x.device)
    if major != 9:
        raise RuntimeError(f"nvfp4_wgmma: wgmma needs an sm_90 GPU, {x.device} is sm_{major}x")
    from ._nvfp4_wgmma_gluon import BCAST_LAYOUT, SCALE_LAYOUT, _wgmma_nvfp4
    from ._wgmma_gluon import row_segments, storage_layout
    M, K = x.shape
    N = weight_stored.shape[0]
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    for m0, mt, tiles in row_segments(M):
        launch(_wgmma_nvfp4, (-(-N // 64), tiles, 1),
               weight_stored, weight_scale, weight_scale_2, x, y, M, N, K, K // 2, K // 16,
               K // 256, m0, MT=mt, SPLIT=1, WB=storage_layout(BLOCK_BYTES), SL=SCALE_LAYOUT,
               L3=BCAST_LAYOUT, STAGES=STAGES, ASYNC=False, num_warps=4,
               pdl_early=early_launch("gemv", M))
    return y


def nvfp4_wgmma(x, weight_stored, weight_scale, weight_scale_2) -> torch.Tensor:
    """y = x · wᵀ for an NVFP4 weight stored by `to_wgmma_storage`, at any row count.

    Args:
        x: bf16 [M, K], contiguous, K % 256 == 0.
        weight_stored: uint8 [N, K/2] from `to_wgmma_storage`, contiguous;
        weight_scale: float8_e4m3fn [N, K/16], contiguous; weight_scale_2: fp32 one-element.
    Returns: bf16 [M, N], fp32 accumulation (module docstring: the order).
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError on CUDA without Triton or on a GPU other than sm_90.
    Source: shared/notes/modelopt.md (NVFP4 export); plugins/NOTES.md "GEMVs on wgmma".
    """
    check_tensor("x", x, torch.bfloat16, (None, None))
    M, K = x.shape
    if K % 256:
        raise ValueError(f"x: K = {K} must be a multiple of 256 (the kernel's K step)")
    check_tensor("weight_stored", weight_stored, torch.uint8, (None, K // 2), x.device)
    check_tensor("weight_scale", weight_scale, torch.float8_e4m3fn,
                 (weight_stored.shape[0], K // 16), x.device)
    check_scalar_tensor("weight_scale_2", weight_scale_2, x.device)
    if M == 0 or weight_stored.shape[0] == 0:
        return x.new_empty((M, weight_stored.shape[0]))
    return _nvfp4_wgmma_op(x, weight_stored, weight_scale, weight_scale_2)
