"""e4m3 -> bf16 in the FP8 GEMM kernels (fp8_gemv, moe_experts) with integer instructions.

Triton's ``w.to(tl.bfloat16)`` for an e4m3 tensor compiles (AOT sm_90 SASS) to one
F2FP.F16.E4M3.UNPACK_B per two weights and one F2F.BF16.F16 per weight: 1.5 instructions per
weight on the conversion unit, which issues 16 results per clock per SM against 64 for
bitwise operations (CUDA C++ Programming Guide, arithmetic instruction throughput, compute
capability 9.0). ``DECODE = 2`` places the bits instead:

    bf16 bits = sign << 15 | (e4m3 & 0x7F) << 4      (value = e4m3 value · 2^-120)
    w = that · 2^120                                  (one mul.rn.bf16x2 per two weights)

The e4m3 exponent field lands in the low four bits of bf16's and its three mantissa bits on
top of bf16's seven; e4m3 subnormals (exponent 0) become bf16 subnormals with the same
mantissa, so the whole code range maps to value · 2^-120, and the product by 2^120 is exact.
Per four weights: one and, then per pair a prmt (bytes to the halves' low bytes), a shift, a
prmt + lop3 (the sign bits) and the multiply: 11 integer / bf16 instructions. ``DECODE = 3``
(the default of fp8_gemv and moe_experts) gets the sign from prmt's sign replication: per pair
one prmt puts each byte in a half's low byte and a copy of its sign bit in all eight bits above
it, so after the shift by 4 bit 15 is the sign and bits 14-11 (sign copies) and the other
half's spill are cleared by one and with 0x87F087F0: 8 instructions per four weights (AOT sm_90:
MoE gate/up loop 333 -> 287 instructions per K step; H200 1.03-1.07x on fp8_gemv and the MoE,
bench/results/h200-2026-12-01b/nk/). Both give the conversion's bf16 value, so every kernel's
bits are unchanged (tests/plugins/test_e4m3_decode.py runs each PTX through an emulator over
every code; the H200 compares them in bench/decode_ab.py).
"""

from __future__ import annotations

from ._common import jit, tl


@jit
def e4m3_to_bf16(w, DECODE: tl.constexpr):
    """float8e4nv tensor -> bf16 tensor, exactly: DECODE 3 or 2 with the PTX below, else
    Triton's conversion (1; also the interpreter's path). NaN codes (0x7F, 0xFF) are not handled
    by DECODE 2 and 3; FP8 weights never hold them."""
    if DECODE == 3:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 r, z, k; mov.b32 z, 0; mov.b32 k, 0x7B807B80; "
            "prmt.b32 r, $2, z, 0x9180; shl.b32 r, r, 4; and.b32 r, r, 0x87F087F0; "
            "mul.rn.bf16x2 $0, r, k; "
            "prmt.b32 r, $2, z, 0xB3A2; shl.b32 r, r, 4; and.b32 r, r, 0x87F087F0; "
            "mul.rn.bf16x2 $1, r, k; }",
            "=r,=r,r", [w.to(tl.uint8, bitcast=True)], dtype=tl.bfloat16, is_pure=True,
            pack=4)
    if DECODE == 2:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 m, r, q, z, s, k; mov.b32 z, 0; mov.b32 s, 0x80008000; "
            "mov.b32 k, 0x7B807B80; and.b32 m, $2, 0x7F7F7F7F; "
            "prmt.b32 r, m, z, 0x4140; shl.b32 r, r, 4; prmt.b32 q, $2, $2, 0x1000; "
            "lop3.b32 r, r, q, s, 0xF8; mul.rn.bf16x2 $0, r, k; "
            "prmt.b32 r, m, z, 0x4342; shl.b32 r, r, 4; prmt.b32 q, $2, $2, 0x3020; "
            "lop3.b32 r, r, q, s, 0xF8; mul.rn.bf16x2 $1, r, k; }",
            "=r,=r,r", [w.to(tl.uint8, bitcast=True)], dtype=tl.bfloat16, is_pure=True,
            pack=4)
    return w.to(tl.bfloat16)
