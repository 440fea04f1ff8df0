#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) inside a CUDA graph: what it saves per small kernel.

    python3 bench/pdl_probe.py [--out DIR] [--chain 200]

A chain of `--chain` dependent GEMVs of the drafter's and the mini target's sizes (bf16 weight
[N, K], x = the previous kernel's output, one K step), captured in one CUDA graph and replayed;
µs per kernel for:
- plain: ordinary launches (each kernel starts when the previous one has finished);
- pdl: launched with `launch_pdl=True`; each kernel lets its dependents launch at once
  (`gdc_launch_dependents`) and waits for its predecessor (`gdc_wait`) before any load, so
  only the launch and the programs' start overlap the previous kernel;
- pdl_prefetch: as pdl, but the weight tile (which no kernel writes) is loaded before
  `gdc_wait`: only the activation's load and the product wait for the predecessor.
Every variant's final output is compared with plain's (the same bits: the same maths). The
figures decide whether the plugins' kernels should launch with PDL (the mini model's decode
step is 139 launches of 1-12 µs and the drafter's round 81: bench/results/h200-2026-11-30j/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plugin_timing import time_calls  # noqa: E402

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:                      # CPU machines: the module imports, main() refuses
    triton = None

SHAPES = ((768, 256), (256, 256), (1024, 256), (2560, 2560))   # (N, K): mini / drafter, full
BLOCK_N = 64
BLOCK_K = 256       # every K of SHAPES is a multiple


if triton is not None:
    @triton.jit
    def _gemv(w_ptr, x_ptr, y_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, MODE: tl.constexpr):
        """y[n] = sum_k w[n, k] x[k] (fp32 accumulate, bf16 out; K a multiple of BLOCK_K);
        MODE 0 plain, 1 pdl (wait first), 2 pdl with the first weight tile loaded before the
        wait."""
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K)
        m = n < N
        if MODE > 0:
            gdc_launch_dependents()
        if MODE == 2:
            w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=m[:, None], other=0.0)
            gdc_wait()
        else:
            if MODE == 1:
                gdc_wait()
            w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=m[:, None], other=0.0)
        x = tl.load(x_ptr + k)
        y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            w = tl.load(w_ptr + n[:, None] * K + k0 + k[None, :], mask=m[:, None], other=0.0)
            x = tl.load(x_ptr + k0 + k)
            y += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(y_ptr + n, y.to(tl.bfloat16), mask=m)


def chain(ws, x0, bufs, mode: int) -> None:
    """Launch the chain: kernel i reads bufs[i % 2][:K] (x0 first) and writes bufs[(i+1) % 2]."""
    x = x0
    for i, w in enumerate(ws):
        N, K = w.shape
        y = bufs[(i + 1) % 2]
        _gemv[(triton.cdiv(N, BLOCK_N),)](w, x, y, N, K=K, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                                          MODE=mode, num_warps=4, launch_pdl=mode > 0)
        x = y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--chain", type=int, default=200)
    args = ap.parse_args(argv)
    if triton is None or not torch.cuda.is_available():
        print("pdl_probe: needs CUDA and Triton", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    rows = []
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__)
    for N, K in SHAPES:
        ws = [(torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16).cuda()
              for _ in range(8)]
        ws = [ws[i % 8] for i in range(args.chain)]
        x0 = torch.randn(max(N, K), generator=g).to(torch.bfloat16).cuda()
        outs = {}
        for name, mode in (("plain", 0), ("pdl", 1), ("pdl_prefetch", 2)):
            bufs = [torch.zeros(max(N, K), dtype=torch.bfloat16, device="cuda") for _ in range(2)]
            us = time_calls([lambda: chain(ws, x0, bufs, mode)])   # one graph, median
            outs[name] = bufs[args.chain % 2].clone()
            same = torch.equal(outs[name], outs["plain"])
            rows.append(dict(N=N, K=K, variant=name, us_per_kernel=us / args.chain, same=same))
            print(f"N={N:5d} K={K:5d} {name:13s} {us / args.chain:6.2f} us/kernel "
                  f"({us:8.1f} us per {args.chain}) bits == plain: {same}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pdl_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
