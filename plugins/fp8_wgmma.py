"""FP8 (per-tensor scale) GEMM on Hopper's wgmma for every row count: QKV and o_proj.

y = bf16(scale · x · Wᵀ) with W e4m3 [N, K] stored with each block of BK = 128 columns
permuted (`to_wgmma_storage`, once, at load time; on disk the ModelOpt layout stays), so that
the kernel's 16-byte shared-memory reads, decoded in registers, are wgmma's register A operand
after a relabelling (plugins/_wgmma_gluon.py); x is wgmma's B. The kernel is Gluon
(plugins/_fp8_wgmma_gluon.py), imported at launch: Triton >= 3.6 and an sm_90 GPU; on CPU the
op runs `fp8_wgmma_ref`.

Sums: fp32, K in steps of 128 in order within each of SPLIT K ranges (`split_for`, a function
of (N, K) only), the ranges summed in the order s = 0..SPLIT-1: by each tile's last program
(FIXUP, a counter per tile) up to FIXUP_ROWS rows, past them by fp8_gemv's reduce launch (the
same order: the same bits, H200 bench/results/h200-2026-12-02e/gw3/). A row's bits do not
depend on the batch (row 0 alone and inside 16 / 64 / 144 rows bit-identical, `gw3/`) but
differ from fp8_gemv's (mma.sync): a model takes one of the two for every row count of a shape.
H200 (the probe's form, `gw3/`), µs at 1 / 16 / 64 / 144 rows: QKV 3584x2560 5.4 / 7.5 / 12.1
/ 25.5 (fp8_gemv) -> 5.9 / 6.9 / 9.0 / 17.9; o_proj 2560x2560 5.2 / 7.3 / 10.6 / 20.1 -> 5.4
/ 6.4 / 8.5 / 16.5; as this plugin the same (`fw/`: gpu_check fp8wg 9/9).
"""

from __future__ import annotations

import torch

from ._common import (NAMESPACE, check_scalar_tensor, check_tensor, early_launch, kernel_path,
                      launch, require_triton)
from .fp8_gemv import fp8_gemv_ref

BK = 128          # K per step: the permutation's block
BLOCK_N = 64      # weight rows per program (one warpgroup's m64)
SPLIT_BY_SHAPE = {(3584, 2560): 4, (2560, 2560): 5}   # (N, K) -> K ranges (gw3/); else 1
FIXUP_ROWS = 16   # up to this many rows the K ranges are summed in the launch (gw3/)
STAGES = 4        # ring buffers
ASYNC = True      # each wgmma runs on over the next step's copies and shared reads
MAX_TILES = 4096  # FIXUP counters per device and stream: (N / 64) · (M / 8) tiles at most


