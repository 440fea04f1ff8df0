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
in registers); ``_gemv_reduce.launch_reduce`` sums them in the order s = 0..S-1, applies the
per-tensor / per-channel scale and rounds to bf16. S is a function of (N, K) only.

Fused prologue and epilogue (``fp8_gemv(..., norm=, act=, residual=)``, the drafter's glue:
an RMSNorm of x, a residual add, silu or SwiGLU over interleaved gate/up rows, each the bf16
torch op it replaces): the maths in plugins/_gemv_fusion.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import NAMESPACE, cdiv, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import early_launch, pdl_enter, pdl_release
from ._row_tiles import dot_into, tile_acc
from ._rows import linear_rows
from ._gemv_reduce import launch_reduce
from ._split_k import k_range, num_splits
from ._e4m3_decode import check_decode, e4m3_to_bf16
from ._k_blocks import check_k_blocks, k_blocks
from ._gemv_fusion import (ACTS, NO_FUSION, Fusion, _col_rstd, _store_out, check_fused,
                           dot_swapped, tile_rstds, x_rows)
from ._gemv_fusion import interleave_rows  # noqa: F401  (public here: the drafter's weights)
from .add_rms_norm import add_rms_norm_ref

ROWS = 16
# 16-row tiles per program (one: more programs; H200 QKV M=64 25.5 -> 22.1 µs, 2026-11-30k/kf/)
MAX_TILES = 1
# Plain per-tensor GEMVs past SWAP_ROWS rows and at WIDE_ROWS: 32-wide N tiles, up to 4 row
# tiles per program, each weight decoded once (H200, the same bits: QKV M=64 21.1 -> 13.1 µs,
# h200-2026-12-01b/np/tiles.log). Block scales and fused forms: not timed so.
WIDE_TILES = (32, 4)    # (N tile, row tiles per program)
SUB_K = 64          # block-scale width
BLOCK_K = 256       # K per step (one load, one dot)
BLOCK_N_MAX = 64
TUNE = dict(num_warps=4, num_stages=3)  # launch config (bench/plugins.py sweeps it)
DECODE = 3          # e4m3 -> bf16 on the GPU: 1 Triton's conversion, 3 bit placement (_e4m3_decode)
# At most SWAP_ROWS rows (0: never) without a norm compute y^T = W·x^T, the weight tile the
# MMA's A operand and the rows its N (one row tile per program, SWAP_TILES; the same bits).
# H200, QKV at 1 / 64 / 144 rows 9.0 / 13.0 / 37.4 -> 7.0 / 12.1 / 22.2 µs (plugins/NOTES.md).
SWAP_ROWS = 144
# (up to M rows, rows per tile, num_warps, num_stages) of the swapped kernel, by M
SWAP_TILES = ((8, 8, 1, 5), (32, 16, 1, 3), (64, 32, 1, 3), (144, 16, 1, 3))
# Row counts at which plain per-tensor GEMVs keep WIDE_TILES though M <= SWAP_ROWS: full groups
# of 64 rows (QKV / o_proj at 128 rows 18.9 / 17.3 µs against 21.4 / 19.7 swapped, oj/)
WIDE_ROWS = (128,)
SPLIT_K = None      # K splits: None = SPLIT_K_BY_SHAPE (else 1); an int forces it (sweeps, tests)
# (N, K) -> S where splitting wins on the H200 at every batch (bench/plugins.py --only
# splitk_gemv). o_proj 2560x2560 took 3 until K blocks beat it (plugins/NOTES.md).
SPLIT_K_BY_SHAPE = {}
# Blocks per K step on as many warps (`_k_blocks`; other bits than one accumulator's), by (N, K)
# as split-K; None: K_BLOCKS_BY_SHAPE (else 1), an int forces it. H200, µs at 1 / 64 rows: QKV
# 7.1 / 12.1 -> 5.5 / 12.1, o_proj (3 K ranges) 6.6 / 11.7 -> 5.2 / 10.7 (h200-2026-12-02d/).
K_BLOCKS = None
K_BLOCKS_BY_SHAPE = {(3584, 2560): 2, (2560, 2560): 2}
MODE_TENSOR, MODE_CHANNEL, MODE_BLOCK = 0, 1, 2


@jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, g_ptr, r_ptr, ids_ptr, M, N, K, sx_m, sr_m,
                     s_ids, eps,
                     MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SUB_K: tl.constexpr, ROWS: tl.constexpr, MT: tl.constexpr,
                     DOT_F32: tl.constexpr, SPLIT: tl.constexpr = 1, NORM: tl.constexpr = 0,
                     NORM_P: tl.constexpr = 1, ACT: tl.constexpr = 0, RES: tl.constexpr = False,
                     X_ROWS: tl.constexpr = False, DECODE: tl.constexpr = 1,
                     SWAP: tl.constexpr = False, KB: tl.constexpr = 1,
                     PDL: tl.constexpr = 0):
    """SPLIT > 1: y_ptr is the fp32 partial buffer [SPLIT, M, N]; program_id(2) the K range.
    NORM > 0: x is NORM segments of K / NORM columns, each RMS-normalised over itself, g_ptr
    the bf16 gain [K] (NORM_P: next power of two); ACT / RES: the epilogue (`_store_out`);
    X_ROWS: x row ids[m] feeds output row m (`x_rows`). SWAP (MT 1, NORM 0): the tile as
    W·x^T (`dot_swapped`, SWAP_ROWS). KB > 1: each K step as KB blocks on KB warps, one
    accumulator [KB, ...] batch each, summed after the loop (`_k_blocks`, K_BLOCKS)."""
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    m0 = tl.program_id(1) * ROWS * MT
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    n64 = n.to(tl.int64)
    rows = tl.arange(0, ROWS)
    if KB == 1:
        acc0 = tl.zeros([BLOCK_N, ROWS] if SWAP else [ROWS, BLOCK_N], tl.float32)
        acc1 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    else:
        acc0 = tl.zeros([KB, BLOCK_N, ROWS] if SWAP else [KB, ROWS, BLOCK_N], tl.float32)
        acc1 = tl.zeros([KB, ROWS, BLOCK_N], tl.float32)
    acc2 = acc1
    acc3 = acc1
    if SPLIT == 1:
        k_lo = 0
        k_hi = K
    else:
        k_lo, k_hi = k_range(K, tl.program_id(2), SPLIT, BLOCK_K)
    # per row and segment rsqrt(mean(x²) + eps), whatever this program's K range
    rs0, rs1, rs2, rs3 = tile_rstds(x_ptr, ids_ptr, s_ids, m0, M, K, sx_m, eps, ROWS, MT,
                                    BLOCK_K, NORM, NORM_P, X_ROWS)
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
            wb = e4m3_to_bf16(w, DECODE)
        if SWAP:
            acc0 = dot_swapped(x_ptr, ids_ptr, wb, kx, kmask, m0 + rows, M, s_ids, sx_m, acc0,
                                X_ROWS, DOT_F32, KB)
        else:
            w_t = tl.trans(wb.to(tl.float32) if DOT_F32 else wb)
            for t in tl.static_range(MT):
                m = m0 + t * ROWS + rows
                xr = x_rows(ids_ptr, m, M, s_ids, X_ROWS)
                xt = tl.load(x_ptr + xr[:, None] * sx_m + kx[None, :],
                             mask=(m < M)[:, None] & kmask[None, :], other=0.0)
                if NORM > 0:
                    rs = rs0 if t == 0 else (rs1 if t == 1 else (rs2 if t == 2 else rs3))
                    gk = tl.load(g_ptr + kx, mask=kmask, other=0.0).to(tl.float32)
                    rk = _col_rstd(rs, kx, K, NORM, NORM_P)
                    xt = ((xt.to(tl.float32) * rk) * gk[None, :]).to(tl.bfloat16)
                if DOT_F32:
                    xt = xt.to(tl.float32)
                if KB > 1:
                    xt, w_b = k_blocks(xt, w_t, KB)
                    acc0, acc1, acc2, acc3 = dot_into(t, xt, w_b, acc0, acc1, acc2, acc3)
                else:
                    acc0, acc1, acc2, acc3 = dot_into(t, xt, w_t, acc0, acc1, acc2, acc3)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    if KB > 1:
        acc0, acc1, acc2, acc3 = tl.sum(acc0, 0), tl.sum(acc1, 0), tl.sum(acc2, 0), tl.sum(acc3, 0)
    if SWAP:
        acc0 = tl.trans(acc0)
    if SPLIT == 1:
        if MODE == 0:
            scale = tl.load(s_ptr)
        elif MODE == 1:
            scale = tl.load(s_ptr + n64, mask=nmask, other=0.0)[None, :]
        else:
            scale = 1.0
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            out = tile_acc(t, acc0, acc1, acc2, acc3)
            _store_out(y_ptr, r_ptr, out * scale, m, pid_n * BLOCK_N, M, N, sr_m, BLOCK_N, ACT,
                       RES)
    else:  # unscaled fp32 partial of K range program_id(2)
        p_ptr = y_ptr + tl.program_id(2).to(tl.int64) * M * N
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            out = tile_acc(t, acc0, acc1, acc2, acc3)
            tl.store(p_ptr + m[:, None].to(tl.int64) * N + n64[None, :], out,
                     mask=(m < M)[:, None] & nmask[None, :])


