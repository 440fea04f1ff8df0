#!/usr/bin/env python3
"""moe_forward past 64 tokens on the H200: chunk size and unit layout, full Kolibri-1 MoE shapes
(E = 256, top-6, H = 2560, I = 768, one shared expert). One call:

    python3 bench/moe_chunks.py [--out DIR]

Per M in 64, 80, 128, 192, 256 (verification passes: streams x tokens per stream), variants of
(moe_experts.MAX_TOKENS, BY_EXPERT_TOKENS): chunks of 64 with one unit per (token, slot) pair
(the layout before 2026-12-01e: each chunk reads its experts again), chunks of 128 and of 256
with one unit per expert from 65 tokens (and from 33 at M = 64), the shared expert in groups of
SHARED_TOKENS. Every variant's output is compared bit for bit with chunks of 64 (the tiles
group rows; no output's K order changes). Time as bench/plugins.py (one CUDA graph over 8
rotated input sets, median of 5 x 20 replays); bytes = router + distinct experts per call +
shared + x/y (the least any chunking reads), TB/s and % of the 4.14 TB/s read ceiling.
JSON: $OUT/moe_chunks.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from gpu_check import load_plugins  # noqa: E402
from plugin_sweeps import moe_bytes  # noqa: E402

load_plugins()
from kolibri_trt_plugins.moe import moe_forward  # noqa: E402

ME = importlib.import_module("kolibri_trt_plugins.moe_experts")
E, H, INTER, TOPK = 256, 2560, 768, 6
NEVER = 1 << 30
MS = (64, 80, 128, 192, 256)
# (MAX_TOKENS, BY_EXPERT_TOKENS); the first is the reference of the bits
VARIANTS = [(64, NEVER), (128, 65), (128, NEVER), (256, 65)]
AT_64 = [(64, 33)]      # one unit per expert at 64 tokens too


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else /tmp)")
    ap.parse_args()
    out = PT.out_dir()
    wts = PT.moe_weights(E, H, INTER)
    saved = ME.MAX_TOKENS, ME.BY_EXPERT_TOKENS
    rows = []
    for m in MS:
        xs = [torch.randn((m, H), device=PT.DEV).bfloat16() for _ in range(8)]
        nbytes = moe_bytes(xs, wts[0], E, H, INTER, TOPK)
        base = None
        for v in VARIANTS + (AT_64 if m == 64 else []):
            ME.MAX_TOKENS, ME.BY_EXPERT_TOKENS = v
            try:
                outs = [moe_forward(x, *wts, top_k=TOPK) for x in xs]
                base = outs if base is None else base
                same = all(torch.equal(a, b) for a, b in zip(outs, base))
                us = PT.time_calls([lambda x=x: moe_forward(x, *wts, top_k=TOPK) for x in xs])
            except Exception as exc:  # one variant's failure must not hide the others
                print(f"M={m} {v}: FAILED {str(exc)[:300]}", flush=True)
                continue
            finally:
                ME.MAX_TOKENS, ME.BY_EXPERT_TOKENS = saved
            tbs = nbytes / us / 1e6
            rows.append(dict(M=m, max_tokens=v[0], by_expert_tokens=v[1], us=us,
                             MB=nbytes / 1e6, TBs=tbs, pct=100 * tbs * 1e12 / PT.BW,
                             bits_equal=same))
            print(f"M={m:3d} chunk={v[0]:3d} by_expert_from={'never' if v[1] == NEVER else v[1]:>5} "
                  f"{us:8.1f} us {nbytes / 1e6:7.1f} MB {tbs:5.2f} TB/s "
                  f"{100 * tbs * 1e12 / PT.BW:5.1f}%  bits == chunks of 64: {same}", flush=True)
    (out / "moe_chunks.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
