"""NVFP4 (ModelOpt) weight-only GEMM for small batches: y = x · wᵀ, w unpacked in registers.

Weight format (shared/notes/modelopt.md): ``weight`` uint8 [N, K/2], element 2i in the low nibble;
e2m1 code = sign bit 3, magnitude bits 0-2 -> {0, .5, 1, 1.5, 2, 3, 4, 6}; ``weight_scale`` e4m3
[N, K/16] (one per 16 inputs); ``weight_scale_2`` fp32 scalar. w = e2m1 · weight_scale ·
weight_scale_2. e2m1 · e4m3 has at most 6 significant bits, so the per-block product is exact in
bf16: the tensor cores multiply it with the bf16 activations exactly and accumulate in fp32; the
global scale multiplies the fp32 result. Used for the LM head [131072, 2560] and the drafter's
head slice [60614, 2560] (shared/spec/block-drafter.md §Serving quantisation).

Batch invariance: rows are processed in tiles of 16 (every tile the same dot shape), the K loop
order is fixed, and the tile config depends on N and K only.

``norm=gain`` fuses the RMSNorm before the head (the drafter's final norm): x is normalised per
row as it is loaded, add_rms_norm's maths (``bf16((x·rsqrt(mean(x²) + eps))·gain)``, the row's
Σx² in BLOCK_K chunks in order; plugins/_gemv_fusion.py).
"""

from __future__ import annotations

import torch

from ._common import (NAMESPACE, cdiv, check_scalar_tensor, check_tensor, jit, kernel_path,
                      launch, tl)
from ._common import early_launch, pdl_enter, pdl_release, ptx_constant
from ._row_tiles import dot_into, tile_acc
from ._rows import linear_rows
from ._gemv_fusion import _col_rstd, tile_rstds
from .add_rms_norm import add_rms_norm_ref

ROWS = 16        # activation rows per dot
MAX_TILES = 4    # up to 64 activation rows per program (weights read once for them)
BLOCK_K = 256
# e2m1 -> bf16: 1 via e4m3 and the conversion unit, 3 bit placement (`_e2m1_pairs_to_bf16`; the
# same bits). H200 LM head at M = 1 / 16: 94.5 / 96.1 µs (1) -> 88.3 / 91.2 (bit placement with
# the signs by lop3, bench/results/h200-2026-11-30m/mu/) -> 75.1 / 76.9 (3, signs by sign
# replication, bench/results/h200-2026-12-01b/nn/decode.log).
DECODE = 3
DECODES = (1, 3)
TUNE = dict(num_warps=4, num_stages=3)  # launch config (bench/plugins.py sweeps it)
# At most SWAP_ROWS rows (0: never) compute y^T = W·x^T: the decoded weight tiles are the MMA's A
# operand and the rows its N, one ROWS_SWAP-row tile (plugins/fp8_gemv.py SWAP_ROWS). AOT sm_90
# LM head loop at one row 980 -> 895 instructions; H200 (bench/results/h200-2026-12-01b/nn/
# swap.log, the same bits, gpu_check nvfp4 6/6 with it), µs at M = 1 / 4 / 8: LM head 75 / 78 /
# 78 -> 59.5 / 61.3 / 61.4 (76.7 % of the read ceiling at one row), drafter head 39.7 / 41.3 /
# 41.2 -> 33.0 / 35.8 / 35.7 (4 warps, num_stages 3; 8 warps 34.0 / 34.4 / 34.6, 4 stages slower).
SWAP_ROWS = 8
ROWS_SWAP = 8
TUNE_SWAP = dict(num_warps=4, num_stages=3)   # launch config of the swapped kernel


