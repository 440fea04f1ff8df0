#!/usr/bin/env python3
"""Time every kolibri_trt_plugins kernel at full Kolibri-1 sizes on the H200, next to stock torch,
and run the INT4-key error study. One call:

    python3 bench/plugins.py [--only attn,gemv,moe,fold,study] [--quick] [--csv FILE]
    python3 bench/plugins.py --only splitk [--quick]   # fp8 GEMV + MoE tiling/split-K sweeps only
                                                       # (or splitk_gemv / splitk_moe: one each)
    python3 bench/plugins.py --only moe_tiles [--quick] # MoE work list x tile widths

Timing: each measured call is captured (with R copies on R different input sets, so that the L2
cache cannot serve the weights / KV) in one CUDA graph; the graph is replayed ITERS times between
CUDA events, repeated REPEATS times; the median per call is reported. Bytes are the least that
must move (each input read once, each output written once). % is of the measured 4.14 TB/s read
bandwidth (shared/notes/h200.md).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback

import torch

from gpu_check import load_plugins
from kv_error_study import study

load_plugins()
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402
from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention  # noqa: E402
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402
from kolibri_trt_plugins.moe import moe_forward  # noqa: E402
from kolibri_trt_plugins.moe_route import moe_route_ref  # noqa: E402
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_dequantize_ref, nvfp4_gemv  # noqa: E402
from kolibri_trt_plugins.qk_norm_fold_int4 import (fold_matrices,  # noqa: E402
                                                   hadamard_rotation, qk_norm_fold_int4)

BW = 4.14e12          # measured HBM read bandwidth, bytes/s
L2_FLUSH = 240e6      # rotate input sets until this many bytes are touched per graph
ITERS, REPEATS = 20, 5
DEV = "cuda"
ROWS: list[dict] = []
APPLY_BEST = True  # --only sweep,...: the sections after the sweep run with its winners
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
    tbs = nbytes / (us * 1e-6) / 1e12
    row = dict(kernel=kernel, shape=shape, us=us, MB=nbytes / 1e6, TBs=tbs, pct=100 * tbs * 1e12 / BW,
               stock_us=stock_us, note=note)
    ROWS.append(row)
    st = f"{stock_us:9.1f}" if stock_us else "        -"
    sp = f"{stock_us / us:5.2f}x" if stock_us else "     -"
    print(f"{kernel:22s} {shape:34s} {us:9.1f} µs {nbytes / 1e6:9.2f} MB {tbs:5.2f} TB/s "
          f"{row['pct']:5.1f}% | stock {st} µs {sp} {note}", flush=True)


# ---------------------------------------------------------------- attention
def paged_tables(B, ctx, blk):
    nb = B * (ctx // blk)
    perm = torch.randperm(nb, device=DEV).int()
    return perm.view(B, ctx // blk).contiguous(), nb


def attn_bench(B, ctx, blk, q_len, quick):
    """One (batch, context) point: INT4 full, FP8 full, FP8 window 513, and stock SDPA (bf16).
    Small configs get several cache copies (distinct block ranges) so the L2 cannot serve them."""
    hq, hkv = 20, 4
    sl = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV) * q_len
    bt, nb = paged_tables(B, ctx, blk)
    q = torch.randn((B * q_len, hq, 128), device=DEV).bfloat16()
    tag = f"B={B} ctx={ctx // 1024}k blk={blk}" + (f" q={q_len}" if q_len > 1 else "")
    stock = {}
    if q_len == 1:  # stock: SDPA over dense bf16 K/V, one query per stream
        qd = q.view(B, hq, 1, 128)
        for w in (0, 513):
            n = ctx if w == 0 else 513
            try:
                sets = [[torch.randn((B, hkv, n, 128), device=DEV).bfloat16() for _ in range(2)]
                        for _ in range(sets_for(B * hkv * n * 512))]
                stock[w] = time_calls([lambda kv=kv: torch.nn.functional.scaled_dot_product_attention(
                    qd, kv[0], kv[1], enable_gqa=True) for kv in sets])
            except Exception as exc:  # e.g. a math-backend fallback out of memory
                print(f"stock SDPA {tag} w={w} failed: {str(exc)[:120]}")
            sets = None
            torch.cuda.empty_cache()
    qbytes = 2 * q.numel() * 2
    # INT4 full attention
    nbytes = B * ctx * hkv * 136 + qbytes
    ns = sets_for(nbytes)
    kc = torch.randint(0, 256, (ns * nb, blk, hkv, 64), dtype=torch.uint8, device=DEV)
    vc = torch.randint(0, 256, (ns * nb, blk, hkv, 64), dtype=torch.uint8, device=DEV)
    km, vm = [torch.stack([torch.rand((ns * nb, blk, hkv), device=DEV) * 0.3 + 0.01,
                           -torch.rand((ns * nb, blk, hkv), device=DEV)], -1).half() for _ in range(2)]
    calls = [lambda b=bt + i * nb: int4_paged_attention(q, kc, vc, km, vm, b, sl, cu, ctx, q_len)
             for i in range(ns)]
    us = time_calls(calls)
    report("int4_paged_attention", tag, us, nbytes, stock.get(0))
    if (B, ctx, q_len) == (16, 32768, 1):  # the PTX nibble decode against the plain Triton one
        ia = sys.modules["kolibri_trt_plugins.int4_paged_attention"]
        ia.USE_ASM = False
        report("int4_paged_attn noasm", tag, time_calls(calls), nbytes, stock.get(0))
        ia.USE_ASM = True
    del kc, vc, km, vm
    # FP8: full causal (stock full layers) and window 513 (sliding layers)
    one = torch.ones(1, device=DEV)
    for w in (0, 513):
        keys = ctx if w == 0 else min(ctx, 513 + q_len - 1)
        nbytes = B * keys * hkv * 256 + qbytes
        ns = max(1, min(sets_for(nbytes), int(8e9 // (B * ctx * hkv * 256))))
        kf = torch.randn((ns * nb, blk, hkv, 128), device=DEV).to(E4M3)
        vf = torch.randn((ns * nb, blk, hkv, 128), device=DEV).to(E4M3)
        part = 2048 if w == 0 else None  # full layers: the PART that won the B=16 32k sweep
        us = time_calls([lambda b=bt + i * nb: fp8_paged_attention(q, kf, vf, one, one, b, sl, cu, ctx,
                                                                    q_len, window=w, part=part)
                         for i in range(ns)])
        report(f"fp8_paged_attn w={w}", tag, us, nbytes, stock.get(w))
        del kf, vf


def bench_attention(quick):
    batches = (1, 4, 16, 64) if not quick else (1, 16)
    points = [(B, ctx, 64, 1) for ctx in (4096, 32768, 131072) for B in batches]
    points += [(B, 32768, blk, q) for B in ((1, 16) if not quick else (16,))
               for blk, q in ((16, 1), (64, 4))]
    for B, ctx, blk, q in points:
        try:
            attn_bench(B, ctx, blk, q, quick)
        except Exception as exc:
            print(f"attention B={B} ctx={ctx} blk={blk} q={q} FAILED: {str(exc)[:300]}", flush=True)
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- GEMV
def bench_nvfp4(quick):
    for name, N in (("lm_head", 131072), ("drafter_head", 60614)):
        K = 2560
        nbytes_w = N * K // 2 + N * K // 16
        nsets = sets_for(nbytes_w)
        ws = [(torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=DEV),
               (torch.rand((N, K // 16), device=DEV) + 0.25).to(E4M3), torch.tensor([0.02], device=DEV))
              for _ in range(nsets)]
        wb = [nvfp4_dequantize_ref(*w).bfloat16() for w in ws[:sets_for(N * K * 2)]]
        for M in (1, 4, 16, 64):
            x = torch.randn((M, K), device=DEV).bfloat16()
            us = time_calls([lambda w=w: nvfp4_gemv(x, *w) for w in ws])
            st = time_calls([lambda w=w: x @ w.T for w in wb])
            report("nvfp4_gemv", f"{name} M={M} N={N} K={K}", us, nbytes_w + M * (K + N) * 2, st)
        del ws, wb
        torch.cuda.empty_cache()


def bench_fp8(quick):
    shapes = [("qkv", 3584, 2560, "tensor"), ("o_proj", 2560, 2560, "tensor"),
              ("qkv", 3584, 2560, "channel"), ("drafter_fc", 2560, 2560, "block"),
              ("drafter_mlp", 7680, 2560, "block")]
    for name, N, K, mode in shapes:
        sbytes = 4 if mode == "tensor" else (4 * N if mode == "channel" else 4 * N * K // 64)
        nbytes_w = N * K + sbytes
        nsets = sets_for(nbytes_w)
        ws = []
        for _ in range(nsets):
            w = torch.randn((N, K), device=DEV).to(E4M3)
            s = {"tensor": torch.tensor([0.02], device=DEV), "channel": torch.rand(N, device=DEV),
                 "block": torch.rand((N, K // 64), device=DEV)}[mode]
            ws.append((w, s))
        wb = [w.bfloat16() for w, _ in ws[:sets_for(N * K * 2)]]
        for M in (1, 4, 16, 64):
            x = torch.randn((M, K), device=DEV).bfloat16()
            us = time_calls([lambda w=w: fp8_gemv(x, *w) for w in ws])
            st = time_calls([lambda w=w: x @ w.T for w in wb])
            report(f"fp8_gemv {mode}", f"{name} M={M} N={N} K={K}", us, nbytes_w + M * (K + N) * 2, st)
        del ws, wb
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- MoE
def moe_stock(x, rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2, k):
    """Stock torch (graph-capturable): route, gather the chosen experts, dequantize, bmm."""
    ids, wts = moe_route_ref(x, rw, k)
    ids = ids.long()
    a = w13[ids].to(torch.bfloat16) * s13[ids][..., None, None].to(torch.bfloat16)  # [M,k,2I,H]
    gu = torch.einsum("mh,mkih->mki", x, a).float()
    inter = w13.shape[1] // 2
    act = (torch.nn.functional.silu(gu[..., :inter]) * gu[..., inter:]).bfloat16()
    b = w2[ids].to(torch.bfloat16) * s2[ids][..., None, None].to(torch.bfloat16)
    out = torch.einsum("mki,mkhi->mkh", act, b).float()
    y = (out * wts[..., None]).sum(1)
    gs = x.float() @ (sw13[0].float() * ss13[0]).T
    y = y + (torch.nn.functional.silu(gs[:, :inter]) * gs[:, inter:]).bfloat16().float() @ (
        sw2[0].float() * ss2[0]).T
    return y.bfloat16()


def bench_moe(quick):
    E, H, inter, k = 256, 2560, 768, 6
    per_expert = 3 * inter * H + 4
    wts = [torch.randn((E, H), device=DEV).bfloat16() * 0.05,
           torch.randn((E, 2 * inter, H), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
           torch.randn((E, H, inter), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
           torch.randn((1, 2 * inter, H), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02,
           torch.randn((1, H, inter), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02]
    for M in (1, 4, 16, 64):
        xs = [torch.randn((M, H), device=DEV).bfloat16() for _ in range(8)]
        distinct = statistics.mean(len(set(moe_route_ref(x, wts[0], k)[0].flatten().tolist())) for x in xs)
        nbytes = E * H * 2 + (distinct + 1) * per_expert + 2 * M * H * 2
        us = time_calls([lambda x=x: moe_forward(x, *wts, top_k=k) for x in xs])
        st = time_calls([lambda x=x: moe_stock(x, *wts, k) for x in xs[:2]]) if M <= 16 else None
        report("moe_forward", f"M={M} E=256 top6 H=2560 I=768", us, nbytes, st,
               f"experts read={distinct:.1f}+1")


# ---------------------------------------------------------------- fold
def bench_fold(quick):
    hq, hkv, blk = 20, 4, 64
    mq, mk = fold_matrices(torch.ones(128), torch.ones(128), hadamard_rotation(3))
    mq, mk = mq.to(DEV), mk.to(DEV)
    nb = 4096
    caches = [torch.zeros((nb, blk, hkv, 64), dtype=torch.uint8, device=DEV) for _ in range(2)]
    caches += [torch.zeros((nb, blk, hkv, 2), dtype=torch.float16, device=DEV) for _ in range(2)]
    for T_ in (1, 16, 64, 576):
        qkv = torch.randn((T_, hq + 2 * hkv, 128), device=DEV).bfloat16()
        q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
        slots = torch.randperm(nb * blk, device=DEV)[:T_]
        us = time_calls([lambda: qk_norm_fold_int4(q, k, v, mq, mk, slots, *caches)])
        nbytes = qkv.numel() * 2 + T_ * hq * 256 + T_ * hkv * 2 * 68 + 2 * 65536
        report("qk_norm_fold_int4", f"T={T_} Hq=20 Hkv=4", us, nbytes)


# ---------------------------------------------------------------- tuning sweep
def sweep_one(label, mod, settings, run, nbytes):
    """Time ``run()`` (a list of zero-arg calls) under each dict of module attributes in settings.
    Returns [(cfg, µs)] of the configs that ran."""
    import itertools
    keys = list(settings)
    saved = {k: getattr(mod, k) for k in keys if k not in ("num_warps", "num_stages")}
    saved_tune = dict(mod.TUNE)
    best = None
    results = []
    for combo in itertools.product(*settings.values()):
        cfg = dict(zip(keys, combo))
        for k, v in cfg.items():
            if k in ("num_warps", "num_stages"):
                mod.TUNE[k] = v
            else:
                setattr(mod, k, v)
        try:
            us = time_calls(run())
            print(f"sweep {label:34s} {cfg} {us:9.1f} µs {nbytes / us / 1e6:5.2f} TB/s", flush=True)
            results.append((cfg, us))
            if best is None or us < best[0]:
                best = (us, cfg)
        except Exception as exc:
            print(f"sweep {label} {cfg} failed: {str(exc)[:200]}", flush=True)
    for k, v in saved.items():
        setattr(mod, k, v)
    mod.TUNE.clear()
    mod.TUNE.update(saved_tune)
    if best is not None and APPLY_BEST:  # later sections of this run use the winner
        for k, v in best[1].items():
            if k in ("num_warps", "num_stages"):
                mod.TUNE[k] = v
            else:
                setattr(mod, k, v)
    print(f"BEST {label}: {best}", flush=True)
    return results


def split_summary(label, results, key, current):
    """One line per shape: the current config's time, then the best time for each value of the
    split-K knob ``key`` (over the other swept knobs) and the config that got it."""
    cur = [us for cfg, us in results if all(cfg[k] == v for k, v in current.items() if k in cfg)]
    line = f"SPLITK {label:28s} current {cur[0] if cur else float('nan'):8.1f} µs |"
    for v in dict.fromkeys(cfg[key] for cfg, _ in results):
        us, cfg = min(((us, cfg) for cfg, us in results if cfg[key] == v), key=lambda r: r[0])
        other = {k: x for k, x in cfg.items() if k != key}
        line += f" {key}={v}: {us:7.1f} µs {other} |"
    print(line, flush=True)


FP8_SWEEP_SHAPES = (("qkv", "tensor", 3584, 2560), ("o_proj", "tensor", 2560, 2560),
                    ("block", "block", 7680, 2560))
FP8_SPLITS = [1, 2, 3, 5, 10]    # K = 2560 in 256-steps: 10 | 5+5 | 4+4+2 | 5x2 | 10x1
MOE_SPLITS_GATED = [1, 2, 5]     # K = H = 2560
MOE_SPLITS_DOWN = [1, 2, 3]      # K = I = 768: 3 steps of 256


def sweep_fp8_gemv(quick, shapes=FP8_SWEEP_SHAPES, ms=(1, 4, 16, 64)):
    """fp8_gemv launch config x split-K per (shape, M); SPLITK lines: per-S best vs current.
    SPLIT_K must be one value per shape (batch invariance): read each shape's lines across M."""
    import importlib
    f8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    grid = (dict(BLOCK_K=[256], num_warps=[4], num_stages=[3]) if quick else
            dict(BLOCK_K=[256, 512], num_warps=[4, 8], num_stages=[3, 4]))
    for name, mode, N, K in shapes:
        ws = [(torch.randn((N, K), device=DEV).to(E4M3),
               torch.tensor([0.02], device=DEV) if mode == "tensor" else torch.rand((N, K // 64), device=DEV))
              for _ in range(sets_for(N * K))]
        for M in ms:
            x = torch.randn((M, K), device=DEV).bfloat16()
            label = f"fp8 gemv {name} {N}x{K} M={M}"
            current = dict(BLOCK_K=f8.BLOCK_K, SPLIT_K=f8.split_k_for(N, K), **f8.TUNE)
            res = sweep_one(label, f8, dict(grid, SPLIT_K=FP8_SPLITS),
                            lambda: [lambda w=w: fp8_gemv(x, *w) for w in ws], N * K)
            split_summary(label, res, "SPLIT_K", current)
        del ws


def sweep_moe(quick, ms=(1, 16, 64), E=256, H=2560, inter=768, k=6):
    """moe_experts tiles x split-K (gate_up and down) per M; SPLITK lines as for fp8_gemv."""
    import importlib
    me = importlib.import_module("kolibri_trt_plugins.moe_experts")
    current = dict(BLOCK_N_GATED=me.BLOCK_N_GATED, BLOCK_N_DOWN=me.BLOCK_N_DOWN,
                   SPLIT_K_GATED=me.SPLIT_K_GATED, SPLIT_K_DOWN=me.SPLIT_K_DOWN, **me.TUNE)
    grid = (dict(BLOCK_N_GATED=[32], BLOCK_N_DOWN=[64], num_stages=[3]) if quick else
            dict(BLOCK_N_GATED=[16, 32], BLOCK_N_DOWN=[32, 64], num_stages=[3]))
    wts = [torch.randn((E, H), device=DEV).bfloat16() * 0.05,
           torch.randn((E, 2 * inter, H), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
           torch.randn((E, H, inter), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
           torch.randn((1, 2 * inter, H), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02,
           torch.randn((1, H, inter), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02]
    for M in ms:
        xs = [torch.randn((M, H), device=DEV).bfloat16() for _ in range(8)]
        label = f"moe M={M}"
        res = sweep_one(label, me, dict(grid, SPLIT_K_GATED=MOE_SPLITS_GATED,
                                        SPLIT_K_DOWN=MOE_SPLITS_DOWN),
                        lambda: [lambda x=x: moe_forward(x, *wts, top_k=k) for x in xs],
                        k * 3 * inter * H * M)
        split_summary(label + " gate_up", res, "SPLIT_K_GATED", current)
        split_summary(label + " down", res, "SPLIT_K_DOWN", current)


def moe_bytes(xs, router, E=256, H=2560, inter=768, k=6):
    """Least bytes one moe_forward call moves: router, distinct experts + shared, x in, y out."""
    distinct = statistics.mean(len(set(moe_route_ref(x, router, k)[0].flatten().tolist()))
                               for x in xs)
    return E * H * 2 + (distinct + 1) * (3 * inter * H + 4) + 2 * xs[0].shape[0] * H * 2


def sweep_moe_tiles(quick, ms=(1, 16, 64), E=256, H=2560, inter=768, k=6):
    """moe_experts work list (COMPACT_UNITS, UNIT_PROGRAMS) x tile widths, K unsplit; summary
    lines: best per BLOCK_N_DOWN and per COMPACT_UNITS, one line per M (a tile width must be one
    value per layer shape: read them across M; the work list changes no value)."""
    import importlib
    me = importlib.import_module("kolibri_trt_plugins.moe_experts")
    grid = (dict(COMPACT_UNITS=[False, True], UNIT_PROGRAMS=[64], BLOCK_N_GATED=[32, 64],
                 BLOCK_N_DOWN=[128], num_warps=[4], num_stages=[3]) if quick else
            dict(COMPACT_UNITS=[False, True], UNIT_PROGRAMS=[32, 64, 128], BLOCK_N_GATED=[32, 64],
                 BLOCK_N_DOWN=[64, 128], num_warps=[4], num_stages=[3]))
    current = dict(COMPACT_UNITS=me.COMPACT_UNITS, BLOCK_N_GATED=me.BLOCK_N_GATED,
                   BLOCK_N_DOWN=me.BLOCK_N_DOWN, **me.TUNE)
    wts = [torch.randn((E, H), device=DEV).bfloat16() * 0.05,
           torch.randn((E, 2 * inter, H), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
           torch.randn((E, H, inter), device=DEV).to(E4M3), torch.rand(E, device=DEV) * 0.02,
           torch.randn((1, 2 * inter, H), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02,
           torch.randn((1, H, inter), device=DEV).to(E4M3), torch.rand(1, device=DEV) * 0.02]
    for M in ms:
        xs = [torch.randn((M, H), device=DEV).bfloat16() for _ in range(8)]
        label = f"moe tiles M={M}"
        res = sweep_one(label, me, grid, lambda: [lambda x=x: moe_forward(x, *wts, top_k=k)
                                                  for x in xs], moe_bytes(xs, wts[0], E, H, inter, k))
        split_summary(label, res, "BLOCK_N_DOWN", current)
        split_summary(label, res, "COMPACT_UNITS", current)


def bench_sweep(quick):
    import importlib  # the package re-exports functions under the module names: go by sys.modules
    fa, ia, nv = (importlib.import_module(f"kolibri_trt_plugins.{m}") for m in (
        "fp8_paged_attention", "int4_paged_attention", "nvfp4_gemv"))
    hkv, B, ctx, blk = 4, 16, 32768, 64
    sl = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV)
    bt, nb = paged_tables(B, ctx, blk)
    q = torch.randn((B, 20, 128), device=DEV).bfloat16()
    kc = torch.randint(0, 256, (nb, blk, hkv, 64), dtype=torch.uint8, device=DEV)
    vc = torch.randint(0, 256, (nb, blk, hkv, 64), dtype=torch.uint8, device=DEV)
    km = (torch.rand((nb, blk, hkv, 2), device=DEV) * 0.1).half()
    vm = (torch.rand((nb, blk, hkv, 2), device=DEV) * 0.1).half()
    att = dict(PART=[512, 2048], BLOCK_N=[64, 128], num_warps=[4, 8], num_stages=[2, 3])
    sweep_one("int4 attn B=16 32k", ia, att, lambda: [
        lambda: int4_paged_attention(q, kc, vc, km, vm, bt, sl, cu, ctx, 1, part=ia.PART)],
        B * ctx * hkv * 136)
    del kc, vc, km, vm
    kf = torch.randn((nb, blk, hkv, 128), device=DEV).to(E4M3)
    vf = torch.randn((nb, blk, hkv, 128), device=DEV).to(E4M3)
    one = torch.ones(1, device=DEV)
    sweep_one("fp8 attn w=0 B=16 32k", fa, att, lambda: [
        lambda: fp8_paged_attention(q, kf, vf, one, one, bt, sl, cu, ctx, 1, window=0, part=fa.PART)],
        B * ctx * hkv * 256)
    del kf, vf
    N, K = 131072, 2560
    w = (torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=DEV),
         (torch.rand((N, K // 16), device=DEV) + 0.25).to(E4M3), torch.tensor([0.02], device=DEV))
    x = torch.randn((1, K), device=DEV).bfloat16()
    sweep_one("nvfp4 lm_head M=1", nv, dict(BLOCK_N_MAX=[64, 128], BLOCK_K=[256, 512], num_warps=[4, 8],
                                            num_stages=[3, 4]),
              lambda: [lambda: nvfp4_gemv(x, *w)], N * K * 9 / 16)
    del w
    sweep_fp8_gemv(quick)
    sweep_moe(quick)


def main():
    global ITERS, REPEATS
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="study,attn,gemv,moe,fold")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    if args.quick:
        ITERS, REPEATS = 10, 3
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    hdr = f"{'kernel':22s} {'shape':34s} {'time':>12s} {'bytes':>12s} {'rate':>10s} {'%bw':>6s}"
    for sec in args.only.split(","):
        t0 = time.time()
        try:
            if sec == "study":
                for L in (32768, 131072):
                    study(L)
            else:
                print(hdr)
                {"attn": bench_attention, "gemv": lambda q: (bench_nvfp4(q), bench_fp8(q)),
                 "moe": bench_moe, "fold": bench_fold, "sweep": bench_sweep,
                 "splitk": lambda q: (sweep_fp8_gemv(q), sweep_moe(q)),
                 "splitk_gemv": sweep_fp8_gemv, "splitk_moe": sweep_moe,
                 "moe_tiles": sweep_moe_tiles}[sec](args.quick)
        except Exception:  # keep the other sections' numbers
            traceback.print_exc()
        torch.cuda.empty_cache()
        print(f"-- {sec}: {time.time() - t0:.1f} s", flush=True)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("kernel,shape,us,MB,TBs,pct_bw,stock_us,note\n")
            for r in ROWS:
                f.write(f"{r['kernel']},{r['shape']},{r['us']:.2f},{r['MB']:.3f},{r['TBs']:.3f},"
                        f"{r['pct']:.1f},{r['stock_us'] or ''},{r['note']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
