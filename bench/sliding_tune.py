#!/usr/bin/env python3
"""The FP8 sliding-window attention's settings on the H200 (window 513, the 40 sliding layers of
Kolibri-1). One call:

    python3 bench/sliding_tune.py [--out DIR] [--single]

At 32k context, decode, GQA 20/4, blocks of 64, B = 1 and 64: the defaults
(`fp8_paged_attention.settings(513)`) and then PART x BLOCK_N x num_warps x num_stages (GRID),
timed as bench/plugins.py (one CUDA graph over rotated cache copies, median of 5 x 20 replays).
PART and BLOCK_N set the reduction order, so the bits change with them: each variant's output
is compared with the fp32 reference instead (rel err). The variant with the smallest sum of
time / default time over the batches then runs gpu_check's FP8 attention checks (references,
CUDA graphs replayed into a larger bucket, batch invariance) under its settings.
--single: B = 1, 4, 16, 64, the defaults against fp8_paged_attention.SINGLE_SPLIT (one program
over the whole window, no attn_combine launch) x BLOCK_N x num_warps x num_stages (GRID_SINGLE;
PART 0 in the log), then gpu_check's FP8 attention checks under the best.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
import gpu_check_base as GB  # noqa: E402
from gpu_check import load_plugins  # noqa: E402

load_plugins()
import gpu_check_attn as GA  # noqa: E402
from kolibri_trt_plugins import testing as T  # noqa: E402
from kolibri_trt_plugins.fp8_paged_attention import (fp8_paged_attention,  # noqa: E402
                                                     fp8_paged_attention_ref)

FA = importlib.import_module("kolibri_trt_plugins.fp8_paged_attention")
WINDOW, CTX, BLK, HQ, HKV = 513, 32768, 64, 20, 4
GRID = ([64, 128, 256], [32, 64], [1, 4], [2, 3])    # PART, BLOCK_N, num_warps, num_stages
# PART 0: SINGLE_SPLIT. Stages 2-4 timed alike on the H100 (bench/results/h100-2026-12-07b/ss/:
# ~1.6 µs per 64-key step at B = 1): they compile to one K / V buffer (the page lookup takes a
# stage); `bench/aot_sass.py fp8_attn --set SINGLE=1 --stages S` gives 2 / 3 / 4 buffers at
# S = 5 / 7 / 9 (sm_90, 64 keys, 4 warps: 39 / 55 / 72 KB of shared memory).
GRID_SINGLE = ([0], [32, 64, 128], [4, 8], [5, 7, 9])


def apply(part: int, block_n: int, warps: int, stages: int) -> None:
    """PART 0: the SINGLE_SPLIT form (its own launch config), else PART splits."""
    FA.SINGLE_SPLIT = part == 0
    FA.PART, FA.BLOCK_N = max(part, block_n), block_n
    (FA.TUNE_SINGLE if part == 0 else FA.TUNE).update(num_warps=warps, num_stages=stages)


def inputs(b: int):
    """(calls over rotated cache copies, one call's output and its fp32 reference, bytes)."""
    sl = torch.full((b,), CTX, dtype=torch.int32, device=PT.DEV)
    cu = torch.arange(0, b + 1, dtype=torch.int32, device=PT.DEV)
    q = torch.randn((b, HQ, 128), device=PT.DEV).bfloat16()
    one = torch.ones(1, device=PT.DEV)
    nbytes = b * WINDOW * HKV * 256
    sets = []
    for _ in range(PT.sets_for(nbytes)):
        bt, nb = PT.paged_tables(b, CTX, BLK)
        kv = [torch.randn((nb, BLK, HKV, 128), device=PT.DEV).to(PT.E4M3) for _ in range(2)]
        sets.append((bt, kv))
    calls = [lambda bt=bt, kv=kv: fp8_paged_attention(q, kv[0], kv[1], one, one, bt, sl, cu, CTX,
                                                      1, window=WINDOW) for bt, kv in sets]
    bt, kv = sets[0]
    ref = lambda: fp8_paged_attention_ref(q, kv[0], kv[1], one, one, bt, sl, cu,  # noqa: E731
                                          128 ** -0.5, WINDOW)
    return calls, ref, nbytes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--single", action="store_true", help="the SINGLE_SPLIT form (GRID_SINGLE)")
    args = ap.parse_args()   # --out (read by PT.out_dir); unknown options raise
    out = PT.out_dir()
    default = (FA.PART, FA.BLOCK_N, FA.TUNE["num_warps"], FA.TUNE["num_stages"])
    combos = ([c for c in itertools.product(*GRID_SINGLE)] if args.single else
              [c for c in itertools.product(*GRID) if c[0] % c[1] == 0])
    batches = (1, 4, 16, 64) if args.single else (1, 64)
    times: dict[tuple, list[float]] = {}
    rows = []
    for b in batches:
        calls, ref, nbytes = inputs(b)
        want = ref()
        for c, us, err in PT.variants(f"B={b}", calls, default, combos, apply,
                                      lambda y, want=want: T.rel_err(y, want)):
            times.setdefault(c, []).append(us)
            rows.append(dict(B=b, part=c[0], block_n=c[1], warps=c[2], stages=c[3], us=us,
                             rel_err=err, pct=100 * nbytes / (us * 1e-6) / PT.BW))
            print(f"B={b:2d} part={c[0]:3d} block_n={c[1]:2d} warps={c[2]} stages={c[3]} "
                  f"{us:7.1f} us rel err {err:.1e}{'  (default)' if c == default else ''}",
                  flush=True)
    full = {c: t for c, t in times.items() if len(t) == len(batches)}
    score = {c: sum(a / d for a, d in zip(t, full[default])) for c, t in full.items()}
    best = min(score, key=score.get)
    print(f"BEST {best}: " + ", ".join(f"B={b} {t:.1f} us (default {d:.1f})" for b, t, d in
                                       zip(batches, full[best], full[default])), flush=True)
    apply(*best)
    GA.check_attention("fp8", T.gen(1002), False)
    apply(*default)
    for name, ok, msg in GB.RESULTS:
        print(f"   {'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
    failed = [r for r in GB.RESULTS if not r[1]]
    print(f"checks of {best}: {len(GB.RESULTS) - len(failed)}/{len(GB.RESULTS)} passed", flush=True)
    name = "sliding_tune_single.json" if args.single else "sliding_tune.json"
    (out / name).write_text(json.dumps(dict(rows=rows, best=best), indent=1))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