# e2m1 nibble -> e4m3 byte with the same bits in the same places: magnitude bits (e1 e0 m0) go to
# e4m3 bits 4..2 (low exponent bits + top mantissa bit), sign to bit 7. Both formats have the
# same subnormal structure, so the e4m3 value is exactly e2m1 * 2^-6 (0.5 -> e4m3 subnormal).
# Four bytes (eight nibbles) per 32-bit register in 9 instructions (inline PTX below; the
# interpreter takes the equivalent uint8 expressions). Tried and removed (2026-11-30): e2m1 ->
# bf16 through prmt byte tables and a bf16 scale product, no conversion-unit instructions, the
# same bits: 0.76x the speed at M = 1-16 (bench/decode_ab.py, bench/results/h200-2026-11-30k/kd/).
@jit
def _e2m1_pairs_to_e4m3(wq, USE_ASM: tl.constexpr):
    """uint8 [.., n] packed e2m1 pairs -> (low nibbles, high nibbles) as e4m3 bytes = value·2^-6."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shl.b32 t, $2, 2; and.b32 t, t, 0x1C1C1C1C; shl.b32 $0, $2, 4; "
            "and.b32 $0, $0, 0x80808080; or.b32 $0, $0, t; shr.b32 t, $2, 2; "
            "and.b32 t, t, 0x1C1C1C1C; and.b32 $1, $2, 0x80808080; or.b32 $1, $1, t; }",
            "=r,=r,r", [wq], dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
    else:
        lo = ((wq << 2) & 0x1C) | ((wq << 4) & 0x80)
        hi = ((wq >> 2) & 0x1C) | (wq & 0x80)
    return lo.to(tl.float8e4nv, bitcast=True), hi.to(tl.float8e4nv, bitcast=True)


# DECODE 3's PTX: four packed bytes in $4 and their bf16 scales in $5, $6 -> the low nibbles
# in $0, $1 and the high ones in $2, $3 (also bench/gluon_nvfp4_probe.py)
E2M1_BF16_PTX = (
    "{ .reg .b32 p, w, z, k; mov.b32 z, 0; mov.b32 k, 0x81C081C0; shl.b32 w, $4, 4; "
    "prmt.b32 p, w, z, 0x9180; shl.b32 p, p, 2; and.b32 p, p, k; "
    "mul.rn.bf16x2 $0, p, $5; "
    "prmt.b32 p, w, z, 0xB3A2; shl.b32 p, p, 2; and.b32 p, p, k; "
    "mul.rn.bf16x2 $1, p, $6; "
    "prmt.b32 p, $4, z, 0x9180; shl.b32 p, p, 2; and.b32 p, p, k; "
    "mul.rn.bf16x2 $2, p, $5; "
    "prmt.b32 p, $4, z, 0xB3A2; shl.b32 p, p, 2; and.b32 p, p, k; "
    "mul.rn.bf16x2 $3, p, $6; }")
_E2M1_BF16_ASM = ptx_constant(E2M1_BF16_PTX)


@jit
def _e2m1_pairs_to_bf16(wq, sb, USE_ASM: tl.constexpr):
    """DECODE 3: uint8 [.., n] packed e2m1 pairs and bf16 block scales sb (= e4m3 scale ·
    2^110, same shape) -> (low, high nibbles) as bf16 = value · scale · 2^-16, exactly.

    The nibble's magnitude bits (e1 e0 m) go to bf16 bits 8..6 (the exponent's two low bits and
    the top mantissa bit) and its sign to bit 15: value · 2^-126 for every code (e2m1's
    subnormal 0.5 becomes a bf16 subnormal). One mul.rn.bf16x2 by sb per two weights makes
    value · scale · 2^-16 (≤ 6 significant bits, normal: exact); the kernel multiplies the fp32
    result by 2^16, so the output bits equal DECODE 1's. Each sign comes from prmt's sign
    replication (of the byte's top bit: the high nibble's sign, and after a shift of the word by
    4 the low nibble's): per pair of halves one prmt, a shift by 2 and one and with 0x81C081C0
    (plugins/_e4m3_decode.py). Per 8 weights 17 instructions, no conversion-unit ones (DECODE
    2, the default until 7cfa311, placed the signs by shifts and lop3: 22)."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(_E2M1_BF16_ASM, "=r,=r,=r,=r,r,r,r", [wq, sb],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True,
                                           pack=4)
    else:  # the same values by arithmetic (the interpreter flushes bf16 subnormals)
        s = sb.to(tl.float32) * 1.1754943508222875e-38   # · 2^-126: scale · 2^-16
        lo = (_e2m1_value(wq & 15) * s).to(tl.bfloat16)
        hi = (_e2m1_value(wq >> 4) * s).to(tl.bfloat16)
    return lo, hi


