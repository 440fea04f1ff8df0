#!/usr/bin/env python3
"""fp8_gemv and nvfp4_gemv past 16 rows in 64-row tiles of the unswapped form (x the MMA's A
operand from shared memory, the decoded weights its B: Triton emits wgmma for sm_90 there,
16 HGMMA per K step with the permutes of the 16-row form, plugins/NOTES.md next steps 2-3),
on the H200. One call:

    python3 bench/gemv_rows64.py [--out DIR] [--ms 16,32,64,80,128,144] [--kernels fp8,nvfp4]

fp8: QKV 3584 x 2560 and o_proj 2560 x 2560 (per tensor), the drafter's 7680 x 2560 (1x64
block scales): the file's settings, then ROWS 64 with SWAP_ROWS 0 at N tiles of 16 / 32 / 64
(WIDE_TILES with one row tile per program). nvfp4: the LM head 131072 x 2560 and the drafter
head 60614 x 2560, ROWS 64, MAX_TILES 1, SWAP_ROWS 0 at N tiles (BLOCK_N_ONE_TILE) of 32 /
64 / 128. Both at 4 / 8 warps, stages 2 / 3. Timed as
bench/plugins.py (one CUDA graph over rotated weight sets, median of 5 x 20 replays); every
row says whether its bits equal the defaults' (wgmma may sum a K step in another order than
mma.sync: the first thing to know). JSON: $OUT/gemv_rows64.json; exit 1 when any differs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from wide_swap import F8, NV, sweep  # noqa: E402

FILE = (0, 0, 0)   # the file's own settings
FIELDS = ("n_tile", "warps", "stages")
FP8_GRID = list(itertools.product((16, 32, 64), (4, 8), (2, 3)))   # (N tile, warps, stages)
NV_GRID = list(itertools.product((32, 64, 128), (4, 8), (2, 3)))


def setter(mod):
    """apply(n_tile, warps, stages): 64-row unswapped tiles on mod (fp8_gemv or nvfp4_gemv);
    FILE restores the file's settings."""
    names = (("ROWS", "SWAP_ROWS", "WIDE_TILES", "WIDE_ROWS", "TUNE") if mod is F8 else
             ("ROWS", "SWAP_ROWS", "MAX_TILES", "BLOCK_N_ONE_TILE", "TUNE"))
    saved = {k: getattr(mod, k) for k in names}

    def apply(n_tile, warps, stages):
        for k, v in saved.items():
            setattr(mod, k, v)
        if (n_tile, warps, stages) == FILE:
            return
        mod.ROWS, mod.SWAP_ROWS = 64, 0
        if mod is F8:
            F8.WIDE_ROWS, F8.WIDE_TILES = (), (n_tile, 1)
        else:
            NV.MAX_TILES, NV.BLOCK_N_ONE_TILE = 1, n_tile
        mod.TUNE = dict(num_warps=warps, num_stages=stages)
    return apply


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else /tmp)")
    ap.add_argument("--ms", default="16,32,64,80,128,144", help="rows per call, comma-separated")
    ap.add_argument("--kernels", default="fp8,nvfp4")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    kernels = args.kernels.split(",")
    if set(kernels) - {"fp8", "nvfp4"}:
        ap.error(f"--kernels: among fp8, nvfp4, got {args.kernels}")
    out = PT.out_dir(["--out", args.out] if args.out else [])
    rows = sweep(kernels, ms, (FP8_GRID, setter(F8), FILE, FIELDS),
                 (NV_GRID, setter(NV), FILE, FIELDS))
    (out / "gemv_rows64.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
