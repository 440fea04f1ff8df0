#!/usr/bin/env python3
"""INT4 paged attention: the plugin's settings against DEFER_SUMS False (v5's bits) and FP8
full-causal attention, at 32k. One call:

    python3 bench/int4_attn_ab.py [--budget SECONDS]

Per case (decode at B = 1, 4, 16, 64; verification of 2, 4 and 8 tokens per stream at
B = 16, of 4 at B = 1 and 64): the plugin with DEFER_SUMS False (the column sums per tile:
v5's bits, checked against a frozen v5 on the H200 in bench/results/h200-2026-12-01a/ne/, last
at b1a107c), at its defaults and with 16-row decode programs (the same bits as 8-row ones).
Each output is compared with the DEFER_SUMS False one (``bits equal`` or the relative
difference) and with the defaults'. Then gpu_check's INT4 attention cases under the defaults.
Timing as bench/plugins.py. Log: $OUT/int4_attn_ab.log. Earlier variants (token-major value
pages, V_T, last at 96e0b6f; per-key sums, last at 1b995b7; 32-row verification programs,
slower at every size, last at 1a37e1b): results nh/, ne/, h200-2026-12-01d/nw/.
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
import int4_attn_t_tune as TT  # noqa: E402  (inputs, FP8 timing; maps kolibri_trt_plugins)
import plugin_timing as PT  # noqa: E402
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402

IA = TT.IA
GC = TT.GC
OUT = pathlib.Path(os.environ.get("OUT", "/tmp"))
LOG: list[str] = []
CASES = [(16, 1), (1, 1), (64, 1), (4, 1), (16, 2), (16, 4), (16, 8), (1, 4), (64, 4)]  # (B, q)
# name -> (module settings, launch-option overrides for both row tiles)
VARIANTS = {"defaults": ({}, {}),
            "16-row decode": ({"ROWS_DECODE": 16}, {})}
REFERENCE = {"DEFER_SUMS": False}   # v5's bits


def say(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)
    (OUT / "int4_attn_ab.log").write_text("\n".join(LOG) + "\n")


def set_variant(mod: dict, tune: dict):
    """Apply a variant to the plugin module; returns a function that restores the defaults."""
    saved = {k: getattr(IA, k) for k in mod}, dict(IA.TUNE), dict(IA.TUNE_DECODE)
    for k, v in mod.items():
        setattr(IA, k, v)
    IA.TUNE.update(tune)
    IA.TUNE_DECODE.update(tune)

    def restore():
        for k, v in saved[0].items():
            setattr(IA, k, v)
        IA.TUNE.clear()
        IA.TUNE.update(saved[1])
        IA.TUNE_DECODE.clear()
        IA.TUNE_DECODE.update(saved[2])
    return restore


def diff_text(out, ref) -> str:
    if torch.equal(out, ref):
        return "bits equal"
    return f"rel diff {float((out.float() - ref.float()).norm() / ref.float().norm()):.1e}"


def case(B: int, q_len: int, deadline: float, fp8: dict) -> None:
    t = TT.int4_inputs(B, q_len)
    bts, nbytes = t[5], t[8]
    args = lambda b: t[:5] + (b,) + t[6:8]  # noqa: E731
    ctx = TT.CTX
    restore = set_variant(REFERENCE, {})
    try:
        ref = int4_paged_attention(*args(bts[0]), ctx, q_len)
        us = PT.time_calls([lambda b=b: int4_paged_attention(*args(b), ctx, q_len) for b in bts])
    finally:
        restore()
    tag = f"B={B:2d} q={q_len}"
    extra = f"  fp8/int4 {fp8[B] / us:4.2f}x" if q_len == 1 and B in fp8 else ""
    base = None
    say(f"{tag} {'defer 0':14s} {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s{extra}")
    for name, (mod, tune) in VARIANTS.items():
        if time.time() > deadline or ("16-row" in name and q_len > 1):
            continue
        restore = set_variant(mod, tune)
        fa = args
        try:
            out = int4_paged_attention(*fa(bts[0]), ctx, q_len)
            diff = diff_text(out, ref) + " vs defer 0"
            if name == "defaults":
                base = out
            else:
                diff += ", " + diff_text(out, base) + " vs defaults"
            us = PT.time_calls([lambda b=b: int4_paged_attention(*fa(b), ctx, q_len)
                                for b in bts])
            extra = f"  fp8/int4 {fp8[B] / us:4.2f}x" if q_len == 1 and B in fp8 else ""
            say(f"{tag} {name:14s} {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s  {diff}{extra}")
        except Exception as exc:
            say(f"{tag} {name} FAILED: {str(exc)[:400]}")
        finally:
            restore()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the timings")
    a = ap.parse_args()
    deadline = time.time() + a.budget
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__}, 32k context, PDL "
        f"{os.environ.get('KOLIBRI_PDL', 'default')}")
    fp8 = {}
    for B, q_len in CASES:
        try:
            if q_len == 1:
                fp8[B] = TT.fp8_time(B)
                say(f"B={B:2d} fp8 full causal {fp8[B]:8.1f} us")
            case(B, q_len, deadline, fp8)
        except Exception:
            say(traceback.format_exc())
        torch.cuda.empty_cache()
    try:
        n0 = len(GC.RESULTS)
        GC.check_attention("int4", GC.T.gen(1001), False)
        res = GC.RESULTS[n0:]
        say(f"CHECK gpu_check int4 under the defaults: {sum(r[1] for r in res)}/{len(res)} passed")
        for name, ok, msg in res:
            say(f"   {'PASS' if ok else 'FAIL'} {name}: {msg}")
    except Exception:
        say(traceback.format_exc())
    return 0


if __name__ == "__main__":
    sys.exit(main())