def to_wgmma_storage(w: torch.Tensor, bk: int = BK) -> torch.Tensor:
    """W [N, K] (e4m3, or any 1-byte dtype) -> the same bytes with each block of bk columns
    permuted: storage column s of a block holds logical column k(s), the inverse of the
    kernel's relabelling (exact: bytes move). Raises ValueError if K % bk != 0."""
    if w.dim() != 2 or w.element_size() != 1 or w.shape[1] % bk or bk not in (128, 256):
        raise ValueError(f"w: a 1-byte [N, K] tensor with K % {bk} == 0 (bk 128 or 256), got "
                         f"{w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    if w.is_cuda:
        _counters(w.device)
    blocks = w.view(torch.uint8).view(n, k // bk, bk)
    return blocks[:, :, _source_columns(bk, w.device)].reshape(n, k).view(w.dtype).contiguous()


def _source_columns(bk: int, device) -> torch.Tensor:
    """int64 [bk]: the logical column held by storage column s of a block (its bits i hold K
    bits (k1, k8, k16, ..., k_bk/2, k2, k4)[i], `_to_logical`'s order)."""
    nb = bk.bit_length() - 1
    store_bits = [0] + list(range(3, nb)) + [1, 2]
    return torch.tensor([sum(((s >> i) & 1) << store_bits[i] for i in range(nb))
                         for s in range(bk)], device=device)


def from_wgmma_storage(stored: torch.Tensor, bk: int = BK) -> torch.Tensor:
    """The inverse of `to_wgmma_storage`."""
    n, k = stored.shape
    inverse = torch.argsort(_source_columns(bk, stored.device))
    blocks = stored.view(torch.uint8).view(n, k // bk, bk)
    return blocks[:, :, inverse].reshape(n, k).view(stored.dtype)


def relabelled_columns(bk: int = BK) -> torch.Tensor:
    """int64 [bk]: the logical K column that the kernel's column c of a step holds after
    `_to_logical` (the same reshape and permute, in torch) reads `to_wgmma_storage`'s bytes;
    the identity when every column meets its own weight (tests/plugins/test_fp8_wgmma.py)."""
    nb = bk.bit_length() - 1
    perm = {128: (0, 3, 4, 5, 6, 1, 2, 7), 256: (0, 3, 4, 5, 6, 7, 1, 2, 8)}[bk]
    came_from = torch.arange(bk).reshape([1] + [2] * nb).permute(perm).reshape(bk)
    return _source_columns(bk, "cpu")[came_from]


def split_for(n: int, k: int) -> int:
    """K ranges of an (N, K) weight (SPLIT_BY_SHAPE, else 1): never a function of the batch."""
    return SPLIT_BY_SHAPE.get((n, k), 1)


def fp8_wgmma_ref(x, w_stored, scale) -> torch.Tensor:
    """Plain torch: fp8_gemv_ref on W in ModelOpt's order (fp32 sums, bf16 out)."""
    return fp8_gemv_ref(x, from_wgmma_storage(w_stored), scale)


@torch.library.custom_op(f"{NAMESPACE}::fp8_wgmma", mutates_args=())
def _fp8_wgmma_op(x: torch.Tensor, w_stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if kernel_path(x, "fp8_wgmma") == "ref":
        return fp8_wgmma_ref(x, w_stored, scale)
    return _launch(x, w_stored, scale)


@_fp8_wgmma_op.register_fake
def _(x, w_stored, scale):
    return x.new_empty((x.shape[0], w_stored.shape[0]))


_COUNTERS: dict = {}


def _counters(device) -> torch.Tensor:
    """int32 [MAX_TILES] zeros for FIXUP on this device, kept zero by each tile's last program
    (so launches in order on any stream, or replayed in CUDA graphs, may share them; two
    fp8_wgmma launches running at once on two streams may not). Made by `to_wgmma_storage`
    for a CUDA weight (at load, outside any graph capture), else on first use."""
    key = torch.device(device).index if torch.device(device).index is not None \
        else torch.cuda.current_device()
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(MAX_TILES, dtype=torch.int32, device=f"cuda:{key}")
    return _COUNTERS[key]


def _launch(x, w_stored, scale) -> torch.Tensor:
    require_triton("fp8_wgmma")
    if torch.cuda.get_device_capability(x.device)[0] != 9:
        raise RuntimeError(f"fp8_wgmma: wgmma needs an sm_90 GPU, {x.device} is not one")
    from ._fp8_wgmma_gluon import _wgmma_gemv
    from ._gemv_fusion import NO_FUSION
    from ._gemv_reduce import launch_reduce
    from ._wgmma_gluon import row_segments, storage_layout
    M, K = x.shape
    N = w_stored.shape[0]
    split = split_for(N, K)
    fixup = split > 1 and M <= FIXUP_ROWS
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    part = y if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    cnt = _counters(x.device) if fixup else part
    for m0, mt, tiles in row_segments(M):
        launch(_wgmma_gemv, (N // BLOCK_N, tiles, split),
               w_stored, x, scale, y, part, cnt, M, N, K, K // split, m0, MT=mt, BK=BK,
               SPLIT=split, WL=storage_layout(BK), STAGES=STAGES, ASYNC=ASYNC, FIXUP=fixup,
               num_warps=4, pdl_early=early_launch("gemv", M))
    if split > 1 and not fixup:
        launch_reduce(part, scale, y, NO_FUSION, 0, False)
    return y


def fp8_wgmma(x, w_stored, scale) -> torch.Tensor:
    """y = bf16(scale · x · Wᵀ) for W stored by `to_wgmma_storage`, at any row count.

    Args:
        x: bf16 [M, K], contiguous; K % (128 · split_for(N, K)) == 0.
        w_stored: float8_e4m3fn [N, K] from `to_wgmma_storage`, contiguous, N % 64 == 0.
        scale: fp32 one-element tensor (per-tensor scale).
    Returns: bf16 [M, N], fp32 accumulation (module docstring: the order).
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError on CUDA without Triton or on a GPU other than sm_90.
    Source: plugins/NOTES.md "GEMVs on wgmma"; shared/spec/kolibri-1.md (FP8 body).
    """
    check_tensor("x", x, torch.bfloat16, (None, None))
    M, K = x.shape
    check_tensor("w_stored", w_stored, torch.float8_e4m3fn, (None, K), x.device)
    N = w_stored.shape[0]
    if N % BLOCK_N or K % (BK * split_for(N, K)):
        raise ValueError(f"w_stored: N = {N} must be a multiple of {BLOCK_N} and K = {K} of "
                         f"{BK * split_for(N, K)} (BK x the shape's K ranges)")
    if (N // BLOCK_N) * -(-min(M, FIXUP_ROWS) // 8) > MAX_TILES:
        raise ValueError(f"w_stored: N = {N} has more tiles than the FIXUP counters hold")
    check_scalar_tensor("scale", scale, x.device)
    if M == 0:
        return x.new_empty((0, N))
    return _fp8_wgmma_op(x, w_stored, scale)
