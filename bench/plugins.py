#!/usr/bin/env python3
"""Time every kolibri_trt_plugins kernel at full Kolibri-1 sizes on the H200, next to stock torch,
and run the INT4-key error study. One call:

    python3 bench/plugins.py [--only attn,gemv,moe,fused,fold,study,sliding] [--quick] [--csv FILE]
        [--ceiling]   # each row also against the best plain read of its bytes
        [--set MODULE.NAME=VALUE]   # a plugin setting for the run (A/B)
    python3 bench/plugins.py --only splitk [--quick]   # fp8 GEMV + MoE tiling/split-K sweeps only
                                                       # (or splitk_gemv / splitk_moe: one each)
    python3 bench/plugins.py --only moe_tiles [--quick] # MoE expert tile widths

Timing: each measured call is captured (with R copies on R different input sets, so that the L2
cache cannot serve the weights / KV) in one CUDA graph; the graph is replayed ITERS times between
CUDA events, repeated REPEATS times; the median per call is reported. Bytes are the least that
must move (each input read once, each output written once). % is of the measured 4.14 TB/s read
bandwidth (shared/notes/h200.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback

import plugin_timing as PT
import torch
from gpu_check import load_plugins
from kv_error_study import study
from plugin_settings import apply_settings

# re-exported (F401), as before: other scripts use plugins.<name> (int4_attn_tune.py: BP.*)
from plugin_sweeps import (  # noqa: F401
    FP8_SPLITS,
    FP8_SWEEP_SHAPES,
    MOE_SPLITS_DOWN,
    MOE_SPLITS_GATED,
    bench_sweep,
    moe_bytes,
    split_summary,
    sweep_fp8_gemv,
    sweep_moe,
    sweep_moe_tiles,
    sweep_one,
)
from plugin_timing import (  # noqa: F401
    BW,
    DEV,
    E4M3,
    L2_FLUSH,
    ROWS,
    moe_weights,
    paged_tables,
    report,
    sets_for,
    time_calls,
)

load_plugins()
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402
from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention  # noqa: E402
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402
from kolibri_trt_plugins.moe import moe_forward  # noqa: E402
from kolibri_trt_plugins.add_rms_norm import add_rms_norm  # noqa: E402
from kolibri_trt_plugins.gemv_add_rms_norm import fp8_gemv_add_rms_norm  # noqa: E402
from kolibri_trt_plugins.moe_route import moe_route_ref  # noqa: E402
from kolibri_trt_plugins.fp8_kv_write import fp8_kv_write  # noqa: E402
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_dequantize_ref, nvfp4_gemv  # noqa: E402
from kolibri_trt_plugins.nvfp4_wgmma import nvfp4_wgmma, to_wgmma_storage  # noqa: E402
from kolibri_trt_plugins.fp8_wgmma import fp8_wgmma  # noqa: E402
from kolibri_trt_plugins.fp8_wgmma import to_wgmma_storage as to_fp8_wgmma  # noqa: E402
from kolibri_trt_plugins.qk_norm_rope import qk_norm_rope  # noqa: E402
from kolibri_trt_plugins.qk_norm_rope_kv_write import qk_norm_rope_kv_write  # noqa: E402
from kolibri_trt_plugins.qk_norm_fold_int4 import (  # noqa: E402
    fold_matrices,
    hadamard_rotation,
    qk_norm_fold_int4,
)


def __getattr__(name):
    """plugins.ITERS / REPEATS / APPLY_BEST: the current values (they live in plugin_timing)."""
    if name in ("ITERS", "REPEATS", "APPLY_BEST"):
        return getattr(PT, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- attention
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
    kc = torch.randint(0, 256, (ns * nb, hkv, blk, 64), dtype=torch.uint8, device=DEV)  # head-major
    vc = torch.randint(0, 256, (ns * nb, hkv, 64, blk), dtype=torch.uint8, device=DEV)  # dim-major
    km, vm = [torch.stack([torch.rand((ns * nb, hkv, blk), device=DEV) * 0.3 + 0.01,
                           -torch.rand((ns * nb, hkv, blk), device=DEV)], -1).half() for _ in range(2)]
    calls = [lambda b=bt + i * nb: int4_paged_attention(q, kc, vc, km, vm, b, sl, cu, ctx, q_len)  # noqa: F821
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
        us = time_calls([lambda b=bt + i * nb: fp8_paged_attention(q, kf, vf, one, one, b, sl, cu, ctx,  # noqa: F821
                                                                    q_len, window=w)
                         for i in range(ns)])
        report(f"fp8_paged_attn w={w}", tag, us, nbytes, stock.get(w))
        del kf, vf


def bench_sliding(quick):
    """FP8 sliding-window attention alone (window 513, blocks of 64, GQA 20/4, at 32k): decode
    and 1 + 8 verification tokens, B = 1, 4, 16, 64. Only the blocks the window reads are
    distinct (the rest of each table points at block 0), so large batches fit many sets."""
    hq, hkv, blk, ctx, w = 20, 4, 64, 32768, 513
    one = torch.ones(1, device=DEV)
    for q_len in (1, 9):
        for B in (1, 4, 16, 64):
            keys = min(ctx, w + q_len - 1)
            live = -(-(keys + blk) // blk)           # blocks a stream's window can touch
            nbytes = B * keys * hkv * 256 + 2 * B * q_len * hq * 256
            ns = sets_for(nbytes)
            kf = torch.randn((ns * B * live + 1, blk, hkv, 128), device=DEV).to(E4M3)
            vf = torch.randn((ns * B * live + 1, blk, hkv, 128), device=DEV).to(E4M3)
            sl = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
            cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV) * q_len
            q = torch.randn((B * q_len, hq, 128), device=DEV).bfloat16()
            tables = []
            for i in range(ns):
                bt = torch.zeros((B, ctx // blk), dtype=torch.int32, device=DEV)
                bt[:, -live:] = 1 + i * B * live + torch.arange(B * live, device=DEV).view(B, live)
                tables.append(bt)
            us = time_calls([lambda b=b: fp8_paged_attention(q, kf, vf, one, one, b, sl, cu, ctx,
                                                               q_len, window=w) for b in tables])
            report("fp8_paged_attn w=513", f"B={B} ctx=32k blk=64 q={q_len}", us, nbytes)
            del kf, vf


ATTN_BLOCKS = (64,)   # page sizes (tokens) of the batch x context grid (--attn-blocks)


def bench_attention(quick):
    batches = (1, 4, 16, 64) if not quick else (1, 16)
    points = [(B, ctx, blk, 1) for blk in ATTN_BLOCKS for ctx in (4096, 32768, 131072)
              for B in batches]
    points += [(B, 32768, blk, q) for B in ((1, 16) if not quick else (16,))
               for blk, q in ((16, 1), (64, 4)) if (B, 32768, blk, q) not in points]
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
        wg = [(to_wgmma_storage(w), s, s2) for w, s, s2 in ws]
        for M in NVFP4_ROWS:
            x = torch.randn((M, K), device=DEV).bfloat16()
            us = time_calls([lambda w=w: nvfp4_gemv(x, *w) for w in ws])
            st = time_calls([lambda w=w: x @ w.T for w in wb])
            nbytes = nbytes_w + M * (K + N) * 2
            report("nvfp4_gemv", f"{name} M={M} N={N} K={K}", us, nbytes, st)
            us = time_calls([lambda w=w: nvfp4_wgmma(x, *w) for w in wg])
            report("nvfp4_wgmma", f"{name} M={M} N={N} K={K}", us, nbytes, st)
        del ws, wb, wg
        torch.cuda.empty_cache()


GEMV_ROWS = (1, 4, 16, 64)   # rows fp8_gemv is timed at (--gemv-rows)
NVFP4_ROWS = (1, 4, 16, 64, 144)   # rows the NVFP4 heads are timed at (144: 16 streams x 9)


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
        wg = [(to_fp8_wgmma(w), s) for w, s in ws] if mode == "tensor" else []
        for M in GEMV_ROWS:
            x = torch.randn((M, K), device=DEV).bfloat16()
            us = time_calls([lambda w=w: fp8_gemv(x, *w) for w in ws])
            st = time_calls([lambda w=w: x @ w.T for w in wb])
            report(f"fp8_gemv {mode}", f"{name} M={M} N={N} K={K}", us, nbytes_w + M * (K + N) * 2, st)
            if wg:   # the wgmma form (per-tensor scale only)
                us = time_calls([lambda w=w: fp8_wgmma(x, *w) for w in wg])
                report("fp8_wgmma", f"{name} M={M} N={N} K={K}", us, nbytes_w + M * (K + N) * 2,
                       st)
        del ws, wb, wg
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
    wts = moe_weights(E, H, inter)
    for M in (1, 4, 16, 64):
        xs = [torch.randn((M, H), device=DEV).bfloat16() for _ in range(8)]
        distinct = statistics.mean(len(set(moe_route_ref(x, wts[0], k)[0].flatten().tolist())) for x in xs)
        nbytes = E * H * 2 + (distinct + 1) * per_expert + 2 * M * H * 2
        us = time_calls([lambda x=x: moe_forward(x, *wts, top_k=k) for x in xs])
        st = time_calls([lambda x=x: moe_stock(x, *wts, k) for x in xs[:2]]) if M <= 16 else None
        report("moe_forward", f"M={M} E=256 top6 H=2560 I=768", us, nbytes, st,
               f"experts read={distinct:.1f}+1")


# ---------------------------------------------------------------- the norm fused into o_proj
def bench_fused(quick):
    """fp8_gemv_add_rms_norm (o_proj 2560x2560) against the launches it replaces (stock
    column: fp8_gemv, then add_rms_norm)."""
    H = 2560
    nsets = sets_for(H * H)
    ws = [(torch.randn((H, H), device=DEV).to(E4M3), torch.tensor([0.02], device=DEV))
          for _ in range(nsets)]
    gain = torch.ones(H, device=DEV).bfloat16()
    for M in (1, 4, 16, 64):
        x, r = (torch.randn((M, H), device=DEV).bfloat16() for _ in range(2))
        us = time_calls([lambda w=w: fp8_gemv_add_rms_norm(x, *w, r, gain) for w in ws])
        st = time_calls([lambda w=w: add_rms_norm(r, fp8_gemv(x, *w), gain) for w in ws])
        report("fp8_gemv_add_rms_norm", f"o_proj M={M} N={H} K={H}", us, H * H + 5 * M * H * 2,
               st, "stock = fp8_gemv + add_rms_norm")


# ---------------------------------------------------------------- fold
def bench_fold(quick):
    hq, hkv, blk = 20, 4, 64
    mq, mk = fold_matrices(torch.ones(128), torch.ones(128), hadamard_rotation(3))
    mq, mk = mq.to(DEV), mk.to(DEV)
    nb = 4096
    caches = [torch.zeros((nb, hkv, blk, 64), dtype=torch.uint8, device=DEV) for _ in range(2)]
    caches += [torch.zeros((nb, hkv, blk, 2), dtype=torch.float16, device=DEV) for _ in range(2)]
    for T_ in (1, 16, 64, 576):
        qkv = torch.randn((T_, hq + 2 * hkv, 128), device=DEV).bfloat16()
        q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
        slots = torch.randperm(nb * blk, device=DEV)[:T_]
        us = time_calls([lambda: qk_norm_fold_int4(q, k, v, mq, mk, slots, *caches)])
        nbytes = qkv.numel() * 2 + T_ * hq * 256 + T_ * hkv * 2 * 68 + 2 * 65536
        report("qk_norm_fold_int4", f"T={T_} Hq=20 Hkv=4", us, nbytes)
    bench_rope_write(hq, hkv)


def bench_rope_write(hq, hkv):
    """qk_norm_rope_kv_write (the FP8 layers' QK-norm + RoPE + cache write) against the two
    kernels it replaces (stock column: qk_norm_rope + fp8_kv_write)."""
    nb, blk = 4096, 16
    kc, vc = (torch.zeros((nb, blk, hkv, 128), dtype=E4M3, device=DEV) for _ in range(2))
    one = torch.ones(1, device=DEV)
    g = torch.ones(128, device=DEV).bfloat16()
    for T_ in (1, 16, 64):
        qkv = torch.randn((T_, hq + 2 * hkv, 128), device=DEV).bfloat16()
        q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
        cos, sin = (torch.rand((T_, 128), device=DEV) for _ in range(2))
        slots = torch.randperm(nb * blk, device=DEV)[:T_]

        def two():
            qo, ko = qk_norm_rope(q, k, g, g, cos, sin)
            fp8_kv_write(ko, v, slots, kc, vc, one, one)
        us = time_calls([lambda: qk_norm_rope_kv_write(q, k, v, g, g, cos, sin, slots, kc, vc,
                                                       one, one)])
        nbytes = qkv.numel() * 2 + T_ * hq * 256 + T_ * hkv * 2 * 128 + 2 * T_ * 512
        report("qk_norm_rope_kv_write", f"T={T_} Hq=20 Hkv=4", us, nbytes, time_calls([two]),
               "stock = qk_norm_rope + fp8_kv_write")



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="study,attn,gemv,moe,fused,fold")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--csv", default="")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                    help="a plugin module setting for this run, e.g. moe_experts.ALIGN_TOKENS=64")
    ap.add_argument("--ceiling", action="store_true",
                    help="each row also against the best plain read of its bytes (read_ceiling)")
    ap.add_argument("--gemv-rows", default="",
                    help="comma-separated row counts for fp8_gemv (default 1,4,16,64)")
    ap.add_argument("--attn-blocks", default="64",
                    help="comma-separated page sizes in tokens for the attention grid (the "
                         "runtime's default is 16)")
    args = ap.parse_args()
    PT.CEILING = args.ceiling
    global ATTN_BLOCKS
    ATTN_BLOCKS = tuple(int(v) for v in args.attn_blocks.split(","))
    if args.gemv_rows:
        global GEMV_ROWS
        GEMV_ROWS = tuple(int(v) for v in args.gemv_rows.split(","))
    apply_settings(args.set)
    if args.quick:
        PT.ITERS, PT.REPEATS = 10, 3  # read by time_calls when it runs
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
                 "fp8": bench_fp8, "nvfp4": bench_nvfp4,
                 "moe": bench_moe, "fused": bench_fused, "fold": bench_fold,
                 "sliding": bench_sliding, "sweep": bench_sweep,
                 "splitk": lambda q: (sweep_fp8_gemv(q), sweep_moe(q)),
                 "splitk_gemv": sweep_fp8_gemv, "splitk_moe": sweep_moe,
                 "moe_tiles": sweep_moe_tiles}[sec](args.quick)
        except Exception:  # keep the other sections' numbers
            traceback.print_exc()
        torch.cuda.empty_cache()
        print(f"-- {sec}: {time.time() - t0:.1f} s", flush=True)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("kernel,shape,us,MB,TBs,pct_bw,stock_us,read_ceiling_us,note\n")
            for r in ROWS:
                f.write(f"{r['kernel']},{r['shape']},{r['us']:.2f},{r['MB']:.3f},{r['TBs']:.3f},"
                        f"{r['pct']:.1f},{r['stock_us'] or ''},{r['ceiling_us'] or ''},"
                        f"{r['note']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
