#!/usr/bin/env python3
"""Issue rate of single PTX instructions on the H200: results per clock per SM.

    python3 bench/opcode_rates.py [--out DIR]      # on the GPU
    python3 bench/opcode_rates.py --aot            # here: compile for sm_90, print each SASS mix

Why: the weight decodes of the GEMV and MoE kernels trade conversion instructions (F2FP, F2F)
for integer ones (LOP3, SHF, PRMT) and bf16 multiplies (HMUL2). The CUDA guide gives 16
conversions per clock per SM on compute capability 9.0 against 64 bitwise operations; it
gives no figure for PRMT. plugins/NOTES.md ("Where each kernel stands") reads the two decode
experiments of bench/results/h200-2026-11-30k as PRMT issuing at about the conversion rate.

Each kernel applies one PTX instruction 16 times per inline-asm block to two interleaved
chains of 32-bit values, REPS blocks per element, 4096 elements per program (32 per thread:
independent chains, so issue, not latency, bounds it with enough warps per SM). Rate =
instructions / (seconds x SM clock x SMs), the clock read from torch (or --clock-mhz).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import torch
import triton
import triton.language as tl

# name: (one step of a chain, in PTX, on {A} / {B} (b32), {FA} / {FB} (f32), {HA} / {HB} (b16);
# what it stands for).
# A block alternates the two chains: {A} = t, {B} = u, then {A} = u, {B} = t, ...
OPS = {
    "lop3": ("lop3.b32 {A}, {A}, {B}, 0x5A5A5A5A, 0x96;", "bitwise (LOP3)"),
    "prmt": ("prmt.b32 {A}, {A}, {B}, 0x6240;", "byte permute (PRMT)"),
    "shf": ("shf.l.wrap.b32 {A}, {A}, {B}, 3;", "funnel shift (SHF)"),
    "imad": ("mad.lo.u32 {A}, {A}, {B}, {B};", "integer multiply-add (IMAD; shifts compile to it)"),
    "hmul2_bf16": ("mul.rn.bf16x2 {A}, {A}, {B};", "bf16x2 multiply (HMUL2.BF16)"),
    "f2f_bf16": ("cvt.rn.bf16.f16 {HA}, {HB};", "f16 -> bf16 (F2F.BF16.F16)"),
    "cvt_bf16x2": ("cvt.rn.bf16x2.f32 {A}, {FA}, {FB}; mov.b32 {FA}, {A};",
                   "f32 pair -> bf16x2 (F2FP.BF16.F32)"),
    "ffma": ("fma.rn.f32 {FA}, {FA}, {FB}, {FB};", "fp32 FMA (reference: 128 per clock per SM)"),
}
PER_BLOCK = 16
REPS = 64
N = 4096


def asm_for(op: str) -> str:
    """An inline-asm block: PER_BLOCK steps of the instruction, the two chains alternating."""
    ins = OPS[op][0]
    body = [ins.format(A="t", B="u", FA="f", FB="g", HA="h0", HB="h1") if i % 2 == 0 else
            ins.format(A="u", B="t", FA="g", FB="f", HA="h1", HB="h0")
            for i in range(PER_BLOCK)]
    return ("{ .reg .b32 t, u, w; .reg .b16 h0, h1; .reg .f32 f, g; mov.b32 t, $2; "
            "mov.b32 u, $3; mov.b32 f, $2; mov.b32 g, $3; mov.b32 {h0, h1}, $2; "
            + " ".join(body) + " mov.b32 $1, f; xor.b32 $0, t, $1; mov.b32 w, {h0, h1}; "
            "xor.b32 $0, $0, w; mov.b32 $1, u; }")


@triton.jit
def _rate_kernel(x_ptr, y_ptr, ASM: tl.constexpr, N: tl.constexpr, REPS: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    a = tl.load(x_ptr + offs)
    b = a ^ 0x35793579
    for _ in range(REPS):
        a, b = tl.inline_asm_elementwise(ASM, "=r,=r,r,r", [a, b],
                                         dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)
    tl.store(y_ptr + offs, a ^ b)


def aot() -> int:
    """Compile each kernel for sm_90 here and print the SASS opcodes of its loop."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from aot_sass import cuobjdump, loops
    for op in OPS:
        src = ASTSource(_rate_kernel, {"x_ptr": "*u32", "y_ptr": "*u32", "ASM": "constexpr",
                                       "N": "constexpr", "REPS": "constexpr"},
                        constexprs={"ASM": asm_for(op), "N": N, "REPS": REPS})
        try:
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=4))
        except Exception as exc:
            print(f"{op:12s} compile FAILED: {str(exc)[:300]}")
            continue
        found, _ = loops(cuobjdump(ck, "-sass"))
        mix = ", ".join(f"{k} {v}" for k, v in found[0][2].most_common(6)) if found else "-"
        print(f"{op:12s} loop: {mix}")
    return 0


def measure(out: pathlib.Path, clock_mhz: float | None) -> int:
    dev = torch.cuda.get_device_properties(0)
    sms = dev.multi_processor_count
    mhz = clock_mhz or getattr(dev, "clock_rate", 0) / 1e3 or 1980.0
    programs = sms * 16                                  # 16 programs of 4 warps per SM
    x = torch.randint(0, 2**31, (programs * N,), dtype=torch.int32, device="cuda").view(
        torch.uint32)
    y = torch.empty_like(x)
    rows = []
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, clock {mhz:.0f} MHz", flush=True)
    for op, (_, what) in OPS.items():
        try:
            fn = lambda op=op: _rate_kernel[(programs,)](x, y, asm_for(op), N, REPS,  # noqa: E731
                                                          num_warps=4)
            fn()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(5):
                fn()
            b.record()
            b.synchronize()
            s = a.elapsed_time(b) / 5 / 1e3
        except Exception as exc:  # one opcode's failure must not hide the others
            print(f"{op:12s} FAILED: {str(exc)[:300]}", flush=True)
            continue
        ops = programs * N * REPS * PER_BLOCK
        rate = ops / (s * mhz * 1e6 * sms)
        rows.append(dict(op=op, what=what, seconds=s, per_clock_per_sm=rate))
        print(f"{op:12s} {rate:7.1f} results / clock / SM  ({what}; {s * 1e3:.2f} ms)",
              flush=True)
    (out / "opcode_rates.json").write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--aot", action="store_true", help="compile for sm_90 here, print SASS")
    ap.add_argument("--clock-mhz", type=float, default=None)
    a = ap.parse_args()
    if a.aot:
        return aot()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return measure(out, a.clock_mhz)


if __name__ == "__main__":
    sys.exit(main())
