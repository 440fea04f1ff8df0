#!/usr/bin/env python3
"""Does Hopper's wgmma sum a K chain to the same fp32 bits as mma.sync? (plugins/NOTES.md,
"Next" 2: a GEMV tile past 32 rows with the decoded weights as wgmma's register A operand could
replace fp8_gemv's mma.sync tiles at those row counts only if a row's bits stay the same.)

    python3 bench/wgmma_bits_probe.py            # on the H200: bits compared, exit 1 if any differ
    python3 bench/wgmma_bits_probe.py --aot      # here, no GPU: compile both for sm_90, count MMAs

Two Gluon kernels compute acc [R, N] fp32 = W [R, K] · x[N, K]^T for one program of 4 warps,
K in steps of BK, one accumulator chained through the steps:
- ``mma_v2``: W and x^T as mma.sync's register operands (m16n8k16), as Triton's tl.dot emits
  for fp8_gemv's swapped tiles;
- ``wgmma``: W as wgmma's register A operand (m64nNk16), x staged in shared memory as B.
W holds e4m3 values (the decoded weights of fp8_gemv), x bf16. Printed per (N, BK, seed):
whether the two accumulators are bit-identical, and the largest difference in units of the
fp32 result's last place. No speed is measured here.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

R = 64          # weight rows per program (one warpgroup's m64)
K = 2560        # hidden size of Kolibri-1 (QKV's and o_proj's K)
NS = (8, 16, 32, 64, 128)
BKS = (64, 128)
SEEDS = (0, 1, 2)


@gluon.jit
def _mma_v2_chain(w_ptr, x_ptr, o_ptr, K: gl.constexpr, R: gl.constexpr, N: gl.constexpr,
                  BK: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    r = gl.arange(0, R, layout=gl.SliceLayout(1, a_l))
    ka = gl.arange(0, BK, layout=gl.SliceLayout(0, a_l))
    kb = gl.arange(0, BK, layout=gl.SliceLayout(1, b_l))
    n = gl.arange(0, N, layout=gl.SliceLayout(0, b_l))
    acc = gl.zeros([R, N], gl.float32, layout=mma)
    for k0 in range(0, K, BK):
        a = gl.load(w_ptr + r[:, None] * K + (k0 + ka)[None, :])
        b = gl.load(x_ptr + n[None, :] * K + (k0 + kb)[:, None])
        acc = mma_v2(a, b, acc)
    orr = gl.arange(0, R, layout=gl.SliceLayout(1, mma))
    on = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + orr[:, None] * N + on[None, :], acc)


@gluon.jit
def _wgmma_chain(w_ptr, x_ptr, o_ptr, K: gl.constexpr, R: gl.constexpr, N: gl.constexpr,
                 BK: gl.constexpr):
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, N, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    x_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    xs_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, BK], gl.bfloat16)
    r = gl.arange(0, R, layout=gl.SliceLayout(1, a_l))
    ka = gl.arange(0, BK, layout=gl.SliceLayout(0, a_l))
    nx = gl.arange(0, N, layout=gl.SliceLayout(1, x_l))
    kx = gl.arange(0, BK, layout=gl.SliceLayout(0, x_l))
    xs = gl.allocate_shared_memory(gl.bfloat16, [N, BK], xs_l)
    acc = gl.zeros([R, N], gl.float32, layout=acc_l)
    for k0 in range(0, K, BK):
        a = gl.load(w_ptr + r[:, None] * K + (k0 + ka)[None, :])
        xt = gl.load(x_ptr + nx[:, None] * K + (k0 + kx)[None, :])
        gl.thread_barrier()      # every warp's MMA of the last step has read xs
        xs.store(xt)
        fence_async_shared()     # the stores, visible to wgmma's (async proxy) reads
        gl.thread_barrier()      # ... from every warp
        acc = warpgroup_mma(a, xs.permute((1, 0)), acc)
    orr = gl.arange(0, R, layout=gl.SliceLayout(1, acc_l))
    on = gl.arange(0, N, layout=gl.SliceLayout(0, acc_l))
    gl.store(o_ptr + orr[:, None] * N + on[None, :], acc)


KERNELS = {"mma_v2": _mma_v2_chain, "wgmma": _wgmma_chain}


def aot(name: str, n: int, bk: int):
    """The kernel compiled for sm_90 with 4 warps (no GPU needed)."""
    sig = dict(w_ptr="*bf16", x_ptr="*bf16", o_ptr="*fp32", K="constexpr", R="constexpr",
               N="constexpr", BK="constexpr")
    src = GluonASTSource(KERNELS[name], sig, constexprs=dict(K=K, R=R, N=n, BK=bk))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest |a - b| in units of the last place of b (fp32)."""
    scale = torch.where(b == 0, torch.ones_like(b), b.abs())
    return int(((a - b).abs() / (scale * 2.0 ** -23)).max().round().item())


def run_gpu() -> int:
    differ = 0
    for n in NS:
        for bk in BKS:
            for seed in SEEDS:
                g = torch.Generator(device="cuda").manual_seed(seed)
                w = torch.randn((R, K), generator=g, device="cuda").to(torch.float8_e4m3fn)
                w = w.to(torch.bfloat16).contiguous()
                x = torch.randn((n, K), generator=g, device="cuda").bfloat16().contiguous()
                out = {}
                for name, kern in KERNELS.items():
                    out[name] = torch.empty((R, n), dtype=torch.float32, device="cuda")
                    kern[(1,)](w, x, out[name], K=K, R=R, N=n, BK=bk, num_warps=4)
                torch.cuda.synchronize()
                ref = w.double() @ x.double().T
                same = torch.equal(out["mma_v2"], out["wgmma"])
                differ += not same
                print(f"N={n:3d} BK={bk:3d} seed={seed}: {'bit-identical' if same else 'DIFFER'}"
                      f" (max {ulps(out['wgmma'], out['mma_v2'])} ulp apart; against fp64:"
                      f" mma_v2 {(out['mma_v2'].double() - ref).abs().max().item():.2e},"
                      f" wgmma {(out['wgmma'].double() - ref).abs().max().item():.2e})",
                      flush=True)
    print(f"{differ} of {len(NS) * len(BKS) * len(SEEDS)} cases differ")
    return 1 if differ else 0


def run_aot() -> int:
    for n in NS:
        for name in KERNELS:
            ck = aot(name, n, 128)
            ptx = ck.asm["ptx"]
            print(f"{name:7s} N={n:3d} BK=128: mma.sync {ptx.count('mma.sync.aligned')}, "
                  f"wgmma {ptx.count('wgmma.mma_async')}, shared {ck.metadata.shared} B",
                  flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aot", action="store_true", help="compile for sm_90 here, no GPU")
    args = ap.parse_args()
    return run_aot() if args.aot else run_gpu()


if __name__ == "__main__":
    sys.exit(main())
