#!/usr/bin/env python3
"""One-token FP8 GEMMs with the weight tile as the MMA's A operand and the token as its N
(``SWAP_ONE`` in plugins/moe_experts.py and plugins/fp8_gemv.py) against the defaults, H200,
full Kolibri-1 shapes, one call:

    python3 bench/swap_ab.py [--out DIR] [--only moe,fp8_gemv]

moe: moe_forward at M = 1 (E = 256, top-6, H = 2560, I = 768 + shared), the swapped kernel at
num_stages 3 / 4 / 5 (4 warps: gate and up rows stacked give four 16-row MMA tiles). fp8_gemv:
QKV 3584x2560 and o_proj 2560x2560 (per-tensor scale), the drafter's 7680x2560 (1x64 block
scales), M = 1; the swapped kernel at N tiles of 16 / 32 / 64 rows with 1 / 2 / 4 warps (one
16-row MMA tile per warp) and num_stages 3 / 5. Each variant is timed as bench/plugins.py (one
CUDA graph over rotated input sets, median of 5 x 20 replays) with the defaults timed before and
after it; its output is compared bit for bit with the defaults'. The exit code is 0 when every
variant ran (bits may differ: the line says so).
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

ME = importlib.import_module("kolibri_trt_plugins.moe_experts")
F8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
KERNELS = ("moe", "fp8_gemv")
MOE_VARIANTS = [dict(stages=s) for s in (3, 4, 5)]
GEMV_VARIANTS = [dict(bn=bn, warps=w, stages=s) for bn, w in ((16, 1), (32, 2), (64, 4))
                 for s in (3, 5)]


def run_variant(mod, setting: dict, calls, base, nbytes: float, label: str, rows: list) -> None:
    """Time `calls` at the defaults, with SWAP_ONE and `setting`, and at the defaults again."""
    saved = (mod.SWAP_ONE, dict(mod.TUNE_ONE), getattr(mod, "block_n_for"))
    try:
        t_def0 = PT.time_calls(calls)
        mod.SWAP_ONE = True
        mod.TUNE_ONE.update(num_warps=setting.get("warps", 4), num_stages=setting["stages"])
        if "bn" in setting:
            mod.block_n_for = lambda n, *a, bn=setting["bn"]: bn
        same = torch.equal(calls[0](), base)
        t_swap = PT.time_calls(calls)
    except Exception as exc:  # one variant's failure must not hide the others
        print(f"{label} {setting}: FAILED {str(exc)[:300]}", flush=True)
        rows.append(dict(case=label, setting=setting, failed=str(exc)[:300]))
        return
    finally:
        mod.SWAP_ONE, mod.block_n_for = saved[0], saved[2]
        mod.TUNE_ONE.clear()
        mod.TUNE_ONE.update(saved[1])
    t_def1 = PT.time_calls(calls)
    t_def = min(t_def0, t_def1)
    pct = 100 * nbytes / (t_swap * 1e-6) / PT.BW
    rows.append(dict(case=label, setting=setting, us_default=t_def, us_swap=t_swap,
                     MB=nbytes / 1e6, pct_swap=pct, bits_equal=same))
    print(f"{label:28s} {str(setting):36s} default {t_def0:7.1f} / {t_def1:7.1f} us  swapped "
          f"{t_swap:7.1f} us ({t_def / t_swap:4.2f}x) {pct:5.1f}%  bits == default: {same}",
          flush=True)


def moe_cases(rows: list) -> None:
    wts = PT.moe_weights(256, 2560, 768)
    xs = [torch.randn((1, 2560), device=PT.DEV).bfloat16() for _ in range(8)]
    calls = [lambda x=x: moe_forward(x, *wts, top_k=6) for x in xs]
    base = calls[0]()
    for v in MOE_VARIANTS:
        run_variant(ME, v, calls, base, moe_bytes(xs, wts[0], 256, 2560, 768, 6),
                    "moe_forward M=1", rows)
    wts.clear()


def gemv_cases(rows: list) -> None:
    for name, n, k, block in (("qkv", 3584, 2560, False), ("o_proj", 2560, 2560, False),
                              ("drafter 7680 block", 7680, 2560, True)):
        scale = ((lambda: torch.rand((n, k // 64), device=PT.DEV) * 0.02 + 0.001) if block else
                 (lambda: torch.tensor([0.01], device=PT.DEV)))
        ws = [(torch.randn((n, k), device=PT.DEV).to(PT.E4M3), scale())
              for _ in range(PT.sets_for(n * k))]
        x = torch.randn((1, k), device=PT.DEV).bfloat16()
        calls = [lambda w=w: fp8_gemv(x, *w) for w in ws]
        base = calls[0]()
        nbytes = n * k + (n * k // 64 * 4 if block else 0) + (n + k) * 2
        for v in GEMV_VARIANTS:
            run_variant(F8, v, calls, base, nbytes, f"fp8_gemv {name} M=1", rows)


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
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows: list = []
    if "moe" in only:
        moe_cases(rows)
    if "fp8_gemv" in only:
        gemv_cases(rows)
    (out / "swap_ab.json").write_text(json.dumps(rows, indent=1))
    return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
