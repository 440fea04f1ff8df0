#!/usr/bin/env python3
"""An FP8 GEMV on wgmma at every row count (plugins/NOTES.md, "Next" 2), written in Gluon:
does it keep fp8_gemv's one-row speed and beat it at 32-144 rows?

    python3 bench/gluon_gemv_probe.py --aot          # here, no GPU: compile for sm_90, count SASS
    python3 bench/gluon_gemv_probe.py --out DIR      # on the H200: check, then time

The kernel and the weight permutation now live in plugins/_fp8_wgmma_gluon.py and
plugins/fp8_wgmma.py (the plugin runs one setting; this probe still sweeps them).

The tile computes y^T [64, MT] = W [64, K] · x^T for 64 weight rows and MT (8-128) rows of x
with 4 warps (one warpgroup). W's e4m3 bytes are stored with each block of BK columns
permuted (`to_storage`, once, as an engine would at load time); W's and x's tiles come in
through a cp.async ring; each thread reads 16-byte pieces of W's tile from shared memory
(`storage_layout`), decodes them by bit placement (fp8_gemv's DECODE 3) and a reshape and
permute (`_to_logical`) relabels them as wgmma's register A operand (a trivial layout
conversion: no data moves); x's tile is wgmma's B. Per K step of BK the program issues BK / 16
wgmma (m64nMTk16); SPLIT > 1 K ranges write fp32 partials [S, M, N] that fp8_gemv's reduce
kernel sums in order (plugins/_gemv_reduce.py), so the sum order of a row is a function of (N,
K, SPLIT, BK) only, never of M or MT, if wgmma's per-column maths does not depend on its N
(checked here: row 0 alone against inside 16, 64 and 144 rows).

Second form (after bench/results/h200-2026-12-02e/gw/): x rows past M zero-filled by the copy
instead of re-reading row M-1 (a 128-row tile of 80 rows was slower than one of 128), rows in
launches of power-of-two tiles (`row_segments`: 144 = 128 + 16), rings of up to 8-12 buffers
(more bytes in flight per program: 56 programs at one K range), and FIXUP: the K ranges summed
by each tile's last program (a counter per tile) instead of a second launch.

wgmma and mma.sync give other bits for the same sum (bench/results/h200-2026-12-02d/wb/), so
such a kernel could only replace fp8_gemv at every row count of a shape. On the GPU this
prints, per shape (QKV 3584x2560, o_proj 2560x2560, per-tensor scale): the relative error
against fp8_gemv_ref, the batch invariance, and µs at M = 1-144 for fp8_gemv and the probe in
each (SPLIT, BK, ASYNC) setting, timed as bench/plugins.py --quick (a CUDA graph over enough
weight copies to defeat L2). Results as JSON under --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import standalone  # noqa: E402,F401  (maps kolibri_trt_plugins onto ./plugins when not installed)
from kolibri_trt_plugins._fp8_wgmma_gluon import _wgmma_gemv  # noqa: E402
from kolibri_trt_plugins._wgmma_gluon import (SHARED_BUDGET, row_segments,  # noqa: E402
                                              storage_layout)
from kolibri_trt_plugins.fp8_wgmma import _counters as counters  # noqa: E402
from kolibri_trt_plugins.fp8_wgmma import (relabelled_columns,  # noqa: E402
                                           to_wgmma_storage as to_storage)

BLOCK_N = 64                      # weight rows per program: one warpgroup's m64
SHAPES = {"qkv": (3584, 2560), "o_proj": (2560, 2560)}
ROWS = (1, 4, 8, 16, 32, 64, 80, 128, 144)
# (SPLIT, BK, ASYNC, most STAGES, FIXUP). bench/results/h200-2026-12-02e/gw2/: deeper rings
# gain nothing at SPLIT 1; FIXUP gains at 1-16 rows and loses past 16 (QKV 1 row 7.1 -> 6.3
# µs in 4 K ranges, 64 rows 9.0 -> 13.8); third round: finer K ranges with FIXUP at few rows
SETTINGS = ((4, 128, True, 4, False), (4, 128, True, 4, True), (5, 128, True, 4, True),
            (5, 128, True, 4, False), (10, 128, True, 3, True), (4, 128, True, 3, True))
# FIXUP against the reduce launch for the same K ranges (the same sum order: must be the
# same bits, so a kernel could take either by row count)
SAME_BITS = ((4, 128, True, 4), (5, 128, True, 4))
REL_TOL = 2e-2    # bf16 output against the fp32 reference: a few bf16 ulps (2^-8) of the norm


def check_relabel(bk: int) -> None:
    """`to_storage` inverts `_to_logical` (plugins/fp8_wgmma.relabelled_columns): AssertionError
    if a logical column would meet another column's weight."""
    assert torch.equal(relabelled_columns(bk), torch.arange(bk)), f"BK {bk}: relabel mismatch"


