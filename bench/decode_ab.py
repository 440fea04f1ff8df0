#!/usr/bin/env python3
"""Two weight decodes against each other (DECODE A and B: the conversion unit 1 against bit
placement 3), H200, full Kolibri-1 shapes, one call:

    python3 bench/decode_ab.py [--out DIR] [--only fp8_gemv,moe,nvfp4] [--modes 1,3]
        [--nvfp4-modes 1,3]

fp8_gemv (QKV 3584x2560 and o_proj 2560x2560, per-tensor scale; M = 1, 16, 64), moe_forward
(E = 256, top-6, H = 2560, I = 768 + shared; M = 1, 4, 16, 64) and nvfp4_gemv (e2m1 decode: via
e4m3 and the conversion unit, or bit placement; the LM head 131072x2560 at M = 1, 16, 64 and the
drafter head 60614x2560 at M = 1, 16); `--only` picks among them. Each at DECODE A, then B, then A
again (the first and last bracket drifts of the clock), timed as bench/plugins.py (one CUDA
graph over rotated input sets, median of 5 x 20 replays). `--modes A,B` applies to fp8_gemv and
moe (plugins/_e4m3_decode.py), `--nvfp4-modes` to nvfp4 (1 via e4m3 and the conversion unit).
Outputs must be bit-identical across the two; the exit code says whether they were. Mode 2
(bit placement with the signs by lop3) was removed after bench/results/h200-2026-12-01b/nk/ and
nn/ compared it with 3. At 7a98413 it also
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
E4M3_MODES = (1, 3)   # plugins/_e4m3_decode.py DECODES
NVFP4_MODES = (1, 3)  # nvfp4_gemv.DECODES


def ab(label: str, mod: str, calls, nbytes: float, rows: list, modes: tuple[int, int]) -> None:
    """Time `calls` (zero-arg callables, one per input set) under DECODE a, b, a (modes = (a, b))
    and compare the first call's output bits between the two decodes."""
    a, b = modes
    saved = MODS[mod].DECODE
    outs, times = {}, []
    try:
        for d in (a, b, a):
            MODS[mod].DECODE = d
            outs.setdefault(d, calls[0]())
            times.append(PT.time_calls(calls))
    finally:
        MODS[mod].DECODE = saved
    same = torch.equal(outs[a], outs[b])
    one = min(times[0], times[2])
    pct = [100 * nbytes / (us * 1e-6) / PT.BW for us in (one, times[1])]
    rows.append(dict(case=label, modes=[a, b], us_a=one, us_b=times[1], MB=nbytes / 1e6,
                     pct_a=pct[0], pct_b=pct[1], bits_equal=same))
    print(f"{label:34s} DECODE {a} {times[0]:8.1f} / {times[2]:8.1f} us  DECODE {b} "
          f"{times[1]:8.1f} us  ({one / times[1]:4.2f}x)  {nbytes / times[1] / 1e6:5.2f} TB/s "
          f"{pct[1]:5.1f}%  bits equal: {same}", flush=True)


def parse_modes(option: str, text: str, allowed: tuple) -> tuple[int, int]:
    """'A,B' -> (A, B), two distinct modes of `allowed`; SystemExit naming the option."""
    try:
        modes = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"{option}: {text!r} is not two integers A,B") from None
    if len(modes) != 2 or modes[0] == modes[1] or set(modes) - set(allowed):
        raise SystemExit(f"{option}: {text!r}; want two distinct of {allowed}")
    return modes


def nvfp4_cases(rows: list, modes: tuple[int, int]) -> None:
    for name, n, ms in (("LM head", 131072, (1, 16, 64)), ("drafter head", 60614, (1, 16))):
        k = 2560
        nbytes = n * k // 2 + n * k // 16
        ws = [(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=PT.DEV),
               (torch.rand((n, k // 16), device=PT.DEV) * 1.5 + 0.25).to(PT.E4M3),
               torch.tensor([0.02], device=PT.DEV)) for _ in range(PT.sets_for(nbytes))]
        for m in ms:
            x = torch.randn((m, k), device=PT.DEV).bfloat16()
            ab(f"nvfp4_gemv {name} M={m}", "nvfp4_gemv",
               [lambda w=w: nvfp4_gemv(x, *w) for w in ws], nbytes + m * (n + k) * 2, rows,
               modes)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--only", default=",".join(KERNELS), help=f"comma list of {KERNELS}")
    ap.add_argument("--modes", default="1,3", help="A,B: the e4m3 decodes of fp8_gemv and moe")
    ap.add_argument("--nvfp4-modes", default="1,3", help="A,B: nvfp4_gemv's e2m1 decodes")
    a = ap.parse_args()   # --out (read by PT.out_dir); unknown options raise
    modes = parse_modes("--modes", a.modes, E4M3_MODES)
    nv_modes = parse_modes("--nvfp4-modes", a.nvfp4_modes, NVFP4_MODES)
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
               [lambda w=w: fp8_gemv(x, *w) for w in ws], n * k + m * (n + k) * 2, rows, modes)
    if "moe" in only:
        wts = PT.moe_weights(256, 2560, 768)
        for m in (1, 4, 16, 64):
            xs = [torch.randn((m, 2560), device=PT.DEV).bfloat16() for _ in range(8)]
            ab(f"moe_forward M={m}", "moe_experts",
               [lambda x=x: moe_forward(x, *wts, top_k=6) for x in xs],
               moe_bytes(xs, wts[0], 256, 2560, 768, 6), rows, modes)
        wts.clear()   # free the MoE weights (the lambdas above ran already)
    if "nvfp4" in only:
        nvfp4_cases(rows, nv_modes)
    (out / "decode_ab.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