def fp8_dequantize_ref(weight, weight_scale) -> torch.Tensor:
    """e4m3 [N, K] + scale (one element, [N] or [N, K/64]) -> fp32 [N, K]."""
    w = weight.float()
    s = weight_scale.float()
    if s.numel() == 1:
        return w * s.reshape(())
    if s.dim() == 1:
        return w * s[:, None]
    return w * s.repeat_interleave(SUB_K, dim=1)[:, : w.shape[1]]


def fp8_gemv_ref(x, weight, weight_scale, fusion: Fusion = NO_FUSION) -> torch.Tensor:
    """fp32 torch reference of :func:`fp8_gemv`; returns bf16 [M, N] ([M, N/2] for swiglu): the
    torch ops the fused options replace, in order (the row gather, add_rms_norm_ref per
    segment, then side by side, the product, bf16 add, F.silu / F.silu(gate) * up)."""
    f = fusion
    if f.x_rows is not None:
        x = x.index_select(0, f.x_rows)
    if f.norm is not None:
        seg = x.shape[1] // f.norm_segments
        x = torch.cat([add_rms_norm_ref(x[:, i * seg:(i + 1) * seg], None,
                                        f.norm[i * seg:(i + 1) * seg], f.eps)[1]
                       for i in range(f.norm_segments)], 1)
    y = linear_rows(x.float(), fp8_dequantize_ref(weight, weight_scale)).to(torch.bfloat16)
    if f.act == "swiglu":
        return F.silu(y[:, 0::2]) * y[:, 1::2]
    if f.residual is not None:
        y = y + f.residual
    return F.silu(y) if f.act == "silu" else y


@torch.library.custom_op(f"{NAMESPACE}::fp8_gemv", mutates_args=())
def _fp8_gemv_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    if kernel_path(x, "fp8_gemv") == "ref":
        return fp8_gemv_ref(x, weight, weight_scale)
    return launch_fp8_gemv(x, weight, weight_scale, NO_FUSION, False)


@_fp8_gemv_op.register_fake
def _(x, weight, weight_scale):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::fp8_gemv_fused", mutates_args=())
def _fp8_gemv_fused_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       norm: torch.Tensor | None, eps: float, act: str,
                       residual: torch.Tensor | None, norm_segments: int,
                       x_rows: torch.Tensor | None) -> torch.Tensor:
    f = Fusion(norm, eps, act, residual, norm_segments, x_rows)
    if kernel_path(x, "fp8_gemv") == "ref":
        return fp8_gemv_ref(x, weight, weight_scale, f)
    return launch_fp8_gemv(x, weight, weight_scale, f, False)


@_fp8_gemv_fused_op.register_fake
def _(x, weight, weight_scale, norm, eps, act, residual, norm_segments, x_rows):
    n = weight.shape[0] // 2 if act == "swiglu" else weight.shape[0]
    return x.new_empty((x.shape[0] if x_rows is None else x_rows.shape[0], n))


def block_n_for(n: int) -> int:
    """Rows of weight per program: a function of N only (batch invariance), >= ~2 programs/SM."""
    bn = BLOCK_N_MAX
    while bn > 16 and cdiv(n, bn) < 264:
        bn //= 2
    return bn


