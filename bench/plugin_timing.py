"""Timing helpers and run-time settings shared by bench/plugins.py and bench/plugin_sweeps.py:
time_calls (one CUDA graph over rotated input sets), sets_for, report (+ ROWS for --csv) and
paged_tables.

ITERS / REPEATS (plugins.main() lowers them with --quick) and APPLY_BEST live here and are read
when a call runs: change them as ``plugin_timing.ITERS = ...``. They are not kept in plugins.py
because it runs as ``__main__`` (and ``import plugins`` finds ./plugins once standalone.py has
put the repository root on sys.path).
"""

from __future__ import annotations

import math
import os
import pathlib
import statistics

import torch

BW = 4.14e12          # measured HBM read bandwidth, bytes/s
L2_FLUSH = 240e6      # rotate input sets until this many bytes are touched per graph
ITERS, REPEATS = 20, 5
DEV = "cuda"
ROWS: list[dict] = []
APPLY_BEST = True  # --only sweep,...: the sections after the sweep run with its winners
CEILING = False    # report(): also time the best plain read of the row's bytes (read_ceiling)
E4M3 = torch.float8_e4m3fn


def time_calls(fns) -> float:
    """Median µs per call of the zero-arg callables ``fns`` (one per input set), via one graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(REPEATS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(ITERS):
            g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / (ITERS * len(fns)))
    del g
    return statistics.median(ts)


def sets_for(nbytes: float) -> int:
    return max(1, min(32, math.ceil(L2_FLUSH / max(nbytes, 1))))


def report(kernel, shape, us, nbytes, stock_us=None, note=""):
    """Print and keep one row: time, bytes, TB/s, % of BW, the stock op's time and, with
    CEILING, the best plain read of the same bytes (bench/read_ceiling.py) and us against it."""
    tbs = nbytes / (us * 1e-6) / 1e12
    ceil = None
    if CEILING:
        import read_ceiling
        ceil = read_ceiling.ceiling_us(nbytes)[0]
    row = dict(kernel=kernel, shape=shape, us=us, MB=nbytes / 1e6, TBs=tbs, pct=100 * tbs * 1e12 / BW,
               stock_us=stock_us, note=note, ceiling_us=ceil)
    ROWS.append(row)
    st = f"{stock_us:9.1f}" if stock_us else "        -"
    sp = f"{stock_us / us:5.2f}x" if stock_us else "     -"
    cl = f" | read {ceil:7.1f} µs ({100 * ceil / us:5.1f}%)" if ceil else ""
    print(f"{kernel:22s} {shape:34s} {us:9.1f} µs {nbytes / 1e6:9.2f} MB {tbs:5.2f} TB/s "
          f"{row['pct']:5.1f}% | stock {st} µs {sp}{cl} {note}", flush=True)


def paged_tables(B, ctx, blk):
    nb = B * (ctx // blk)
    perm = torch.randperm(nb, device=DEV).int()
    return perm.view(B, ctx // blk).contiguous(), nb


def moe_weights(E: int = 256, H: int = 2560, inter: int = 768) -> list[torch.Tensor]:
    """Random MoE weights at full Kolibri-1 size in the plugin layout (router bf16 [E, H];
    w13 e4m3 [E, 2I, H], scales [E]; w2 e4m3 [E, H, I], scales [E]; the shared expert's four
    the same with E = 1): the argument list of moe_forward after x."""
    return [torch.randn((E, H), device=DEV).bfloat16() * 0.05,
            torch.randn((E, 2 * inter, H), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
            torch.randn((E, H, inter), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
            torch.randn((1, 2 * inter, H), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02,
            torch.randn((1, H, inter), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02]


def out_dir(argv=None) -> pathlib.Path:
    """The tuning scripts' --out DIR (default $OUT, else /tmp), created, after one line naming
    the device and torch. argv: the other arguments the caller parsed (None: sys.argv)."""
    import argparse
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    out = pathlib.Path(ap.parse_known_args(argv)[0].out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    return out


def variants(label: str, calls, default: tuple, combos, apply, check):
    """Yield (settings, µs, check(output of calls[0])) for `default`, then each other tuple of
    `combos`; apply(*settings) sets them, apply(*default) restores them after each. calls:
    zero-arg calls, one per input set (time_calls). A variant that raises (e.g. too much shared
    memory) is reported and skipped."""
    for v in [default] + [c for c in combos if c != default]:
        apply(*v)
        try:
            got = check(calls[0]())
            us = time_calls(calls)
        except Exception as exc:  # one variant's failure must not hide the others
            print(f"{label} {v}: FAILED {str(exc)[:300]}", flush=True)
            continue
        finally:
            apply(*default)
        yield v, us, got