@jit
def _e2m1_value(c):
    """e2m1 codes (uint8 0..15) -> fp32 values: ±{0, .5, 1, 1.5, 2, 3, 4, 6}."""
    e = ((c >> 1) & 3).to(tl.float32)
    m = (c & 1).to(tl.float32)
    mag = tl.where(e == 0.0, 0.5 * m, (1.0 + 0.5 * m) * tl.exp2(e - 1.0))
    return tl.where((c & 8) != 0, -mag, mag)


@jit
def _nvfp4_gemv_kernel(x_ptr, w_ptr, ws_ptr, gs_ptr, y_ptr, g_ptr, M, N, K, sx_m, sw_n, ss_n, eps,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                       MT: tl.constexpr, USE_ASM: tl.constexpr, DOT_F32: tl.constexpr,
                       NORM: tl.constexpr = False, DECODE: tl.constexpr = 1,
                       SWAP: tl.constexpr = False, PDL: tl.constexpr = 0):
    """SWAP (MT 1): acc0 holds y^T [BLOCK_N, ROWS] = W·x^T until the store."""
    pdl_enter(PDL)
    # y = Σ_i x[2i]·w[2i] + x[2i+1]·w[2i+1]: the low nibbles (even k) and the high nibbles (odd k)
    # feed two dots, so the packed bytes are never interleaved in registers. sw_n = K/2 and
    # ss_n = K/16 are the weight and scale row strides as arguments: the JIT marks them
    # divisible by 16, so the scale rows load as 16-byte cp.async copies (with K // 16 computed
    # here Triton knows no alignment and loads them byte by byte, unpipelined; AOT sm_90 SASS).
    pid_n = tl.program_id(0)
    m0 = tl.program_id(1) * ROWS * MT
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    n64 = n.to(tl.int64)
    rows = tl.arange(0, ROWS)
    acc0 = tl.zeros([BLOCK_N, ROWS] if SWAP else [ROWS, BLOCK_N], tl.float32)
    acc1 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    acc2 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    acc3 = tl.zeros([ROWS, BLOCK_N], tl.float32)
    HB: tl.constexpr = BLOCK_K // 2
    # per row rsqrt(mean(x²) + eps) over all of K (NORM: one segment)
    rs0, rs1, rs2, rs3 = tile_rstds(x_ptr, x_ptr, 0, m0, M, K, sx_m, eps, ROWS, MT, BLOCK_K,
                                    1 if NORM else 0, 1, False)
    for k0 in range(0, K, BLOCK_K):
        kb = k0 // 2 + tl.arange(0, HB)
        kmask = kb < sw_n
        wq = tl.load(w_ptr + n64[:, None] * sw_n + kb[None, :],
                     mask=nmask[:, None] & kmask[None, :], other=0)
        ks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        bs = tl.load(ws_ptr + n64[:, None] * ss_n + ks[None, :],
                     mask=nmask[:, None] & (ks < ss_n)[None, :], other=0.0)
        if DECODE == 3:
            sb = (bs.to(tl.float32) * 1.2980742146337069e33).to(tl.bfloat16)  # · 2^110, exact
            sb = tl.reshape(tl.broadcast_to(sb[:, :, None], (BLOCK_N, BLOCK_K // 16, 8)),
                            (BLOCK_N, HB))
            w_lo, w_hi = _e2m1_pairs_to_bf16(wq, sb, USE_ASM)
        else:
            sc = bs.to(tl.float16) * 64.0  # undo the 2^-6 of the e4m3 trick; exact in fp16
            sc = tl.reshape(tl.broadcast_to(sc[:, :, None], (BLOCK_N, BLOCK_K // 16, 8)),
                            (BLOCK_N, HB))
            lo, hi = _e2m1_pairs_to_e4m3(wq, USE_ASM)
            w_lo = (lo.to(tl.float16) * sc).to(tl.bfloat16)  # e2m1·e4m3: <= 6 significant bits
            w_hi = (hi.to(tl.float16) * sc).to(tl.bfloat16)
        if DOT_F32:
            w_lo = w_lo.to(tl.float32)
            w_hi = w_hi.to(tl.float32)
        if not SWAP:
            w_lo = tl.trans(w_lo)
            w_hi = tl.trans(w_hi)
        kx = k0 + tl.arange(0, BLOCK_K)
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            xt = tl.load(x_ptr + m[:, None].to(tl.int64) * sx_m + kx[None, :],
                         mask=(m < M)[:, None] & (kx < K)[None, :], other=0.0)
            if NORM:
                rs = rs0 if t == 0 else (rs1 if t == 1 else (rs2 if t == 2 else rs3))
                gk = tl.load(g_ptr + kx, mask=kx < K, other=0.0).to(tl.float32)
                xt = ((xt.to(tl.float32) * _col_rstd(rs, kx, K, 1, 1)) * gk[None, :]
                      ).to(tl.bfloat16)
            xe, xo = tl.split(tl.reshape(xt, (ROWS, HB, 2)))
            if DOT_F32:
                xe = xe.to(tl.float32)
                xo = xo.to(tl.float32)
            if SWAP:
                acc0 = tl.dot(w_hi, tl.trans(xo), tl.dot(w_lo, tl.trans(xe), acc0))
            else:   # even k, then odd k, into row tile t's accumulator
                acc0, acc1, acc2, acc3 = dot_into(t, xe, w_lo, acc0, acc1, acc2, acc3)
                acc0, acc1, acc2, acc3 = dot_into(t, xo, w_hi, acc0, acc1, acc2, acc3)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    if SWAP:
        acc0 = tl.trans(acc0)
    gs = tl.load(gs_ptr)
    if DECODE == 3:
        gs = gs * 65536.0   # the weights were value · scale · 2^-16 (exact powers of two)
    for t in tl.static_range(MT):
        m = m0 + t * ROWS + rows
        out = tile_acc(t, acc0, acc1, acc2, acc3)
        tl.store(y_ptr + m[:, None].to(tl.int64) * N + n64[None, :], (out * gs).to(tl.bfloat16),
                 mask=(m < M)[:, None] & nmask[None, :])


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def nvfp4_dequantize_ref(weight, weight_scale, weight_scale_2) -> torch.Tensor:
    """uint8 [N, K/2] + e4m3 [N, K/16] + fp32 scalar -> fp32 [N, K] (ModelOpt NVFP4 dequant)."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=weight.device)
    codes = torch.stack([weight & 15, weight >> 4], -1).flatten(-2).long()
    w = lut[codes]
    bs = weight_scale.float().repeat_interleave(16, dim=1)
    return w * bs * weight_scale_2.float().reshape(())


def nvfp4_gemv_ref(x, weight, weight_scale, weight_scale_2, norm=None, eps: float = 1e-6
                   ) -> torch.Tensor:
    """fp32 torch reference of :func:`nvfp4_gemv`; returns bf16 [M, N] (with norm: of
    add_rms_norm_ref's output, the composition it replaces)."""
    if norm is not None:
        x = add_rms_norm_ref(x, None, norm, eps)[1]
    w = nvfp4_dequantize_ref(weight, weight_scale, weight_scale_2)
    return linear_rows(x.float(), w).to(torch.bfloat16)


@torch.library.custom_op(f"{NAMESPACE}::nvfp4_gemv", mutates_args=())
def _nvfp4_gemv_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   weight_scale_2: torch.Tensor) -> torch.Tensor:
    if kernel_path(x, "nvfp4_gemv") == "ref":
        return nvfp4_gemv_ref(x, weight, weight_scale, weight_scale_2)
    return _launch(x, weight, weight_scale, weight_scale_2, False)


@_nvfp4_gemv_op.register_fake
def _(x, weight, weight_scale, weight_scale_2):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::nvfp4_gemv_norm", mutates_args=())
def _nvfp4_gemv_norm_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        weight_scale_2: torch.Tensor, norm: torch.Tensor, eps: float
                        ) -> torch.Tensor:
    if kernel_path(x, "nvfp4_gemv") == "ref":
        return nvfp4_gemv_ref(x, weight, weight_scale, weight_scale_2, norm, eps)
    return _launch(x, weight, weight_scale, weight_scale_2, False, norm, eps)


@_nvfp4_gemv_norm_op.register_fake
def _(x, weight, weight_scale, weight_scale_2, norm, eps):
    return x.new_empty((x.shape[0], weight.shape[0]))


BLOCK_N_MAX = 64
# Up to 16 activation rows (one row tile) a wider N tile pays: H200, bench/gemv_tune.py (then
# nvfp4_tune.py; bench/results/h200-2026-11-30k/kt/): LM head M=1 99.6 -> 94.4 µs, M=16 99.5 ->
# 96.1, drafter head M=1 51.7 -> 48.8; at M=64 128 loses. The N tile only groups output
# columns: same bits.
BLOCK_N_ONE_TILE = 128
# Tried and removed (2026-11-30, bench/results/h200-2026-11-30k/ki/): the row tiles fastest in
# the grid, so that one weight tile's programs start together and read it from L2: at M=64 with
# one or two row tiles per program 298.8-374.5 µs against 252.6 for the default four; the
# decode of the weights, repeated per program, is the cost, not the bytes.


def block_n_for(n: int, m: int = ROWS * MAX_TILES) -> int:
    """Rows of weight per program for m activation rows: BLOCK_N_ONE_TILE up to one row tile,
    else BLOCK_N_MAX, halved while fewer than ~2 programs per SM would run. The N tiling only
    groups output columns, so it may follow m without changing any output's bits."""
    bn = BLOCK_N_ONE_TILE if m <= ROWS else BLOCK_N_MAX
    while bn > 16 and cdiv(n, bn) < 264:
        bn //= 2
    return bn


def _launch(x, weight, weight_scale, weight_scale_2, interpret, norm=None, eps=1e-6):
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    if M == 0 or N == 0:
        return y
    if DECODE not in DECODES:
        raise ValueError(f"nvfp4_gemv.DECODE: {DECODE!r}, want one of {DECODES}")
    swap = M <= SWAP_ROWS
    rows = ROWS_SWAP if swap else ROWS
    mt = 1 if swap else min(MAX_TILES, cdiv(M, rows))   # the swapped kernel: one row tile
    bn = block_n_for(N, M)
    grid = (cdiv(N, bn), cdiv(M, rows * mt))
    extra = {} if norm is None else dict(enable_fp_fusion=False)   # torch's separate roundings
    launch(_nvfp4_gemv_kernel, grid, x, weight, weight_scale, weight_scale_2, y,
           x if norm is None else norm, M, N, K, x.stride(0), K // 2, K // 16, float(eps),
           BLOCK_N=bn, BLOCK_K=BLOCK_K, ROWS=rows, MT=mt, USE_ASM=not interpret,
           DECODE=DECODE, SWAP=swap, DOT_F32=interpret, NORM=norm is not None,
           interpret=interpret, pdl_early=early_launch("gemv", M), **extra,
           **(TUNE_SWAP if swap else TUNE))
    return y


def nvfp4_gemv(x, weight, weight_scale, weight_scale_2, interpret: bool = False, *, norm=None,
               eps: float = 1e-6) -> torch.Tensor:
    """y = x · wᵀ with an NVFP4 weight, for small batches (decode, verification, drafter head).

    Args:
        x: bf16 [M, K] (last dim stride 1; row stride free). K % 16 == 0.
        weight: uint8 [N, K/2], contiguous; weight_scale: float8_e4m3fn [N, K/16], contiguous;
        weight_scale_2: fp32 one-element tensor (0-dim or [1]).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
        norm: bf16 [K] gain: x is RMS-normalised first (eps: its epsilon), as add_rms_norm.
    Returns: bf16 [M, N], fp32 accumulation.
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/notes/modelopt.md (NVFP4 export), block-drafter.md §Serving quantisation.
    """
    check_tensor("x", x, torch.bfloat16, (None, None), contiguous=False)
    if x.stride(1) != 1:
        raise ValueError(f"x: last dim must have stride 1, strides {x.stride()}")
    M, K = x.shape
    if K % 16:
        raise ValueError(f"x: K = {K} must be a multiple of 16 (NVFP4 blocks)")
    check_tensor("weight", weight, torch.uint8, (None, K // 2), x.device)
    check_tensor("weight_scale", weight_scale, torch.float8_e4m3fn, (weight.shape[0], K // 16),
                 x.device)
    check_scalar_tensor("weight_scale_2", weight_scale_2, x.device)
    if norm is not None:
        check_tensor("norm", norm, torch.bfloat16, (K,), x.device)
    if interpret:
        return _launch(x, weight, weight_scale, weight_scale_2, True, norm, eps)
    if norm is None:
        return torch.ops.kolibri_plugins.nvfp4_gemv(x, weight, weight_scale, weight_scale_2)
    return torch.ops.kolibri_plugins.nvfp4_gemv_norm(x, weight, weight_scale, weight_scale_2,
                                                     norm, float(eps))
