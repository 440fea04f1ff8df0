#!/usr/bin/env python3
"""INT4 attention with W warps per program (bench/int4_attn_w.py) against v5 (the plugin) and
FP8 full-causal attention, H200, one call:

    python3 bench/int4_attn_w_tune.py

Decode at 32k for B = 1, 4, 16, 64, at 1k and 4k for B = 1; verification (4 tokens) at 32k,
B = 16; for W in WS. Then gpu_check's INT4 attention cases (reference, graph replay into a
larger bucket, batch invariance 1 vs 16, decode and verify) under each W > 1. Timing as
bench/plugins.py. Log: $OUT/int4_attn_w.log.
"""

from __future__ import annotations

import os
import pathlib
import sys
import traceback

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_check as GC  # noqa: E402  (maps kolibri_trt_plugins onto ./plugins)
import int4_attn_t_tune as TT  # noqa: E402
import int4_attn_w as X  # noqa: E402
import plugin_timing as PT  # noqa: E402

from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402

IA = TT.IA
WS = (1, 2, 4)
OUT = pathlib.Path(os.environ.get("OUT", "/tmp"))
TT.LOG.clear()
LOGFILE = OUT / "int4_attn_w.log"


def say(msg):
    print(msg, flush=True)
    with open(LOGFILE, "a") as f:
        f.write(msg + "\n")


def times(B, q_len, ctx):
    TT.CTX = ctx
    t = TT.int4_inputs(B, q_len)
    bts, nbytes = t[5], t[8]
    args = lambda b: t[:5] + (b,) + t[6:8]  # noqa: E731
    v5 = PT.time_calls([lambda b=b: int4_paged_attention(*args(b), ctx, q_len) for b in bts])
    ref = int4_paged_attention(*args(bts[0]), ctx, q_len).float()
    say(f"B={B:2d} q={q_len} ctx={ctx:5d} v5       {v5:8.1f} us  {nbytes / v5 / 1e6:5.2f} TB/s")
    for w in WS:
        X.W = w
        out = X._launch(*args(bts[0]), TT.SCALE, ctx, q_len, 0, 512, False).float()
        rel = float((out - ref).norm() / ref.norm())
        us = PT.time_calls([lambda b=b: X._launch(*args(b), TT.SCALE, ctx, q_len, 0, 512, False)
                            for b in bts])
        say(f"B={B:2d} q={q_len} ctx={ctx:5d} W={w}      {us:8.1f} us  {nbytes / us / 1e6:5.2f} "
            f"TB/s  ({v5 / us:4.2f}x v5)  rel vs v5 {rel:.1e}")
    TT.CTX = 32768


def main():
    LOGFILE.write_text("")
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for B, ctx in ((1, 1024), (1, 4096), (1, 32768), (4, 32768), (16, 32768), (64, 32768)):
        try:
            if ctx == 32768 and B in (1, 16, 64):
                TT.say = say
                TT.fp8_time(B)
            times(B, 1, ctx)
        except Exception:
            say(traceback.format_exc())
        torch.cuda.empty_cache()
    try:
        times(16, 4, 32768)
    except Exception:
        say(traceback.format_exc())
    saved = IA._launch
    for w in WS[1:]:
        X.W = w
        IA._launch = X._launch
        n0 = len(GC.RESULTS)
        try:
            GC.check_attention("int4", GC.T.gen(1001), False)
        except Exception:
            say(traceback.format_exc())
        IA._launch = saved
        res = GC.RESULTS[n0:]
        say(f"CHECK W={w}: {sum(r[1] for r in res)}/{len(res)} passed")
        for name, ok, msg in res:
            say(f"   {'PASS' if ok else 'FAIL'} {name}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