def stages_for(mt: int, bk: int, most: int = 4) -> int:
    """Shared buffers in the ring: up to `most`, as many as SHARED_BUDGET holds (at least 2)."""
    return max(2, min(most, SHARED_BUDGET // (64 * bk + mt * bk * 2)))


def wgmma_gemv(x, w_stored, scale, split: int, bk: int, is_async: bool = False,
               most: int = 4, fixup: bool = False):
    """The probe's y bf16 [M, N] from W in storage order (`to_storage(W, bk)`); for split > 1
    fp8_gemv's reduce sums the K ranges (fixup: the kernel's last program per tile does)."""
    from kolibri_trt_plugins._gemv_fusion import NO_FUSION
    from kolibri_trt_plugins._gemv_reduce import launch_reduce
    M, K = x.shape
    N = w_stored.shape[0]
    if K % (split * bk) or N % BLOCK_N:
        raise ValueError(f"K {K} must be a multiple of SPLIT {split} x BK {bk}, N {N} of 64")
    if (N // BLOCK_N) * triton.cdiv(M, 8) > 4096:
        raise ValueError(f"M {M}, N {N}: more tiles than counters")
    y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    part = y if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    for m0, mt, tiles in row_segments(M):
        _wgmma_gemv[(N // BLOCK_N, tiles, split)](
            w_stored, x, scale, y, part, counters(x.device), M, N, K, K // split, m0, MT=mt,
            BK=bk, SPLIT=split, WL=storage_layout(bk), STAGES=stages_for(mt, bk, most),
            ASYNC=is_async, FIXUP=fixup and split > 1, num_warps=4)
    if split > 1 and not fixup:
        launch_reduce(part, scale, y, NO_FUSION, 0, False)
    return y


def aot(mt: int, bk: int, split: int, is_async: bool = False, most: int = 4,
        fixup: bool = False, pdl: int = 0):
    sig = dict(w_ptr="*fp8e4nv", x_ptr="*bf16", s_ptr="*fp32", y_ptr="*bf16", p_ptr="*fp32",
               cnt_ptr="*i32", M="i32", N="i32", K="i32", K_PART="i32", m_base="i32",
               MT="constexpr", BK="constexpr", SPLIT="constexpr", WL="constexpr",
               STAGES="constexpr", ASYNC="constexpr", FIXUP="constexpr", PDL="constexpr")
    src = GluonASTSource(_wgmma_gemv, sig, constexprs=dict(
        MT=mt, BK=bk, SPLIT=split, WL=storage_layout(bk), STAGES=stages_for(mt, bk, most),
        ASYNC=is_async, FIXUP=fixup, PDL=pdl),
        attrs={(k,): [["tt.divisibility", 16]] for k in range(10)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def print_aot(label: str, ck) -> None:
    """One compiled kernel: registers, stack, shared bytes, SASS size, each loop's opcodes."""
    import re
    from aot_sass import cuobjdump, loops
    res = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(ck, "-res-usage"))
    found, total = loops(cuobjdump(ck, "-sass"))
    print(f"{label}: registers {res.group(1)}, stack {res.group(2)} B, shared "
          f"{ck.metadata.shared} B, {total} SASS instructions", flush=True)
    for start, end, ops in found:
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(12))
        print(f"    loop of {end - start + 1}: {top}", flush=True)


def check_case(label: str, fn, x_all, ref) -> tuple[dict, bool]:
    """fn(x) for the 144 rows x_all: relative error against ref (fp32), and row 0 alone and
    inside 16 / 64 rows against inside all 144 (bit for bit). Printed; (record, passed)."""
    y_all = fn(x_all)
    err = ((y_all.float() - ref).norm() / ref.norm()).item()
    inv = all(torch.equal(fn(x_all[:m].contiguous())[0], y_all[0]) for m in (1, 16, 64))
    ok = err < REL_TOL and inv
    print(f"{label}: rel err {err:.2e}, row 0 at M=1/16/64 vs 144 "
          f"{'bit-identical' if inv else 'DIFFERS'} -> {'PASS' if ok else 'FAIL'}", flush=True)
    return dict(rel_err=err, invariant=inv), ok


def time_rows(name: str, x_all, calls: dict) -> list[dict]:
    """µs per row count of ROWS for each label -> fn(x, weights) over its weight copies
    (calls: label -> (fn, list of weight tuples)), timed as bench/plugins.py."""
    from plugin_timing import time_calls
    rows = []
    for m in ROWS:
        x = x_all[:m].contiguous()
        row = dict(shape=name, M=m)
        for label, (fn, wsets) in calls.items():
            row[f"{label}_us"] = time_calls([lambda w=w: fn(x, *w) for w in wsets])
        print(f"{name} M={m:3d}: " + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in row.items()
                                                if k.endswith("_us")), flush=True)
        rows.append(row)
    return rows


def probe_main(doc: str, run_aot, run_gpu, default_out: str) -> int:
    """The probes' command line: --aot (here, no GPU) or the GPU run into --out."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--aot", action="store_true", help="compile for sm_90 here, no GPU")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(default_out))
    args = ap.parse_args()
    if args.aot:
        return run_aot()
    import plugin_timing
    plugin_timing.ITERS, plugin_timing.REPEATS = 10, 3   # as bench/plugins.py --quick
    return run_gpu(args.out)


def finish(out: pathlib.Path, name: str, results: list, bad: int) -> int:
    """Write the JSON, print the verdict; exit status 1 if any setting failed its checks."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(results, indent=1))
    print(f"{bad} setting(s) failed the checks; wrote {out / name}")
    return 1 if bad else 0


def run_aot() -> int:
    """Per (MT, BK): registers, stack, shared bytes and the K loop's SASS opcodes per warp."""
    for bk in (128, 256):
        check_relabel(bk)
    print("to_storage inverts _to_logical at BK 128 and 256", flush=True)
    for mt, bk, is_async in ((8, 128, False), (8, 256, False), (32, 128, False),
                             (64, 128, False), (128, 128, False), (8, 128, True), (64, 128, True)):
        print_aot(f"MT {mt:3d} BK {bk}" + (" async" if is_async else ""), aot(mt, bk, 1, is_async))
    for mt, split, is_async, most in ((8, 1, False, 12), (8, 4, True, 8), (128, 2, False, 8)):
        print_aot(f"MT {mt:3d} SPLIT {split} stages<={most} fixup" +
                  (" async" if is_async else ""), aot(mt, 128, split, is_async, most, split > 1))
    return 0


def run_gpu(out: pathlib.Path) -> int:
    """Checks (error against fp8_gemv_ref, row 0 alone against inside 16 / 64 / 144 rows),
    then µs per setting and row count against fp8_gemv; JSON into `out`."""
    from plugin_timing import sets_for
    from kolibri_trt_plugins.fp8_gemv import fp8_gemv, fp8_gemv_ref
    results, bad = [], 0
    for name, (N, K) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        ws = [(torch.randn((N, K), generator=g, device="cuda").to(torch.float8_e4m3fn),
               torch.tensor([0.02], device="cuda")) for _ in range(sets_for(N * K))]
        stored = {bk: [(to_storage(w, bk), s) for w, s in ws] for bk in {c[1] for c in SETTINGS}}
        x_all = torch.randn((144, K), generator=g, device="cuda").bfloat16()
        ref = fp8_gemv_ref(x_all, *ws[0]).float()
        calls = {"fp8_gemv": (fp8_gemv, ws)}
        for split, bk, is_async, most, fixup in SETTINGS:
            def fn(x, w, s, split=split, bk=bk, is_async=is_async, most=most, fixup=fixup):
                return wgmma_gemv(x, w, s, split, bk, is_async, most, fixup)
            tag = (f"s{split}_bk{bk}_st{most}" + ("_async" if is_async else "") +
                   ("_fix" if fixup else ""))
            rec, ok = check_case(f"{name} {tag}", lambda x, w0=stored[bk][0]: fn(x, *w0), x_all,
                                 ref)
            results.append(dict(shape=name, split=split, bk=bk, is_async=is_async, most=most,
                                fixup=fixup, **rec))
            bad += not ok
            calls[f"wgmma_{tag}"] = (fn, stored[bk])
        results += time_rows(name, x_all, calls)
        for split, bk, is_async, most, fixup in SETTINGS:   # again, after the replays
            if fixup:
                rec, ok = check_case(f"{name} s{split} st{most} async {is_async} fixup, "
                                     "after the timing",
                                     lambda x, w0=stored[bk][0], bk=bk, a=is_async, st=most,
                                     sp=split: wgmma_gemv(x, *w0, sp, bk, a, st, True),
                                     x_all, ref)
                bad += not ok
        for split, bk, is_async, most in SAME_BITS:
            w0 = stored[bk][0]
            same = all(torch.equal(wgmma_gemv(x_all[:m].contiguous(), *w0, split, bk, is_async,
                                              most, True),
                                   wgmma_gemv(x_all[:m].contiguous(), *w0, split, bk, is_async,
                                              most, False)) for m in (1, 8, 16, 64, 144))
            print(f"{name} s{split}: FIXUP against the reduce launch at M = 1/8/16/64/144: "
                  f"{'bit-identical -> PASS' if same else 'DIFFERS -> FAIL'}", flush=True)
            results.append(dict(shape=name, split=split, fixup_equals_reduce=same))
            bad += not same
        left = int(counters(x_all.device).abs().sum())
        print(f"{name}: FIXUP counters left non-zero: {left} -> {'PASS' if not left else 'FAIL'}")
        bad += bool(left)
        del ws, stored, calls
        torch.cuda.empty_cache()
    return finish(out, "gluon_gemv.json", results, bad)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    sys.exit(probe_main(__doc__, run_aot, run_gpu, "gluon_gemv_out"))
