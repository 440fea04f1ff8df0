"""e4m3 -> bf16 in the FP8 GEMM kernels (fp8_gemv, moe_experts) with integer instructions.

Triton's ``w.to(tl.bfloat16)`` for an e4m3 tensor compiles (AOT sm_90 SASS) to one
F2FP.F16.E4M3.UNPACK_B per two weights and one F2F.BF16.F16 per weight: 1.5 instructions per
weight on the conversion unit, which issues 16 results per clock per SM against 64 for
bitwise operations (CUDA C++ Programming Guide, arithmetic instruction throughput, compute
capability 9.0). ``DECODE = 3`` (the default of fp8_gemv and moe_experts) places the bits:

    bf16 bits = sign << 15 | (e4m3 & 0x7F) << 4      (value = e4m3 value · 2^-120)
    w = that · 2^120                                  (one mul.rn.bf16x2 per two weights)

The e4m3 exponent field lands in the low four bits of bf16's and its three mantissa bits on
top of bf16's seven; e4m3 subnormals (exponent 0) become bf16 subnormals with the same
mantissa, so the whole code range maps to value · 2^-120, and the product by 2^120 is exact.
Per pair of weights one prmt with the sign-replication selector puts each byte in a half's low
byte and eight copies of its sign bit above it; after a shift by 4 bit 15 is the sign, and
one and with 0x87F087F0 clears bits 14-11 (sign copies) and the other half's spill: 8
instructions per four weights. The first form (DECODE 2, the default until 4d1292d: the sign
by a second prmt and a lop3, 11 instructions) was 1.03-1.07x slower on the H200, same bits
(bench/results/h200-2026-12-01b/nk/). The result is the conversion's bf16 value, so every
kernel's bits are unchanged (tests/plugins/test_e4m3_decode.py runs the PTX through an
emulator over every code; bench/decode_ab.py compares it with the conversion on the H200).
"""

from __future__ import annotations

from ._common import jit, ptx_constant, tl

DECODES = (1, 3)   # the modes e4m3_to_bf16 takes
# DECODE 3's PTX: four e4m3 bytes in $2 -> four bf16 in $0, $1 (also bench/gluon_gemv_probe.py)
E4M3_BF16_PTX = (
    "{ .reg .b32 r, z, k; mov.b32 z, 0; mov.b32 k, 0x7B807B80; "
    "prmt.b32 r, $2, z, 0x9180; shl.b32 r, r, 4; and.b32 r, r, 0x87F087F0; "
    "mul.rn.bf16x2 $0, r, k; "
    "prmt.b32 r, $2, z, 0xB3A2; shl.b32 r, r, 4; and.b32 r, r, 0x87F087F0; "
    "mul.rn.bf16x2 $1, r, k; }")
_E4M3_BF16_ASM = ptx_constant(E4M3_BF16_PTX)


def check_decode(owner: str, decode) -> None:
    """ValueError naming `owner`'s DECODE setting unless it is one of DECODES."""
    if decode not in DECODES:
        raise ValueError(f"{owner}.DECODE: {decode!r}, want one of {DECODES}")


@jit
def e4m3_to_bf16(w, DECODE: tl.constexpr):
    """float8e4nv tensor -> bf16 tensor, exactly: DECODE 3 with the PTX below, else Triton's
    conversion (1; also the interpreter's path). NaN codes (0x7F, 0xFF) are not handled by
    DECODE 3; FP8 weights never hold them."""
    if DECODE == 3:
        return tl.inline_asm_elementwise(_E4M3_BF16_ASM, "=r,=r,r",
                                         [w.to(tl.uint8, bitcast=True)], dtype=tl.bfloat16,
                                         is_pure=True, pack=4)
    return w.to(tl.bfloat16)
