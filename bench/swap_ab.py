#!/usr/bin/env python3
"""Small-batch FP8 GEMMs with the weight tile as the MMA's A operand and the tokens as its N
(plugins/moe_experts.py SWAP_TOKENS, plugins/fp8_gemv.py SWAP_ROWS; run at <= 8 rows) against the
16-row x·W^T form (the setting 0), H200, full Kolibri-1 shapes, one call:

    python3 bench/swap_ab.py [--out DIR] [--only moe,moe_wide,fp8_gemv,nvfp4]

moe: moe_forward (E = 256, top-6, H = 2560, I = 768 + shared) at M = 1, 2, 4, 8, the swapped
kernel at num_stages 3 / 4 / 5 (4 warps). fp8_gemv: QKV 3584x2560 and o_proj 2560x2560
(per-tensor scale), the drafter's 7680x2560 (1x64 block scales), M = 1, 4, 8; the swapped kernel
with 1 / 2 warps at num_stages 5. nvfp4: nvfp4_gemv (plugins/nvfp4_gemv.py SWAP_ROWS), the LM
head 131072x2560 and the drafter head slice 60614x2560, M = 1, 4, 8, with 4 warps at num_stages
3 / 4 and 8 warps at 3. moe_wide: moe_forward at M = 16, 32, 64 with the swap at every chunk
size (SWAP_TOKENS 64: 8-token tiles, a row tile's pass only where its expert has that many
tokens) at num_stages 3 / 4. Each variant is timed as bench/plugins.py (one CUDA graph over
rotated input sets, median of 5 x 20 replays) with the 16-row form timed before and after it;
its output is compared bit for bit with the 16-row form's. The exit code is 0 when every
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
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv  # noqa: E402

ME = importlib.import_module("kolibri_trt_plugins.moe_experts")
F8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
NV = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")
KERNELS = ("moe", "moe_wide", "fp8_gemv", "nvfp4")
DEFAULT_KERNELS = ("moe", "fp8_gemv", "nvfp4")
MOE_VARIANTS = [dict(stages=s) for s in (3, 4, 5)]
GEMV_VARIANTS = [dict(warps=w, stages=5) for w in (1, 2)]
NVFP4_VARIANTS = [dict(warps=4, stages=3), dict(warps=4, stages=4), dict(warps=8, stages=3)]
SWITCH = {ME: "SWAP_TOKENS", F8: "SWAP_ROWS", NV: "SWAP_ROWS"}   # module -> swap threshold
SWAP_ON = 8     # the threshold a variant runs at (a module's default may be 0: off)
WIDE_ON = 64    # moe_wide: the swap at every chunk of up to 64 tokens
TUNES = {ME: ("TUNE_SWAP", "TUNE_SWAP_WIDE", "TUNE_SWAP_MANY", "TUNE_SWAP_MOST"),
         NV: ("TUNE_SWAP",)}   # fp8_gemv: its SWAP_TILES entries (apply_tune)


def apply_tune(mod, warps: int, stages: int):
    """Give the module's swapped kernel `warps` and `stages` at every size; returns a function
    that restores the module's own settings."""
    if mod is F8:
        saved_tiles = F8.SWAP_TILES
        F8.SWAP_TILES = tuple((most, rows, warps, stages) for most, rows, _, _ in saved_tiles)
        return lambda: setattr(F8, "SWAP_TILES", saved_tiles)
    saved = [dict(getattr(mod, t)) for t in TUNES[mod]]
    for t in TUNES[mod]:
        getattr(mod, t).update(num_warps=warps, num_stages=stages)

    def restore():
        for t, d in zip(TUNES[mod], saved):
            getattr(mod, t).clear()
            getattr(mod, t).update(d)
    return restore


def plain(mod, calls, on: int = SWAP_ON):
    """The first call's output and the µs of `calls` with the module's swap off; then the swap
    threshold `on`."""
    setattr(mod, SWITCH[mod], 0)
    try:
        return calls[0](), PT.time_calls(calls)
    finally:
        setattr(mod, SWITCH[mod], on)


