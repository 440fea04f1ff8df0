#!/usr/bin/env python3
"""Time the transposed INT4 attention (bench/int4_attn_t.py: query rows in the MMA's N) against
the plugin's kernel and FP8 full-causal attention at 32k, then check the best setting. One call:

    python3 bench/int4_attn_t_tune.py [--budget SECONDS]

Decode at B = 1, 16, 64 for every (BLOCK_N, warps, stages) in VARIANTS; verification (4 query
tokens per stream, 20 rows) at B = 16 with 8, 16 and 32 columns per program. Checks under the
best decode setting: gpu_check's INT4 attention cases (reference, graph replay into a larger
bucket, batch invariance 1 vs 16, decode and verify) and decode rows with QN 8 against QN 32
(bit-identical). Timing as bench/plugins.py. Log: $OUT/int4_attn_t.log.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import traceback

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_check as GC  # noqa: E402  (maps kolibri_trt_plugins onto ./plugins)
import int4_attn_t as X  # noqa: E402
import plugin_timing as PT  # noqa: E402

from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention  # noqa: E402
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402

IA = sys.modules["kolibri_trt_plugins.int4_paged_attention"]
DEV, HQ, HKV, CTX, BLK = "cuda", 20, 4, 32768, 64
VARIANTS = [(32, 1, 5), (16, 1, 5), (16, 1, 7), (64, 1, 5), (32, 2, 5), (64, 2, 5), (128, 4, 3)]
LOG: list[str] = []
OUT = pathlib.Path(os.environ.get("OUT", "/tmp"))


def say(msg):
    print(msg, flush=True)
    LOG.append(msg)
    (OUT / "int4_attn_t.log").write_text("\n".join(LOG) + "\n")


def apply(v):
    X.BLOCK_N = v[0]
    X.TUNE.clear()
    X.TUNE.update(num_warps=v[1], num_stages=v[2])


def int4_inputs(B, q_len):
    sl = torch.full((B,), CTX, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV) * q_len
    bt, nb = PT.paged_tables(B, CTX, BLK)
    q = torch.randn((B * q_len, HQ, 128), device=DEV).bfloat16()
    nbytes = B * CTX * HKV * 136 + 4 * q.numel()
    ns = PT.sets_for(nbytes)
    kc = torch.randint(0, 256, (ns * nb, BLK, HKV, 64), dtype=torch.uint8, device=DEV)
    vc = torch.randint(0, 256, (ns * nb, BLK, HKV, 64), dtype=torch.uint8, device=DEV)
    km, vm = [torch.stack([torch.rand((ns * nb, BLK, HKV), device=DEV) * 0.3 + 0.01,
                           -torch.rand((ns * nb, BLK, HKV), device=DEV)], -1).half()
              for _ in range(2)]
    return q, kc, vc, km, vm, [bt + i * nb for i in range(ns)], sl, cu, nbytes


def fp8_time(B):
    sl = torch.full((B,), CTX, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV)
    bt, nb = PT.paged_tables(B, CTX, BLK)
    q = torch.randn((B, HQ, 128), device=DEV).bfloat16()
    nbytes = B * CTX * HKV * 256 + 4 * q.numel()
    ns = PT.sets_for(nbytes)
    kf = torch.randn((ns * nb, BLK, HKV, 128), device=DEV).to(torch.float8_e4m3fn)
    vf = torch.randn((ns * nb, BLK, HKV, 128), device=DEV).to(torch.float8_e4m3fn)
    one = torch.ones(1, device=DEV)
    us = PT.time_calls([lambda b=bt + i * nb: fp8_paged_attention(q, kf, vf, one, one, b, sl, cu,
                                                                   CTX, 1, window=0)
                        for i in range(ns)])
    say(f"B={B:2d} fp8 full causal (default)      {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s")
    return us


def int4_times(B, q_len, deadline, results):
    t = int4_inputs(B, q_len)
    bts, nbytes = t[5], t[8]
    args = lambda b: t[:5] + (b,) + t[6:8]  # noqa: E731
    us = PT.time_calls([lambda b=b: int4_paged_attention(*args(b), CTX, q_len) for b in bts])
    results[("plugin", B, q_len)] = us
    say(f"B={B:2d} q={q_len} int4 plugin              {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s")
    ref = int4_paged_attention(*args(bts[0]), CTX, q_len).float()
    runs = [(v, None) for v in VARIANTS] if q_len == 1 else [(results["best"], n) for n in (8, 16, 32)]
    for v, qn in runs:
        if time.time() > deadline:
            say(f"B={B} q={q_len} {v} qn={qn}: skipped (budget)")
            continue
        try:
            apply(v)
            out = X._launch(*args(bts[0]), 128 ** -0.5, CTX, q_len, 0, 512, False, qn=qn).float()
            rel = float((out - ref).norm() / ref.norm())
            us = PT.time_calls([lambda b=b: X._launch(*args(b), 128 ** -0.5, CTX, q_len, 0, 512,
                                                      False, qn=qn) for b in bts])
            results[(v, B, q_len, qn)] = us
            say(f"B={B:2d} q={q_len} int4 T {str(v):12s} qn={qn}  {us:8.1f} us  "
                f"{nbytes / us / 1e6:5.2f} TB/s  rel vs plugin {rel:.1e}")
        except Exception as exc:
            say(f"B={B} q={q_len} {v} qn={qn} FAILED: {str(exc)[:400]}")


def checks(v):
    apply(v)
    IA._launch = X._launch      # the op now runs the transposed kernel
    n0 = len(GC.RESULTS)
    GC.check_attention("int4", GC.T.gen(1001), False)
    q, kc, vc, km, vm, bts, sl, cu, _ = int4_inputs(16, 1)
    a = X._launch(q, kc, vc, km, vm, bts[0], sl, cu, 128 ** -0.5, CTX, 1, 0, 512, False, qn=8)
    b = X._launch(q, kc, vc, km, vm, bts[0], sl, cu, 128 ** -0.5, CTX, 1, 0, 512, False, qn=32)
    GC.record("int4 T decode rows QN 8 vs QN 32", torch.equal(a, b), "bit-identical"
              if torch.equal(a, b) else "DIFFERS")
    res = GC.RESULTS[n0:]
    say(f"CHECK {v}: {sum(r[1] for r in res)}/{len(res)} passed")
    for name, ok, msg in res:
        say(f"   {'PASS' if ok else 'FAIL'} {name}: {msg}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the timings")
    a = ap.parse_args()
    deadline = time.time() + a.budget
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    results: dict = {}
    fp8 = {}
    for B in (16, 1, 64):
        try:
            fp8[B] = fp8_time(B)
            int4_times(B, 1, deadline, results)
            torch.cuda.empty_cache()  # the inputs died with int4_times
        except Exception:
            say(traceback.format_exc())
    ok = [v for v in VARIANTS if all((v, B, 1, None) in results for B in fp8)]
    if not ok:
        say("no variant timed at every batch")
        return 1
    score = lambda v: min(fp8[B] / results[(v, B, 1, None)] for B in fp8)  # noqa: E731
    say("\nvariant (BLOCK_N, warps, stages): FP8/INT4 speed-up at B = " + ", ".join(map(str, fp8)))
    for v in sorted(ok, key=score, reverse=True):
        say(f"  {str(v):12s} " + "  ".join(f"{fp8[B] / results[(v, B, 1, None)]:5.2f}x"
                                          for B in fp8))
    say("  plugin       " + "  ".join(f"{fp8[B] / results[('plugin', B, 1)]:5.2f}x" for B in fp8))
    results["best"] = max(ok, key=score)
    try:
        int4_times(16, 4, deadline + 60, results)
    except Exception:
        say(traceback.format_exc())
    try:
        checks(results["best"])
    except Exception:
        say(traceback.format_exc())
    return 0


if __name__ == "__main__":
    sys.exit(main())
