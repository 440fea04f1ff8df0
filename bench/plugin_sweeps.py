"""The tuning sweeps of bench/plugins.py (sections sweep, splitk, splitk_gemv, splitk_moe,
moe_tiles): each swept config timed with plugin_timing.time_calls, a BEST line per sweep and
SPLITK summary lines. Run through bench/plugins.py. `ws`, `kc`, `w`, ... below are deleted
after the sweep that used them ran (F821: ruff does not see that the lambdas ran first)."""

from __future__ import annotations

import statistics

import plugin_timing as PT
import torch
from gpu_check import load_plugins
from plugin_timing import DEV, E4M3, moe_weights, paged_tables, sets_for, time_calls

load_plugins()
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402
from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention  # noqa: E402
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402
from kolibri_trt_plugins.moe import moe_forward  # noqa: E402
from kolibri_trt_plugins.moe_route import moe_route_ref  # noqa: E402
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv  # noqa: E402


# ---------------------------------------------------------------- tuning sweep
def sweep_one(label, mod, settings, run, nbytes, tune="TUNE"):
    """Time ``run()`` (a list of zero-arg calls) under each dict of module attributes in settings
    (num_warps / num_stages go into the module's launch-config dict named ``tune``).
    Returns [(cfg, µs)] of the configs that ran."""
    import itertools
    keys = list(settings)
    saved = {k: getattr(mod, k) for k in keys if k not in ("num_warps", "num_stages")}
    tune_d = getattr(mod, tune)
    saved_tune = dict(tune_d)
    best = None
    results = []
    for combo in itertools.product(*settings.values()):
        cfg = dict(zip(keys, combo))
        for k, v in cfg.items():
            if k in ("num_warps", "num_stages"):
                tune_d[k] = v
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
    tune_d.clear()
    tune_d.update(saved_tune)
    if best is not None and PT.APPLY_BEST:  # later sections of this run use the winner
        for k, v in best[1].items():
            if k in ("num_warps", "num_stages"):
                tune_d[k] = v
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
                            lambda: [lambda w=w: fp8_gemv(x, *w) for w in ws], N * K)  # noqa: F821
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
    grid["TILES_BY_TOKENS"] = [False]     # the swept widths at every M
    wts = moe_weights(E, H, inter)
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
    """moe_experts tile widths, K unsplit; summary lines: best per BLOCK_N_DOWN and per
    BLOCK_N_GATED, one line per M (a tile width must be one value per layer shape: read them
    across M)."""
    import importlib
    me = importlib.import_module("kolibri_trt_plugins.moe_experts")
    grid = (dict(BLOCK_N_GATED=[32, 64], BLOCK_N_DOWN=[128], num_warps=[4], num_stages=[3])
            if quick else
            dict(BLOCK_N_GATED=[32, 64], BLOCK_N_DOWN=[64, 128], num_warps=[4], num_stages=[3]))
    grid["TILES_BY_TOKENS"] = [False]     # the swept widths at every M
    current = dict(BLOCK_N_GATED=me.BLOCK_N_GATED, BLOCK_N_DOWN=me.BLOCK_N_DOWN, **me.TUNE)
    wts = moe_weights(E, H, inter)
    for M in ms:
        xs = [torch.randn((M, H), device=DEV).bfloat16() for _ in range(8)]
        label = f"moe tiles M={M}"
        res = sweep_one(label, me, grid, lambda: [lambda x=x: moe_forward(x, *wts, top_k=k)
                                                  for x in xs], moe_bytes(xs, wts[0], E, H, inter, k))
        split_summary(label, res, "BLOCK_N_DOWN", current)
        split_summary(label, res, "BLOCK_N_GATED", current)


def bench_sweep(quick):
    import importlib  # the package re-exports functions under the module names: go by sys.modules
    fa, ia, nv = (importlib.import_module(f"kolibri_trt_plugins.{m}") for m in (
        "fp8_paged_attention", "int4_paged_attention", "nvfp4_gemv"))
    hkv, B, ctx, blk = 4, 16, 32768, 64
    sl = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV)
    bt, nb = paged_tables(B, ctx, blk)
    q = torch.randn((B, 20, 128), device=DEV).bfloat16()
    kc = torch.randint(0, 256, (nb, hkv, blk, 64), dtype=torch.uint8, device=DEV)  # head-major
    vc = torch.randint(0, 256, (nb, hkv, 64, blk), dtype=torch.uint8, device=DEV)  # dim-major
    km = (torch.rand((nb, hkv, blk, 2), device=DEV) * 0.1).half()
    vm = (torch.rand((nb, hkv, blk, 2), device=DEV) * 0.1).half()
    att = dict(PART=[512, 1024], BLOCK_N=[16, 32, 64], num_warps=[1, 2], num_stages=[5])
    sweep_one("int4 attn B=16 32k", ia, att, lambda: [
        lambda: int4_paged_attention(q, kc, vc, km, vm, bt, sl, cu, ctx, 1, part=ia.PART)],  # noqa: F821
        B * ctx * hkv * 136)
    del kc, vc, km, vm
    kf = torch.randn((nb, blk, hkv, 128), device=DEV).to(E4M3)
    vf = torch.randn((nb, blk, hkv, 128), device=DEV).to(E4M3)
    one = torch.ones(1, device=DEV)
    att_full = dict(PART_FULL=att["PART"], BLOCK_N_FULL=att["BLOCK_N"], num_warps=att["num_warps"],
                    num_stages=att["num_stages"])
    sweep_one("fp8 attn w=0 B=16 32k", fa, att_full, lambda: [
        lambda: fp8_paged_attention(q, kf, vf, one, one, bt, sl, cu, ctx, 1, window=0,  # noqa: F821
                                    part=fa.PART_FULL)], B * ctx * hkv * 256, tune="TUNE_FULL")
    del kf, vf
    N, K = 131072, 2560
    w = (torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=DEV),
         (torch.rand((N, K // 16), device=DEV) + 0.25).to(E4M3), torch.tensor([0.02], device=DEV))
    x = torch.randn((1, K), device=DEV).bfloat16()
    sweep_one("nvfp4 lm_head M=1", nv, dict(BLOCK_N_MAX=[64, 128], BLOCK_K=[256, 512], num_warps=[4, 8],
                                            num_stages=[3, 4]),
              lambda: [lambda: nvfp4_gemv(x, *w)], N * K * 9 / 16)  # noqa: F821
    del w
    sweep_fp8_gemv(quick)
    sweep_moe(quick)
