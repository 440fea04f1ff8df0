#!/usr/bin/env python3
"""INT4 paged attention v5 (query rows as the MMA's N, plugins/int4_paged_attention.py): its
settings against FP8 full-causal attention at 32k. One call:

    python3 bench/int4_attn_t_tune.py [--budget SECONDS] [--regs]

Decode at B = 1, 16, 64 for BLOCK_N in BLOCK_NS; verification at B = 16 with 2, 4 and 8 query
tokens per stream for every (BLOCK_N, ROWS_MAX) in VERIFY, each against the defaults' output.
Then, under the defaults: gpu_check's INT4 attention cases (reference, graph replay into a larger
bucket, batch invariance 1 vs 16, decode and verify) and decode rows of 8-row against 16-row
programs. Timing as bench/plugins.py. Log: $OUT/int4_attn_t.log. Rounds with the frozen v4
beside v5 (bench/int4_attn_v4.py, last at 37457e6): bench/results/h200-2026-11-30m/mu/, mv/.
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
import plugin_timing as PT  # noqa: E402

from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention  # noqa: E402
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402

IA = sys.modules["kolibri_trt_plugins.int4_paged_attention"]
DEV, HQ, HKV, CTX, BLK = "cuda", 20, 4, 32768, 64
BLOCK_NS = (32, 64)
VERIFY = ((32, 16), (32, 8), (64, 16), (64, 8))
LOG: list[str] = []
OUT = pathlib.Path(os.environ.get("OUT", "/tmp"))
SCALE = 128 ** -0.5


def say(msg):
    print(msg, flush=True)
    LOG.append(msg)
    (OUT / "int4_attn_t.log").write_text("\n".join(LOG) + "\n")


def int4_inputs(B, q_len):
    sl = torch.full((B,), CTX, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV) * q_len
    bt, nb = PT.paged_tables(B, CTX, BLK)
    q = torch.randn((B * q_len, HQ, 128), device=DEV).bfloat16()
    nbytes = B * CTX * HKV * 136 + 4 * q.numel()
    ns = PT.sets_for(nbytes)
    kc = torch.randint(0, 256, (ns * nb, HKV, BLK, 64), dtype=torch.uint8, device=DEV)
    vc = torch.randint(0, 256, (ns * nb, HKV, 64, BLK), dtype=torch.uint8, device=DEV)  # dim-major
    km, vm = [torch.stack([torch.rand((ns * nb, HKV, BLK), device=DEV) * 0.3 + 0.01,
                           -torch.rand((ns * nb, HKV, BLK), device=DEV)], -1).half()
              for _ in range(2)]   # head-major pages (the plugin's layout)
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
    say(f"B={B:2d} fp8 full causal (default)        {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s")
    return us


def setting(bn, rows_max):
    IA.BLOCK_N, IA.ROWS_MAX = bn, rows_max


def int4_times(B, q_len, deadline, results):
    t = int4_inputs(B, q_len)
    bts, nbytes = t[5], t[8]
    args = lambda b: t[:5] + (b,) + t[6:8]  # noqa: E731
    setting(*DEFAULTS)
    ref = int4_paged_attention(*args(bts[0]), CTX, q_len).float()   # the defaults' output
    runs = [(bn, 16) for bn in BLOCK_NS] if q_len == 1 else list(VERIFY)
    for bn, rows in runs:
        if time.time() > deadline:
            say(f"B={B} q={q_len} ({bn}, {rows}): skipped (budget)")
            continue
        try:
            setting(bn, rows)
            out = int4_paged_attention(*args(bts[0]), CTX, q_len).float()
            rel = float((out - ref).norm() / ref.norm())
            us = PT.time_calls([lambda b=b: int4_paged_attention(*args(b), CTX, q_len)
                                for b in bts])
            results[((bn, rows), B, q_len)] = us
            say(f"B={B:2d} q={q_len} int4 v5 BLOCK_N {bn:3d} rows {rows:2d} {us:8.1f} us  "
                f"{nbytes / us / 1e6:5.2f} TB/s  rel vs defaults {rel:.1e}")
        except Exception as exc:
            say(f"B={B} q={q_len} ({bn}, {rows}) FAILED: {str(exc)[:400]}")
    setting(*DEFAULTS)


def checks():
    n0 = len(GC.RESULTS)
    GC.check_attention("int4", GC.T.gen(1001), False)
    t = int4_inputs(16, 1)
    args = t[:5] + (t[5][0],) + t[6:8]
    a = int4_paged_attention(*args, CTX, 1)
    IA.ROWS_DECODE = 16
    b = int4_paged_attention(*args, CTX, 1)
    IA.ROWS_DECODE = 8
    GC.record("int4 v5 decode rows: 8-row vs 16-row programs", torch.equal(a, b),
              "bit-identical" if torch.equal(a, b) else "DIFFERS")
    res = GC.RESULTS[n0:]
    say(f"CHECK defaults {DEFAULTS}: {sum(r[1] for r in res)}/{len(res)} passed")
    for name, ok, msg in res:
        say(f"   {'PASS' if ok else 'FAIL'} {name}: {msg}")


DEFAULTS = (IA.BLOCK_N, IA.ROWS_MAX)


def regs_sweep(caps_decode=(0, 168, 152), caps_verify=(0, 240)):
    """--regs: maxnreg of the 8-row (decode) and the 16-row programs (launch options only: the
    bits stay), decode at 32k B = 1, 4, 16, 64 and at 1k B = 1, verification of 4 tokens."""
    global CTX
    saved = dict(IA.TUNE_DECODE), dict(IA.TUNE)
    base = dict(num_warps=1, num_stages=5)
    cases = [(1, 1, 32768), (4, 1, 32768), (16, 1, 32768), (64, 1, 32768), (1, 1, 1024),
             (16, 4, 32768)]
    for B, q_len, ctx in cases:
        CTX = ctx
        t = int4_inputs(B, q_len)
        bts, nbytes = t[5], t[8]
        args = lambda b: t[:5] + (b,) + t[6:8]  # noqa: E731
        first = None
        for cap in (caps_decode if q_len == 1 else caps_verify):
            tune = dict(base, **({"maxnreg": cap} if cap else {}))
            IA.TUNE_DECODE.clear()
            IA.TUNE_DECODE.update(tune if q_len == 1 else base)
            IA.TUNE.clear()
            IA.TUNE.update(tune if q_len > 1 else base)
            out = int4_paged_attention(*args(bts[0]), ctx, q_len)
            first = out if first is None else first
            us = PT.time_calls([lambda b=b: int4_paged_attention(*args(b), ctx, q_len)
                                for b in bts])
            say(f"B={B:2d} q={q_len} ctx={ctx:5d} maxnreg {cap or '-':>4}  {us:8.1f} us  "
                f"{nbytes / us / 1e6:5.2f} TB/s  bits as the first: {torch.equal(out, first)}")
    CTX = 32768
    IA.TUNE_DECODE.clear()
    IA.TUNE_DECODE.update(saved[0])
    IA.TUNE.clear()
    IA.TUNE.update(saved[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the timings")
    ap.add_argument("--regs", action="store_true", help="only the maxnreg sweep (regs_sweep)")
    a = ap.parse_args()
    if a.regs:
        say(f"{torch.cuda.get_device_name()} torch {torch.__version__}: maxnreg sweep")
        regs_sweep()
        return 0
    deadline = time.time() + a.budget
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__}; defaults (BLOCK_N, "
        f"ROWS_MAX) {DEFAULTS}")
    results: dict = {}
    fp8 = {}
    for B in (16, 1, 64):
        try:
            fp8[B] = fp8_time(B)
            int4_times(B, 1, deadline, results)
        except Exception:
            say(traceback.format_exc())
        torch.cuda.empty_cache()  # the inputs died with int4_times
    say("\nFP8/INT4 speed-up at B = " + ", ".join(map(str, fp8)))
    for key in [(bn, 16) for bn in BLOCK_NS]:
        if all((key, B, 1) in results for B in fp8):
            say(f"  {str(key):10s} " + "  ".join(f"{fp8[B] / results[(key, B, 1)]:5.2f}x"
                                                for B in fp8))
    for q_len in (2, 4, 8):
        try:
            int4_times(16, q_len, deadline + 60, results)
        except Exception:
            say(traceback.format_exc())
        torch.cuda.empty_cache()
    try:
        checks()
    except Exception:
        say(traceback.format_exc())
    return 0


if __name__ == "__main__":
    sys.exit(main())
