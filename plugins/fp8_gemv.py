"""FP8 (e4m3) weight-only GEMM for small batches: y = x · wᵀ, bf16 activations, fp32 accumulation.

Three weight-scale layouts (plugins/LAYOUTS.md):
- per tensor: ``weight_scale`` fp32 one element (ModelOpt FP8 export, shared/notes/modelopt.md);
- per channel: fp32 [N];
- block 1×64 (the drafter body, shared/spec/block-drafter.md §Serving quantisation): fp32 [N, K/64].
e4m3 converts exactly to bf16, so the tensor cores see the stored values; per-tensor and
per-channel scales multiply the fp32 result once; block scales multiply the weights in registers
(fp32 product rounded to bf16: 2^-9 relative, far below e4m3's own 2^-4 step).

Batch invariance: 16-row dot tiles, fixed K order, tile config a function of N and K only.

Split-K (``split_k_for``; default 1 = the single-pass kernel): program (n-tile, m-tile, s) walks
K range s (plugins/_split_k.py) and stores fp32 partials [S, M, N] (block scales already applied
in registers); ``_fp8_gemv_reduce_kernel`` sums them in the order s = 0..S-1, applies the
per-tensor / per-channel scale and rounds to bf16. S is a function of (N, K) only.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, cdiv, check_tensor, jit, kernel_path, launch, tl
from ._split_k import k_range, num_splits, sum_splits

ROWS = 16
MAX_TILES = 4
SUB_K = 64          # block-scale width
BLOCK_K = 256       # K per step (one load, one dot)
BLOCK_N_MAX = 64
TUNE = dict(num_warps=4, num_stages=3)  # launch config (bench/plugins.py sweeps it)
SPLIT_K = None      # K splits: None = SPLIT_K_BY_SHAPE (else 1); an int forces it (sweeps, tests)
# (N, K) -> S where splitting won on the H200 at every batch (bench/plugins.py --only splitk_gemv,
# bench/results/h200-2026-11-30b): o_proj 2560x2560 M=1 10.5 -> 9.3 µs, M=64 26.4 -> 24.5 µs.
SPLIT_K_BY_SHAPE = {(2560, 2560): 3}
BLOCK_R = 1024      # columns per program of the split-K reduce
MODE_TENSOR, MODE_CHANNEL, MODE_BLOCK = 0, 1, 2


@jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, sx_m,
                     MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SUB_K: tl.constexpr, ROWS: tl.constexpr, MT: tl.constexpr,
                     DOT_F32: tl.constexpr, SPLIT: tl.constexpr = 1):
    """SPLIT > 1: y_ptr is the fp32 partial buffer [SPLIT, M, N]; program_id(2) the K range."""
    pid_n = tl.program_id(0)
    m0 = tl.program_id(1) * ROWS * MT
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    n64 = n.to(tl.int64)
    rows = tl.arange(0, ROWS)
    acc0 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    acc1 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    acc2 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    acc3 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    if SPLIT == 1:
        k_lo = 0
        k_hi = K
    else:
        k_lo, k_hi = k_range(K, tl.program_id(2), SPLIT, BLOCK_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kx = k0 + tl.arange(0, BLOCK_K)
        kmask = kx < K
        w = tl.load(w_ptr + n64[:, None] * K + kx[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0)
        if MODE == 2:  # block 1x64 scales applied in registers (weight·scale rounded to bf16)
            kb = k0 // SUB_K + tl.arange(0, BLOCK_K // SUB_K)
            bs = tl.load(s_ptr + n64[:, None] * (K // SUB_K) + kb[None, :],
                         mask=nmask[:, None] & (kb < K // SUB_K)[None, :], other=0.0)
            wf = tl.reshape(w.to(tl.float32), (BLOCK_N, BLOCK_K // SUB_K, SUB_K)) * bs[:, :, None]
            wb = tl.reshape(wf, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)
        else:
            wb = w.to(tl.bfloat16)
        w_t = tl.trans(wb.to(tl.float32) if DOT_F32 else wb)
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            xt = tl.load(x_ptr + m[:, None].to(tl.int64) * sx_m + kx[None, :],
                         mask=(m < M)[:, None] & kmask[None, :], other=0.0)
            if DOT_F32:
                xt = xt.to(tl.float32)
            if t == 0:
                acc0 = tl.dot(xt, w_t, acc0)
            elif t == 1:
                acc1 = tl.dot(xt, w_t, acc1)
            elif t == 2:
                acc2 = tl.dot(xt, w_t, acc2)
            else:
                acc3 = tl.dot(xt, w_t, acc3)
    if SPLIT == 1:
        if MODE == 0:
            scale = tl.load(s_ptr)
        elif MODE == 1:
            scale = tl.load(s_ptr + n64, mask=nmask, other=0.0)[None, :]
        else:
            scale = 1.0
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            out = acc0 if t == 0 else (acc1 if t == 1 else (acc2 if t == 2 else acc3))
            tl.store(y_ptr + m[:, None].to(tl.int64) * N + n64[None, :],
                     (out * scale).to(tl.bfloat16), mask=(m < M)[:, None] & nmask[None, :])
    else:  # unscaled fp32 partial of K range program_id(2)
        p_ptr = y_ptr + tl.program_id(2).to(tl.int64) * M * N
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            out = acc0 if t == 0 else (acc1 if t == 1 else (acc2 if t == 2 else acc3))
            tl.store(p_ptr + m[:, None].to(tl.int64) * N + n64[None, :], out,
                     mask=(m < M)[:, None] & nmask[None, :])


@jit
def _fp8_gemv_reduce_kernel(p_ptr, s_ptr, y_ptr, M, N, MODE: tl.constexpr, SPLIT: tl.constexpr,
                            BLOCK: tl.constexpr):
    """y[m, n] = bf16(scale · Σ_s p[s, m, n]), s = 0..SPLIT-1 in order; grid (M, N / BLOCK)."""
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    nmask = n < N
    offs = tl.program_id(0).to(tl.int64) * N + n
    out = sum_splits(p_ptr, offs, nmask, M * N, SPLIT)
    if MODE == 0:
        scale = tl.load(s_ptr)
    elif MODE == 1:
        scale = tl.load(s_ptr + n, mask=nmask, other=0.0)
    else:
        scale = 1.0
    tl.store(y_ptr + offs, (out * scale).to(tl.bfloat16), mask=nmask)


def fp8_dequantize_ref(weight, weight_scale) -> torch.Tensor:
    """e4m3 [N, K] + scale (one element, [N] or [N, K/64]) -> fp32 [N, K]."""
    w = weight.float()
    s = weight_scale.float()
    if s.numel() == 1:
        return w * s.reshape(())
    if s.dim() == 1:
        return w * s[:, None]
    return w * s.repeat_interleave(SUB_K, dim=1)[:, : w.shape[1]]


def fp8_gemv_ref(x, weight, weight_scale) -> torch.Tensor:
    """fp32 torch reference of :func:`fp8_gemv`; returns bf16 [M, N]."""
    return (x.float() @ fp8_dequantize_ref(weight, weight_scale).T).to(torch.bfloat16)


@torch.library.custom_op(f"{NAMESPACE}::fp8_gemv", mutates_args=())
def _fp8_gemv_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    if kernel_path(x, "fp8_gemv") == "ref":
        return fp8_gemv_ref(x, weight, weight_scale)
    return _launch(x, weight, weight_scale, False)


@_fp8_gemv_op.register_fake
def _(x, weight, weight_scale):
    return x.new_empty((x.shape[0], weight.shape[0]))


def block_n_for(n: int) -> int:
    """Rows of weight per program: a function of N only (batch invariance), >= ~2 programs/SM."""
    bn = BLOCK_N_MAX
    while bn > 16 and cdiv(n, bn) < 264:
        bn //= 2
    return bn


def split_k_for(n: int, k: int) -> int:
    """K splits asked for (a function of N and K only: batch invariance); the launch drops empty
    ranges (_split_k.num_splits)."""
    if SPLIT_K is not None:
        return SPLIT_K
    return SPLIT_K_BY_SHAPE.get((n, k), 1)


def scale_mode(weight, weight_scale) -> int:
    if weight_scale.numel() == 1 and weight_scale.dim() <= 1:
        return MODE_TENSOR
    if weight_scale.dim() == 1:
        return MODE_CHANNEL
    return MODE_BLOCK


def _launch(x, weight, weight_scale, interpret):
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    if M == 0 or N == 0:
        return y
    mt = min(MAX_TILES, cdiv(M, ROWS))
    bn = block_n_for(N)
    mode = scale_mode(weight, weight_scale)
    split = num_splits(K, split_k_for(N, K), BLOCK_K)
    grid = (cdiv(N, bn), cdiv(M, ROWS * mt))
    if split == 1:
        launch(_fp8_gemv_kernel, grid, x, weight, weight_scale, y, M, N, K, x.stride(0),
               MODE=mode, BLOCK_N=bn, BLOCK_K=BLOCK_K, SUB_K=SUB_K, ROWS=ROWS, MT=mt,
               DOT_F32=interpret, interpret=interpret, **TUNE)
        return y
    part = torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    launch(_fp8_gemv_kernel, grid + (split,), x, weight, weight_scale, part, M, N, K, x.stride(0),
           MODE=mode, BLOCK_N=bn, BLOCK_K=BLOCK_K, SUB_K=SUB_K, ROWS=ROWS, MT=mt,
           DOT_F32=interpret, SPLIT=split, interpret=interpret, **TUNE)
    launch(_fp8_gemv_reduce_kernel, (M, cdiv(N, BLOCK_R)), part, weight_scale, y, M, N, MODE=mode,
           SPLIT=split, BLOCK=BLOCK_R, num_warps=4, interpret=interpret)
    return y


def fp8_gemv(x, weight, weight_scale, interpret: bool = False) -> torch.Tensor:
    """y = x · (weight · scale)ᵀ for an e4m3 weight, small batches.

    Args:
        x: bf16 [M, K] (last dim stride 1; row stride free).
        weight: float8_e4m3fn [N, K], contiguous.
        weight_scale: fp32, contiguous: one element (0-dim or [1]) = per tensor; [N] = per
            channel; [N, K/64] = block 1×64 (K % 64 == 0).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns: bf16 [M, N], fp32 accumulation.
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/notes/modelopt.md (FP8 export), block-drafter.md §Serving quantisation.
    """
    check_tensor("x", x, torch.bfloat16, (None, None), contiguous=False)
    if x.stride(1) != 1:
        raise ValueError(f"x: last dim must have stride 1, strides {x.stride()}")
    M, K = x.shape
    check_tensor("weight", weight, torch.float8_e4m3fn, (None, K), x.device)
    N = weight.shape[0]
    check_tensor("weight_scale", weight_scale, torch.float32, None, x.device)
    if weight_scale.dim() == 2:
        if K % SUB_K:
            raise ValueError(f"weight_scale: block scales need K % {SUB_K} == 0, K = {K}")
        check_tensor("weight_scale", weight_scale, torch.float32, (N, K // SUB_K), x.device)
    elif weight_scale.numel() != 1 and tuple(weight_scale.shape) != (N,):
        raise ValueError(f"weight_scale: shape {tuple(weight_scale.shape)}, expected one element, "
                         f"[{N}] or [{N}, {K // SUB_K}]")
    if interpret:
        return _launch(x, weight, weight_scale, True)
    return torch.ops.kolibri_plugins.fp8_gemv(x, weight, weight_scale)
