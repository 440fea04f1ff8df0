#!/usr/bin/env python3
"""moe_forward past 64 tokens on the H200: chunk size and unit layout, full Kolibri-1 MoE shapes
(E = 256, top-6, H = 2560, I = 768, one shared expert). One call:

    python3 bench/moe_chunks.py [--out DIR] [--variants chunks|tiles|one|split|prefetch]

Per M in 16-256 (verification passes: streams x tokens per stream), VARIANTS of the
moe_experts settings: chunks of 64 with one unit per (token, slot) pair (the layout before
2026-12-01e: each chunk reads its experts again), the defaults (chunks of MAX_TOKENS, one unit
per expert from BY_EXPERT_TOKENS reading per-expert row lists from ALIGN_TOKENS, the shared
expert in groups of SHARED_TOKENS) and every program scanning the ids. Every variant's output
is compared bit for bit with chunks of 64 (the tiles group rows; no output's K order changes;
--variants split: with the first row of the same K split).
The first version (chunks of 64 / 128 / 256, units by expert from 65 or 33) ran at 060cfdc:
bench/results/h200-2026-12-01e/oe/. Time as bench/plugins.py (one CUDA graph over 8 rotated
input sets, median of 5 x 20 replays); bytes = router + distinct experts per call + shared +
x/y (the least any chunking reads), TB/s and % of the 4.14 TB/s read ceiling.
JSON: $OUT/moe_chunks.json (moe_chunks_tiles.json, moe_chunks_one.json, moe_chunks_split.json,
moe_chunks_prefetch.json). A setting named ``route.NAME`` is moe_route's, the others moe_experts'.
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
RT = importlib.import_module("kolibri_trt_plugins.moe_route")
E, H, INTER, TOPK = 256, 2560, 768, 6
NEVER = 1 << 30
# (M values, label, moe_experts settings); per M the first row that applies is the reference of
# the bits (chunks of 64, one unit per (token, slot) pair: the layout before 2026-12-01e).
# Units by expert from 16 tokens, by pair to 48, stages 4 / 6 past 32 tokens and the shared
# expert in 32- or 128-token groups ran at 3bf85bf and gained under 1 % (h200-2026-12-01e/of/).
OLD = dict(MAX_TOKENS=64, BY_EXPERT_TOKENS=NEVER, ALIGN_TOKENS=NEVER)
VARIANTS = [
    ((16, 24, 32, 48, 64, 80, 128, 192, 256), "chunks of 64, units by pair", OLD),
    ((16, 24, 32, 48, 64, 80, 128, 192, 256), "defaults", {}),
    ((16, 24, 32), "units by expert, row lists from 16", dict(BY_EXPERT_TOKENS=16,
                                                               ALIGN_TOKENS=16)),
    ((24, 32, 48, 64, 80, 128, 192, 256), "scanning ids (no row lists)",
     dict(ALIGN_TOKENS=NEVER)),
]

# --variants tiles: the launch shapes the Nsight Compute run pointed at (nr/): down n-tiles of
# 256 past 64 tokens (its 5,200 programs at 256 tokens each scan the ids for 6 K steps), and K
# split in two at 1-4 tokens (twice the programs; plus the split's combine kernel)
TILES = [
    ((1, 4, 128, 256), "defaults", {}),
    ((128, 256), "down n-tiles 256 past 64 tokens",
     dict(TILE_N={True: ME.TILE_N[True], False: ((4, 64), (64, 128), (1 << 30, 256))})),
    ((128, 256), "gate/up n-tiles 128 past 64 tokens",
     dict(TILE_N={True: ((32, 32), (64, 64), (1 << 30, 128)), False: ME.TILE_N[False]})),
    ((1, 4), "K split in 2 (gate/up and down)", dict(SPLIT_K_GATED=2, SPLIT_K_DOWN=2)),
    ((1, 4), "K split in 2 (gate/up)", dict(SPLIT_K_GATED=2)),
]

# --variants one: one to eight tokens (one stream's decode, 43 % of bandwidth per layer): the
# experts ran 1-2 warps per scheduler at ~3.4 cycles per issue (nr/). More warps per program
# (AOT sm_90: 8 warps replicate the 8-token MMA but split the tile's copies), deeper pipelines,
# and K steps of 64 / 256 (bytes per stage; the same K order per output).
SW, SWW = ME.TUNE_SWAP, ME.TUNE_SWAP_WIDE
ONE = [
    ((1, 2, 4, 8), "defaults", {}),
    ((1, 2, 4, 8), "8 warps", dict(TUNE_SWAP=dict(SW, num_warps=8),
                                   TUNE_SWAP_WIDE=dict(SWW, num_warps=8))),
    ((1, 2, 4, 8), "stages 6", dict(TUNE_SWAP=dict(SW, num_stages=6),
                                    TUNE_SWAP_WIDE=dict(SWW, num_stages=6))),
    ((1, 2, 4, 8), "8 warps, stages 6", dict(TUNE_SWAP=dict(num_warps=8, num_stages=6),
                                             TUNE_SWAP_WIDE=dict(num_warps=8, num_stages=6))),
    ((1, 2, 4, 8), "K steps of 64, stages 8", dict(
        BLOCK_K=64, TUNE_SWAP=dict(SW, num_stages=8), TUNE_SWAP_WIDE=dict(SWW, num_stages=8))),
    ((1, 2, 4, 8), "K steps of 256, stages 3", dict(
        BLOCK_K=256, TUNE_SWAP=dict(SW, num_stages=3), TUNE_SWAP_WIDE=dict(SWW, num_stages=3))),
    ((1, 2, 4, 8), "K steps of 256, 8 warps", dict(
        BLOCK_K=256, TUNE_SWAP=dict(num_warps=8, num_stages=3),
        TUNE_SWAP_WIDE=dict(num_warps=8, num_stages=3))),
]

# --variants split: K split in the expert launches at 1-16 tokens (one stream's decode, short
# verifications), summed in the launch (FIXUP_TOKENS, the default 16) or by the combine launch
# (FIXUP_TOKENS 0). Rows compare bits with the first row of the same (SPLIT_K_GATED,
# SPLIT_K_DOWN): a split sums K in another order than none, so only the forms of one split
# must agree.
S2G, S2B = dict(SPLIT_K_GATED=2), dict(SPLIT_K_GATED=2, SPLIT_K_DOWN=2)
SPLIT_KEYS = ("SPLIT_K_GATED", "SPLIT_K_DOWN")
SPLIT = [
    ((1, 2, 4, 9, 16), "split 2 gate/up, combine launch", dict(S2G, FIXUP_TOKENS=0)),
    ((1, 2, 4, 9, 16), "split 2 gate/up, in the launch", S2G),
    ((1, 2, 4, 9, 16), "defaults (no split)", {}),
    ((1, 2, 4, 9, 16), "split 2 both, in the launch", S2B),
    ((1, 2, 4, 9, 16), "split 2 both, combine launches", dict(S2B, FIXUP_TOKENS=0)),
    ((1, 2, 4, 9, 16), "split 4 gate/up, in the launch", dict(SPLIT_K_GATED=4)),
    ((1, 2, 4, 9, 16), "split 4 gate/up, 2 down, in", dict(SPLIT_K_GATED=4, SPLIT_K_DOWN=2)),
    ((1, 2, 4, 9, 16), "split 2 down, in the launch", dict(SPLIT_K_DOWN=2)),
]


# --variants prefetch: the top-k kernel asking L2 for the chosen experts' weights (moe_route
# PREFETCH 1: gate/up, 2: gate/up and down, 3: down; chunks of up to 4 tokens), the same bits; the
# defaults again last (drift between the first and last rows bounds the noise)
PF = {"route.PREFETCH_TOKENS": 4}
PREFETCH = [
    ((1, 2, 4), "defaults (no prefetch)", {}),
    ((1, 2, 4), "prefetch gate/up", dict(PF, **{"route.PREFETCH": 1})),
    ((1, 2, 4), "prefetch gate/up + down", dict(PF, **{"route.PREFETCH": 2})),
    ((1, 2, 4), "prefetch down", dict(PF, **{"route.PREFETCH": 3})),
    ((1, 2, 4), "defaults again", {}),
]


def _target(key: str):
    """(module, attribute) of a variant's setting: ``route.NAME`` moe_route's, else
    moe_experts'."""
    return (RT, key[len("route."):]) if key.startswith("route.") else (ME, key)

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else /tmp)")
    ap.add_argument("--variants", choices=("chunks", "tiles", "one", "split", "prefetch"),
                    default="chunks",
                    help="chunks: VARIANTS (chunk size, units, stages, shared groups); tiles: "
                         "TILES; one: ONE (1-8 tokens: warps, stages, K step); split: SPLIT "
                         "(K split at 1-16 tokens, summed in the launch or by a combine); "
                         "prefetch: PREFETCH (L2 prefetch from the top-k kernel)")
    args = ap.parse_args()
    variants = {"chunks": VARIANTS, "tiles": TILES, "one": ONE, "split": SPLIT,
                "prefetch": PREFETCH}[args.variants]
    out = PT.out_dir()
    wts = PT.moe_weights(E, H, INTER)
    rows = []
    for m in sorted({m for ms, _, _ in variants for m in ms}):
        xs = [torch.randn((m, H), device=PT.DEV).bfloat16() for _ in range(8)]
        nbytes = moe_bytes(xs, wts[0], E, H, INTER, TOPK)
        bases = {}  # (SPLIT_K_GATED, SPLIT_K_DOWN) -> the first outputs of that split
        for ms, label, settings in variants:
            if m not in ms:
                continue
            saved = {k: getattr(*_target(k)) for k in settings}
            try:
                for k, v in settings.items():
                    setattr(*_target(k), v)
                outs = [moe_forward(x, *wts, top_k=TOPK) for x in xs]
                split = tuple(settings.get(k, getattr(ME, k)) for k in SPLIT_KEYS)
                base = bases.setdefault(split, outs)
                same = all(torch.equal(a, b) for a, b in zip(outs, base))
                us = PT.time_calls([lambda x=x: moe_forward(x, *wts, top_k=TOPK) for x in xs])
            except Exception as exc:  # one variant's failure must not hide the others
                print(f"M={m} {label}: FAILED {str(exc)[:300]}", flush=True)
                continue
            finally:
                for k, v in saved.items():
                    setattr(*_target(k), v)
            tbs = nbytes / us / 1e6
            rows.append(dict(M=m, variant=label, us=us, MB=nbytes / 1e6, TBs=tbs,
                             pct=100 * tbs * 1e12 / PT.BW, bits_equal=same))
            print(f"M={m:3d} {label:30s} {us:8.1f} us {nbytes / 1e6:7.1f} MB {tbs:5.2f} TB/s "
                  f"{100 * tbs * 1e12 / PT.BW:5.1f}%  bits == split's first row: {same}",
                  flush=True)
    name = "moe_chunks" + ("" if args.variants == "chunks" else f"_{args.variants}")
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