def run_variant(mod, setting: dict, calls, nbytes: float, label: str, rows: list,
                on: int = SWAP_ON) -> None:
    """Time `calls` in the 16-row form, swapped with `setting` (every TUNES dict), and 16-row
    again."""
    saved_switch = getattr(mod, SWITCH[mod])
    restore = lambda: None  # noqa: E731  (set once the tune is applied)
    try:
        base, t_def0 = plain(mod, calls, on)
        restore = apply_tune(mod, setting.get("warps", 4), setting["stages"])
        same = torch.equal(calls[0](), base)
        t_swap = PT.time_calls(calls)
        t_def1 = plain(mod, calls, on)[1]
    except Exception as exc:  # one variant's failure must not hide the others
        print(f"{label} {setting}: FAILED {str(exc)[:300]}", flush=True)
        rows.append(dict(case=label, setting=setting, failed=str(exc)[:300]))
        return
    finally:
        restore()
        setattr(mod, SWITCH[mod], saved_switch)
    t_def = min(t_def0, t_def1)
    pct = 100 * nbytes / (t_swap * 1e-6) / PT.BW
    rows.append(dict(case=label, setting=setting, us_16row=t_def, us_swap=t_swap,
                     MB=nbytes / 1e6, pct_swap=pct, bits_equal=same))
    print(f"{label:32s} {str(setting):26s} 16-row {t_def0:7.1f} / {t_def1:7.1f} us  swapped "
          f"{t_swap:7.1f} us ({t_def / t_swap:4.2f}x) {pct:5.1f}%  bits equal: {same}",
          flush=True)


def moe_cases(rows: list, wide: bool = False) -> None:
    """moe_forward at 1-8 tokens (the default swap), or (wide) at 16-64 with the swap forced."""
    wts = PT.moe_weights(256, 2560, 768)
    for m in (16, 32, 64) if wide else (1, 2, 4, 8):
        xs = [torch.randn((m, 2560), device=PT.DEV).bfloat16() for _ in range(8)]
        calls = [lambda x=x: moe_forward(x, *wts, top_k=6) for x in xs]
        for v in MOE_VARIANTS[:2] if wide else MOE_VARIANTS:
            run_variant(ME, v, calls, moe_bytes(xs, wts[0], 256, 2560, 768, 6),
                        f"moe_forward M={m}", rows, WIDE_ON if wide else SWAP_ON)
    wts.clear()


def gemv_cases(rows: list) -> None:
    for name, n, k, block in (("qkv", 3584, 2560, False), ("o_proj", 2560, 2560, False),
                              ("drafter 7680 block", 7680, 2560, True)):
        scale = ((lambda: torch.rand((n, k // 64), device=PT.DEV) * 0.02 + 0.001) if block else
                 (lambda: torch.tensor([0.01], device=PT.DEV)))
        ws = [(torch.randn((n, k), device=PT.DEV).to(PT.E4M3), scale())
              for _ in range(PT.sets_for(n * k))]
        for m in (1, 4, 8):
            x = torch.randn((m, k), device=PT.DEV).bfloat16()
            calls = [lambda w=w, x=x: fp8_gemv(x, *w) for w in ws]
            nbytes = n * k + (n * k // 64 * 4 if block else 0) + m * (n + k) * 2
            for v in GEMV_VARIANTS:
                run_variant(F8, v, calls, nbytes, f"fp8_gemv {name} M={m}", rows)


def nvfp4_cases(rows: list) -> None:
    for name, n in (("LM head", 131072), ("drafter head", 60614)):
        k = 2560
        nbytes = n * k // 2 + n * k // 16
        ws = [(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=PT.DEV),
               (torch.rand((n, k // 16), device=PT.DEV) * 1.5 + 0.25).to(PT.E4M3),
               torch.tensor([0.02], device=PT.DEV)) for _ in range(PT.sets_for(nbytes))]
        for m in (1, 4, 8):
            x = torch.randn((m, k), device=PT.DEV).bfloat16()
            calls = [lambda w=w, x=x: nvfp4_gemv(x, *w) for w in ws]
            for v in NVFP4_VARIANTS:
                run_variant(NV, v, calls, nbytes + m * (n + k) * 2, f"nvfp4_gemv {name} M={m}",
                            rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--only", default=",".join(DEFAULT_KERNELS), help=f"comma list of {KERNELS}")
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
    if "moe_wide" in only:
        moe_cases(rows, wide=True)
    if "fp8_gemv" in only:
        gemv_cases(rows)
    if "nvfp4" in only:
        nvfp4_cases(rows)
    (out / "swap_ab.json").write_text(json.dumps(rows, indent=1))
    return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