def swap_tile(m: int) -> tuple[int, dict]:
    """(rows per tile, launch config) of the swapped kernel for m rows (SWAP_TILES; the first
    entry that holds m, else the last): tiles only group rows, so the bits never depend on it."""
    most, rows, warps, stages = next((t for t in SWAP_TILES if m <= t[0]), SWAP_TILES[-1])
    return rows, dict(num_warps=warps, num_stages=stages)


def _wide_form(f: Fusion, mode: int) -> bool:
    """Whether the 16-row form may take WIDE_TILES: plain per-tensor GEMVs only."""
    return f.plain and mode == MODE_TENSOR


def swapped(m: int, f: Fusion, mode: int) -> bool:
    """Whether m rows take the swapped form W·x^T (SWAP_ROWS, not with a norm, WIDE_ROWS for
    plain per-tensor GEMVs); both forms give the same bits."""
    if m > SWAP_ROWS or f.norm is not None:
        return False
    return not (m in WIDE_ROWS and _wide_form(f, mode))


def split_k_for(n: int, k: int) -> int:
    """K splits asked for (a function of N and K only: batch invariance); the launch drops empty
    ranges (_split_k.num_splits)."""
    return SPLIT_K_BY_SHAPE.get((n, k), 1) if SPLIT_K is None else SPLIT_K


def k_blocks_for(n: int, k: int) -> int:
    """Blocks per K step for an [n, k] weight (a function of N and K only: batch invariance);
    ValueError naming fp8_gemv.K_BLOCKS (or K_BLOCKS_BY_SHAPE) for a count `check_k_blocks`
    refuses."""
    kb = K_BLOCKS_BY_SHAPE.get((n, k), 1) if K_BLOCKS is None else K_BLOCKS
    check_k_blocks("fp8_gemv", kb, BLOCK_K)
    return kb


def scale_mode(weight, weight_scale) -> int:
    """MODE_TENSOR, MODE_CHANNEL or MODE_BLOCK for weight_scale's shape (checked: check_args)."""
    if weight_scale.numel() == 1 and weight_scale.dim() <= 1:
        return MODE_TENSOR
    if weight_scale.dim() == 1:
        return MODE_CHANNEL
    return MODE_BLOCK


def _launch_main(x, weight, weight_scale, f: Fusion, interpret, out, split):
    """The main kernel over [M, N] into ``out``: bf16 y (split 1) or fp32 partials [S, M, N]."""
    K, N = x.shape[1], weight.shape[0]
    M = x.shape[0] if f.x_rows is None else f.x_rows.shape[0]
    check_decode("fp8_gemv", DECODE)
    kb = k_blocks_for(N, K)
    mode = scale_mode(weight, weight_scale)
    swap = swapped(M, f, mode)
    rows, tune = swap_tile(M) if swap else (ROWS, TUNE)
    if kb > 1:
        tune = dict(tune, num_warps=kb)   # a warp per block: none repeats another's work
    wide = not swap and _wide_form(f, mode)
    mt = 1 if swap else min(WIDE_TILES[1] if wide else MAX_TILES, cdiv(M, rows))
    bn = WIDE_TILES[0] if wide else block_n_for(N)
    grid = (cdiv(N, bn), cdiv(M, rows * mt)) + ((split,) if split > 1 else ())
    nseg = 0 if f.norm is None else f.norm_segments
    # no FMA contraction when fused: the fused steps keep torch's separate roundings
    extra = {} if f.plain else dict(enable_fp_fusion=False)
    ids = x if f.x_rows is None else f.x_rows
    launch(_fp8_gemv_kernel, grid, x, weight, weight_scale, out,
           x if f.norm is None else f.norm, x if f.residual is None else f.residual, ids,
           M, N, K, x.stride(0), 0 if f.residual is None else f.residual.stride(0),
           0 if f.x_rows is None else f.x_rows.stride(0), float(f.eps), MODE=mode, BLOCK_N=bn,
           BLOCK_K=BLOCK_K, SUB_K=SUB_K, ROWS=rows, MT=mt, DOT_F32=interpret, NORM=nseg,
           DECODE=1 if interpret else DECODE, SWAP=swap, NORM_P=next_pow2(nseg),
           X_ROWS=f.x_rows is not None, interpret=interpret, SPLIT=split, KB=kb,
           ACT=ACTS.index(f.act) if split == 1 else 0,
           RES=f.residual is not None and split == 1, pdl_early=early_launch("gemv", M),
           **extra, **tune)


