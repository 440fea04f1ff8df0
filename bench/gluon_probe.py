#!/usr/bin/env python3
"""Can Triton 3.6's Gluon express the INT4 verification plan (plugins/NOTES.md, "Next" 2), and
does it compile for sm_90 here, without a GPU? One command:

    python3 bench/gluon_probe.py

The plan: the programs of a KV head's verification rows share each decoded key tile. Two warps
each decode half of a [64 keys, 64 dims] tile (a stand-in decode of uint8 codes to bf16), store
it to shared memory, wait at a barrier, and both read all of it as the B operand of mma.sync
(q [16, 64] x K^T). The probe compiles that kernel (`GluonASTSource`, target sm_90, 2 warps) in
two shared layouts and prints the PTX's mma.sync / ldmatrix / bar.sync counts and the shared
bytes:
- "kt": the tile transposed in registers before the store ([dims, keys], keys contiguous): the
  B operand is read with ldmatrix;
- "k_view": the tile stored as decoded ([keys, dims]) and read through a permuted view.
It checks compilation and the instructions chosen, not results: nothing here runs.
"""

from __future__ import annotations

import argparse
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import mma_v2


@gluon.jit
def _shared_tile_probe(q_ptr, c_ptr, o_ptr, ROWS: gl.constexpr, KEYS: gl.constexpr,
                       D: gl.constexpr, TRANSPOSE_IN_REGISTERS: gl.constexpr):
    """o [ROWS, KEYS] fp32 = q [ROWS, D] bf16 @ decode(c [KEYS, D] uint8)^T, the decoded tile
    shared by the program's 2 warps through shared memory."""
    dec: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [2, 1], [1, 0])   # warps split the keys
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 2],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    smem_l: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    kk = gl.arange(0, KEYS, layout=gl.SliceLayout(1, dec))
    dd = gl.arange(0, D, layout=gl.SliceLayout(0, dec))
    codes = gl.load(c_ptr + kk[:, None] * D + dd[None, :])
    k_bf = (codes.to(gl.float32) - 8.0).to(gl.bfloat16)      # stand-in for the INT4 decode
    if TRANSPOSE_IN_REGISTERS:
        ks = gl.allocate_shared_memory(gl.bfloat16, [D, KEYS], smem_l, gl.permute(k_bf, (1, 0)))
        gl.thread_barrier()
        kt = ks.load(b_l)
    else:
        ks = gl.allocate_shared_memory(gl.bfloat16, [KEYS, D], smem_l, k_bf)
        gl.thread_barrier()
        kt = ks.permute((1, 0)).load(b_l)
    qr = gl.arange(0, ROWS, layout=gl.SliceLayout(1, a_l))
    qd = gl.arange(0, D, layout=gl.SliceLayout(0, a_l))
    q = gl.load(q_ptr + qr[:, None] * D + qd[None, :])
    s = mma_v2(q, kt, gl.zeros([ROWS, KEYS], gl.float32, layout=mma))
    orr = gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
    oc = gl.arange(0, KEYS, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + orr[:, None] * KEYS + oc[None, :], s)


def compile_probe(transpose_in_registers: bool):
    """The probe compiled for sm_90 with 2 warps (triton.compile; no GPU needed)."""
    sig = dict(q_ptr="*bf16", c_ptr="*u8", o_ptr="*fp32", ROWS="constexpr", KEYS="constexpr",
               D="constexpr", TRANSPOSE_IN_REGISTERS="constexpr")
    src = GluonASTSource(_shared_tile_probe, sig, constexprs=dict(
        ROWS=16, KEYS=64, D=64, TRANSPOSE_IN_REGISTERS=transpose_in_registers))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=2))


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    for name, flag in (("kt", True), ("k_view", False)):
        ck = compile_probe(flag)
        ptx = ck.asm["ptx"]
        print(f"{name:7s} shared {ck.metadata.shared} B, mma.sync {ptx.count('mma.sync')}, "
              f"ldmatrix {ptx.count('ldmatrix')}, bar.sync {ptx.count('bar.sync')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
