"""What reading N bytes can cost at best on this GPU, in bench/plugins.py's harness: a Triton
kernel that only streams the bytes (each program sums its contiguous share as int32 and stores
one word), tuned over grid size, vector width and warps, timed like the kernels (one CUDA graph
over input sets rotated so that the L2 cannot serve them, `plugin_timing.time_calls`).

At decode sizes a kernel's time is its launch, the first bytes' latency and the tail, not the
bandwidth: this ceiling says how far from the best possible read a kernel is at its size, next
to the % of 4.14 TB/s that bench/plugins.py reports.

    python3 bench/read_ceiling.py [--mb 0.5,2,9.2,43,189,1179]   # the table alone
"""

from __future__ import annotations

import argparse
import sys

import plugin_timing as PT
import torch
import triton
import triton.language as tl

# (programs per SM, int32 words per program step, num_warps): every launch config tried
CONFIGS = [(p, b, w) for p in (1, 2, 4, 8) for b in (1024, 4096) for w in (4, 8)]
_CACHE: dict[int, tuple[float, tuple]] = {}


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, per_prog, BLOCK: tl.constexpr):
    """Program p sums words [p·per_prog, (p+1)·per_prog) of x (int32, n words); one store."""
    p = tl.program_id(0)
    lo = p.to(tl.int64) * per_prog
    acc = tl.zeros([BLOCK], tl.int32)
    for k in range(0, per_prog, BLOCK):
        offs = lo + k + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)   # per_prog: a multiple of BLOCK
    tl.store(out_ptr + p, tl.sum(acc, 0))


def _calls(bufs, out, n, programs, block, warps):
    per = triton.cdiv(triton.cdiv(n, programs), block) * block
    grid = (triton.cdiv(n, per),)
    return [lambda b=b: _read_kernel[grid](b, out, n, per, BLOCK=block, num_warps=warps)
            for b in bufs]


def ceiling_us(nbytes: float) -> tuple[float, tuple]:
    """(µs, (programs per SM, BLOCK, num_warps)) of the fastest read of nbytes (rounded up to
    whole int32 words) among CONFIGS; cached per size."""
    n = max(1, int(-(-nbytes // 4)))
    if n in _CACHE:
        return _CACHE[n]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bufs = [torch.randint(-9, 9, (n,), dtype=torch.int32, device=PT.DEV)
            for _ in range(PT.sets_for(n * 4))]
    out = torch.empty(sms * 8, dtype=torch.int32, device=PT.DEV)
    best = (float("inf"), ())
    for per_sm, block, warps in CONFIGS:
        if per_sm > 1 and n < sms * per_sm * block:    # fewer words than one step per program
            continue
        us = PT.time_calls(_calls(bufs, out, n, sms * per_sm, block, warps))
        best = min(best, (us, (per_sm, block, warps)))
    _CACHE[n] = best
    del bufs
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", default="0.5,1,2,4,9.2,13.1,20,43,87,189,285,482,1179")
    args = ap.parse_args(argv)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    print(f"{'MB':>8s} {'best µs':>9s} {'TB/s':>6s} {'% of 4.14':>9s} {'floor µs':>9s} config")
    for mb in (float(v) for v in args.mb.split(",")):
        us, cfg = ceiling_us(mb * 1e6)
        tbs = mb * 1e6 / (us * 1e-6) / 1e12
        print(f"{mb:8.2f} {us:9.2f} {tbs:6.2f} {100 * tbs * 1e12 / PT.BW:8.1f}% "
              f"{mb * 1e6 / PT.BW * 1e6:9.2f} {cfg}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
