#!/usr/bin/env python3
"""What one `kolibri_trt.sampling.sample` call costs: top-level aten ops (each one a kernel
launch on CUDA) and wall time per call, for N sampled rows over a V-token vocabulary.

    python3 bench/sampler_ops.py [--device cpu|cuda] [--vocab 16384 131072] [--rows 1 8]
                                 [--filter] [--fused]

--filter: top_k=50, top_p=0.9 on every row (the sort path); --fused: sampling.FUSED_SAMPLER.
Runs against whatever `kolibri_trt` is importable (e.g. an older checkout on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from kolibri_trt import sampling
from kolibri_trt.sampling import SamplingParams


def measure(device: str, V: int, N: int, filtered: bool, iters: int = 20) -> tuple[int, float]:
    """(top-level aten ops, ms per call) of sample() on N sampled rows."""
    logits = torch.randn(N, V, device=device)
    extra = dict(top_k=50, top_p=0.9) if filtered else {}
    params = [SamplingParams(temperature=0.8, seed=i, **extra) for i in range(N)]
    pos = torch.arange(N)   # a tensor: older versions of sample() take only that
    sampling.sample(logits, params, pos)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sampling.sample(logits, params, pos)
    ops = sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        sampling.sample(logits, params, pos)
    sync()
    return ops, (time.perf_counter() - t) / iters * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, nargs="+", default=[16384, 131072])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--filter", action="store_true")
    ap.add_argument("--fused", action="store_true")
    args = ap.parse_args()
    if args.fused:
        if not hasattr(sampling, "FUSED_SAMPLER"):
            raise SystemExit("--fused: this kolibri_trt has no sampling.FUSED_SAMPLER")
        sampling.FUSED_SAMPLER = True
    torch.set_num_threads(1)
    for V in args.vocab:
        for N in args.rows:
            ops, ms = measure(args.device, V, N, args.filter)
            print(f"V={V:6d} rows={N:2d} filter={args.filter} fused={args.fused}: "
                  f"{ops:4d} aten ops, {ms:8.3f} ms per call ({args.device})", flush=True)


if __name__ == "__main__":
    main()