def launch_partials(x, weight, weight_scale, interpret: bool = False, f: Fusion = NO_FUSION):
    """fp32 partials [S, M, N] of x·Wᵀ (f's prologue applied) over the S K ranges of
    `split_k_for` (block scales applied, per-tensor / per-channel ones not), or None when not
    split (S = 1): `launch_reduce` or a kernel that finishes the sum (fp8_gemv_add_rms_norm)
    takes it from here. Arguments as :func:`fp8_gemv` (checked there)."""
    K, N = x.shape[1], weight.shape[0]
    split = num_splits(K, split_k_for(N, K), BLOCK_K)
    if split == 1:
        return None
    M = x.shape[0] if f.x_rows is None else f.x_rows.shape[0]
    part = torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    if part.numel():
        _launch_main(x, weight, weight_scale, f, interpret, part, split)
    return part


def launch_fp8_gemv(x, weight, weight_scale, f: Fusion, interpret):
    """The GEMV's launches without argument checks or op dispatch (checked arguments, as
    :func:`fp8_gemv`; f: the fused options); returns y."""
    M, N = x.shape[0] if f.x_rows is None else f.x_rows.shape[0], weight.shape[0]
    y = torch.empty((M, N // 2 if f.act == "swiglu" else N), dtype=torch.bfloat16,
                    device=x.device)
    if M == 0 or N == 0:
        return y
    part = launch_partials(x, weight, weight_scale, interpret, f)
    if part is None:
        _launch_main(x, weight, weight_scale, f, interpret, y, 1)
    else:
        launch_reduce(part, weight_scale, y, f, scale_mode(weight, weight_scale), interpret)
    return y


def check_args(x, weight, weight_scale) -> None:
    """:func:`fp8_gemv`'s checks of x, weight and weight_scale (ValueError naming the one)."""
    check_tensor("x", x, torch.bfloat16, (None, None), contiguous=False)
    if x.stride(1) != 1:
        raise ValueError(f"x: last dim must have stride 1, strides {x.stride()}")
    K = x.shape[1]
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


def fp8_gemv(x, weight, weight_scale, interpret: bool = False, *, norm=None, eps: float = 1e-6,
             act: str = "none", residual=None, norm_segments: int = 1, x_rows=None
             ) -> torch.Tensor:
    """y = x · (weight · scale)ᵀ for an e4m3 weight, small batches, with optional fused glue.

    Args:
        x: bf16 [M, K] (last dim stride 1; row stride free); with x_rows, a table [V, K].
        weight: float8_e4m3fn [N, K], contiguous (rows interleaved gate/up for swiglu:
            `interleave_rows`, re-exported here).
        weight_scale: fp32, contiguous: one element (0-dim or [1]) = per tensor; [N] = per
            channel; [N, K/64] = block 1×64 (K % 64 == 0).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
        norm: bf16 [K] gain: x is RMS-normalised first (eps: its epsilon), as add_rms_norm;
            with norm_segments S, each of the S segments of K/S columns over itself (the
            drafter's taps: one norm per tap, side by side).
        act: "none", "silu" (after the residual) or "swiglu" (output [M, N/2]).
        residual: bf16 [M, N] (last dim stride 1) added to the product (not with swiglu).
        x_rows: int64 [M] (any stride): output row m reads x row x_rows[m] (an embedding
            lookup fused into the load; M = len(x_rows)).
    Returns: bf16 [M, N] ([M, N/2] for swiglu), fp32 accumulation.
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride or option;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/notes/modelopt.md (FP8 export), block-drafter.md §Serving quantisation;
    the fused steps: kolibri-1.md §Forward pass (RMSNorm, SwiGLU), the module docstring.
    """
    check_args(x, weight, weight_scale)
    N = weight.shape[0]
    f = Fusion(norm, float(eps), act, residual, norm_segments, x_rows)
    check_fused(x, N, f)
    if interpret:
        return launch_fp8_gemv(x, weight, weight_scale, f, True)
    if f.plain:
        return torch.ops.kolibri_plugins.fp8_gemv(x, weight, weight_scale)
    return torch.ops.kolibri_plugins.fp8_gemv_fused(x, weight, weight_scale, *f)
