#!/usr/bin/env python3
"""Probe: an FP8 GEMV whose K step is split across the program's warps (a batched 3-D dot),
against fp8_gemv's defaults at decode sizes, on the H200. One call:

    python3 bench/ksplit_probe.py [--out DIR] [--ms 1,4,8]

Why: at one row fp8_gemv's QKV runs 224 one-warp programs, 1.7 warps per SM on 4 schedulers,
each warp issuing one instruction per ~3.7 cycles (Nsight Compute,
bench/results/h200-2026-12-01e/nr/qkv_m1_*): the warps' instruction streams, not the bytes,
set its 7-8 µs. Here each program takes BN weight rows and splits every K step of BK into Q
quarters: tile [Q, BN, BK/Q] times x^T [Q, BK/Q, 8] (tl.dot over a leading batch dimension;
Triton gives each of Q warps one quarter: AOT for sm_90, warpsPerCTA [4, 1, 1], 4 HMMA per
warp per K step against 16 in one warp), the Q fp32 partials summed at the end. The sum order
differs from fp8_gemv's (other bits): a kernel adopting it would change every row count's form
together. This probe only times the form (per-tensor scale, decode as fp8_gemv's DECODE 3) and
checks it against fp8_gemv within PROBE_RTOL. JSON: DIR/ksplit_probe.json.

Measured (bench/results/h200-2026-12-02c/ks/): QKV at 1 / 8 rows 7.04 / 6.93 -> 5.24 / 5.21 µs,
o_proj 6.53 / 6.68 -> 4.97 / 4.95 (Q 2, BN 16, BK 512, stages 4). Taken into fp8_gemv and the
MoE as K_PAIRS (kp/, kq/) and taken out again: Triton lays a 3-D dot's warps along its batch
dimension only (AOT sm_90), so with more warps than batches every warp repeats the decode and
the MMA (the MoE's 4-warp tiles, fp8_gemv's 16-row form: 2-4x the instructions per warp).
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from gpu_check import load_plugins  # noqa: E402

load_plugins()
from kolibri_trt_plugins._e4m3_decode import e4m3_to_bf16  # noqa: E402
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402

K = 2560
SHAPES = (("qkv", 3584), ("o_proj", 2560))
PROBE_RTOL = 2e-2   # another fp32 sum order and bf16 output: only gross errors fail
GRID = list(itertools.product((1, 2, 4, 8), (16, 32), (256, 512), (2, 3, 4)))  # Q, BN, BK, stages


@triton.jit
def _ksplit_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, Q: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, R: tl.constexpr, DEC: tl.constexpr):
    n0 = tl.program_id(0) * BN
    KQ: tl.constexpr = BK // Q
    n = n0 + tl.arange(0, BN)
    nmask = n < N
    rows = tl.arange(0, R)
    acc = tl.zeros([Q, BN, R], tl.float32)
    q3 = tl.arange(0, Q)[:, None, None]
    for k0 in range(0, K, BK):
        kx = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + n.to(tl.int64)[:, None] * K + kx[None, :], mask=nmask[:, None],
                    other=0.0)
        wb = tl.permute(tl.reshape(e4m3_to_bf16(w, DEC), (BN, Q, KQ)), (1, 0, 2))
        kq = k0 + q3 * KQ + tl.arange(0, KQ)[None, :, None]
        xt = tl.load(x_ptr + rows[None, None, :] * K + kq,
                     mask=(rows < M)[None, None, :], other=0.0)
        if DEC == 1:   # the interpreter: its bf16 3-D dot returns garbage; fp32 is exact here
            wb = wb.to(tl.float32)
            xt = xt.to(tl.float32)
        acc = tl.dot(wb, xt, acc)
    y = tl.sum(acc, axis=0) * tl.load(s_ptr)
    tl.store(y_ptr + rows[None, :] * N + n[:, None], y.to(tl.bfloat16),
             mask=(rows < M)[None, :] & nmask[:, None])


def ksplit(x, w, s, q, bn, bk, stages):
    """y = x · (w · s)^T, bf16 [M <= 8, N]: the probe kernel (CPU tensors: the interpreter,
    with Triton's e4m3 conversion instead of the inline-asm decode)."""
    M, N = x.shape[0], w.shape[0]
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    _ksplit_kernel[(triton.cdiv(N, bn),)](x, w, s, y, M, N, K, Q=q, BN=bn, BK=bk, R=8,
                                          DEC=1 if x.device.type == "cpu" else 3, num_warps=q, num_stages=stages)
    return y


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else /tmp)")
    ap.add_argument("--ms", default="1,4,8", help="rows per call (at most 8), comma-separated")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    out = PT.out_dir(["--out", args.out] if args.out else [])
    rows, bad = [], 0
    for name, n in SHAPES:
        sets = [(torch.randn((n, K), device=PT.DEV).to(PT.E4M3),
                 torch.tensor([0.02], device=PT.DEV)) for _ in range(PT.sets_for(n * K))]
        for m in ms:
            x = torch.randn((m, K), device=PT.DEV).bfloat16()
            ref = fp8_gemv(x, *sets[0]).float()
            base = PT.time_calls([lambda w=w: fp8_gemv(x, *w) for w in sets])
            nbytes = n * K + m * (n + K) * 2
            print(f"{name:7s} M={m} fp8_gemv default {base:7.2f} us "
                  f"{100 * nbytes / base / 1e6 * 1e12 / PT.BW:5.1f}%", flush=True)
            rows.append(dict(shape=name, M=m, variant="default", us=base))
            for q, bn, bk, st in GRID:
                try:
                    got = ksplit(x, *sets[0], q, bn, bk, st).float()
                    err = ((got - ref).norm() / ref.norm()).item()
                    us = PT.time_calls([lambda w=w: ksplit(x, *w, q, bn, bk, st) for w in sets])
                except Exception as exc:   # a variant that does not compile is a result too
                    print(f"{name:7s} M={m} Q={q} BN={bn} BK={bk} stages={st} failed: "
                          f"{type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                bad += err > PROBE_RTOL
                rows.append(dict(shape=name, M=m, variant=dict(Q=q, BN=bn, BK=bk, stages=st),
                                 us=us, rel_err=err))
                print(f"{name:7s} M={m} Q={q} BN={bn:2d} BK={bk} stages={st} {us:7.2f} us  "
                      f"{base / us:5.2f}x  rel err {err:.2e}", flush=True)
        del sets
        torch.cuda.empty_cache()
    (out / "ksplit_probe.json").write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
