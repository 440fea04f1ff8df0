#!/usr/bin/env python3
"""Weight decode with the conversion unit (DECODE 1) against integer bit placement (DECODE 2),
H200, full Kolibri-1 shapes, one call:

    python3 bench/decode_ab.py [--out DIR]

fp8_gemv (QKV 3584x2560 and o_proj 2560x2560, per-tensor scale; M = 1, 16, 64), moe_forward
(E = 256, top-6, H = 2560, I = 768 + shared; M = 1, 4, 16, 64) and nvfp4_gemv (e2m1 decode: via
e4m3 and the conversion unit, or bit placement; the LM head 131072x2560 at M = 1, 16, 64 and the
drafter head 60614x2560 at M = 1, 16); `--only` picks among them. Each at DECODE 1, then 2, then 1
again (the first and last bracket drifts of the clock), timed as bench/plugins.py (one CUDA
graph over rotated input sets, median of 5 x 20 replays). Outputs must be bit-identical across
the two (plugins/_e4m3_decode.py); the exit code says whether they were. At 7a98413 it also
compared nvfp4_gemv's byte-table decode, since removed (bench/results/h200-2026-11-30k/kd/).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from gpu_check import load_plugins  # noqa: E402
from plugin_sweeps import moe_bytes  # noqa: E402

load_plugins()
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402
from kolibri_trt_plugins.moe import moe_forward  # noqa: E402
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv  # noqa: E402

MODS = {name: importlib.import_module(f"kolibri_trt_plugins.{name}")
        for name in ("fp8_gemv", "moe_experts", "nvfp4_gemv")}
KERNELS = ("fp8_gemv", "moe", "nvfp4")
ORDER = (1, 2, 1)


def ab(label: str, mod: str, calls, nbytes: float, rows: list) -> None:
    """Time `calls` (zero-arg callables, one per input set) under DECODE 1, 2, 1 and compare
    the first call's output bits between the two decodes."""
    saved = MODS[mod].DECODE
    outs, times = {}, []
    try:
        for d in ORDER:
            MODS[mod].DECODE = d
            outs.setdefault(d, calls[0]())
            times.append(PT.time_calls(calls))
    finally:
        MODS[mod].DECODE = saved
    same = torch.equal(outs[1], outs[2])
    one = min(times[0], times[2])
    pct = [100 * nbytes / (us * 1e-6) / PT.BW for us in (one, times[1])]
    rows.append(dict(case=label, us_decode1=one, us_decode2=times[1], MB=nbytes / 1e6,
                     pct1=pct[0], pct2=pct[1], bits_equal=same))
    print(f"{label:34s} DECODE 1 {times[0]:8.1f} / {times[2]:8.1f} us  DECODE 2 {times[1]:8.1f} us"
          f"  ({one / times[1]:4.2f}x)  {nbytes / times[1] / 1e6:5.2f} TB/s "
          f"{pct[1]:5.1f}%  bits equal: {same}", flush=True)


def nvfp4_cases(rows: list) -> None:
    for name, n, ms in (("LM head", 131072, (1, 16, 64)), ("drafter head", 60614, (1, 16))):
        k = 2560
        nbytes = n * k // 2 + n * k // 16
        ws = [(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=PT.DEV),
               (torch.rand((n, k // 16), device=PT.DEV) * 1.5 + 0.25).to(PT.E4M3),
               torch.tensor([0.02], device=PT.DEV)) for _ in range(PT.sets_for(nbytes))]
        for m in ms:
            x = torch.randn((m, k), device=PT.DEV).bfloat16()
            ab(f"nvfp4_gemv {name} M={m}", "nvfp4_gemv",
               [lambda w=w: nvfp4_gemv(x, *w) for w in ws], nbytes + m * (n + k) * 2, rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--only", default=",".join(KERNELS), help=f"comma list of {KERNELS}")
    a = ap.parse_args()   # --out (read by PT.out_dir); unknown options raise
    only = a.only.split(",")
    if set(only) - set(KERNELS):
        raise SystemExit(f"--only: unknown {sorted(set(only) - set(KERNELS))}; "
                         f"choose from {KERNELS}")
    out = PT.out_dir()
    rows: list = []
    for name, n, k in (("qkv", 3584, 2560), ("o_proj", 2560, 2560)):
        if "fp8_gemv" not in only:
            break
        ws = [(torch.randn((n, k), device=PT.DEV).to(PT.E4M3), torch.tensor([0.01], device=PT.DEV))
              for _ in range(PT.sets_for(n * k))]
        for m in (1, 16, 64):
            x = torch.randn((m, k), device=PT.DEV).bfloat16()
            ab(f"fp8_gemv {name} M={m}", "fp8_gemv",
               [lambda w=w: fp8_gemv(x, *w) for w in ws], n * k + m * (n + k) * 2, rows)
    if "moe" in only:
        wts = PT.moe_weights(256, 2560, 768)
        for m in (1, 4, 16, 64):
            xs = [torch.randn((m, 2560), device=PT.DEV).bfloat16() for _ in range(8)]
            ab(f"moe_forward M={m}", "moe_experts",
               [lambda x=x: moe_forward(x, *wts, top_k=6) for x in xs],
               moe_bytes(xs, wts[0], 256, 2560, 768, 6), rows)
        wts.clear()   # free the MoE weights (the lambdas above ran already)
    if "nvfp4" in only:
        nvfp4_cases(rows)
    (out / "decode_ab.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
