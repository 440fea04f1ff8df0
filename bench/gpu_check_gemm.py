"""gpu_check sections nvfp4, nvfp4wg, fp8wg, fp8gemv, fp8fused, moe, moepf, splitk: the GEMV kernels
(NVFP4 and FP8 on mma.sync and on wgmma; FP8 with its fused norm prologue / SwiGLU, silu,
residual epilogues / row gather) and the MoE experts (split-K too) against their references,
CUDA graph replay, batch invariance. Run through bench/gpu_check.py."""

from __future__ import annotations

import gpu_check_base as B
import torch
from gpu_check_base import TOL, check_graph, record
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.fp8_gemv import Fusion, fp8_gemv, fp8_gemv_ref
from kolibri_trt_plugins.fp8_wgmma import FIXUP_ROWS, fp8_wgmma
from kolibri_trt_plugins.fp8_wgmma import to_wgmma_storage as fp8_to_wgmma
from kolibri_trt_plugins.moe import moe_forward, moe_forward_ref
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv, nvfp4_gemv_ref
from kolibri_trt_plugins.nvfp4_wgmma import nvfp4_wgmma, to_wgmma_storage


# ---------------------------------------------------------------- GEMV
def check_gemv_invariance(name, fn, x, ms=(1, 3, 16)):
    """Row 0 of fn(x[:m]) for each m in ms equals row 0 of fn(x), bit for bit."""
    full = fn(x)
    bad = [m for m in ms if not torch.equal(fn(x[:m].contiguous())[0], full[0])]
    label = ",".join(map(str, ms))
    record(name + " batch invariance", not bad,
           f"bit-identical (M={label} vs {x.shape[0]})" if not bad else f"DIFFERS at M={bad}")


def check_nvfp4(g, small):
    shapes = [(1, 131072, 2560), (3, 511, 2560), (33, 60614, 2560), (64, 1, 64), (65, 33, 128)]
    if small:
        shapes = [(1, 33, 64), (3, 511, 256), (65, 33, 128)]
    for M, N, K in shapes:
        x = T.randn((M, K), g, device=B.DEV)
        w = T.nvfp4_weight(N, K, g, device=B.DEV)
        out = nvfp4_gemv(x, *w)
        e = T.rel_err(out, nvfp4_gemv_ref(x, *w))
        msg = f"rel={e:.2e} " + check_graph(f"nvfp4 {M}x{K}x{N}", lambda: nvfp4_gemv(x, *w), out)
        record(f"nvfp4 M={M} N={N} K={K}", e < TOL["gemv"], msg)
    x = T.randn((64, 2560), g, device=B.DEV)
    w = T.nvfp4_weight(4096, 2560, g, device=B.DEV)
    check_gemv_invariance("nvfp4", lambda xx: nvfp4_gemv(xx, *w), x)


def check_fp8_wgmma(g, small):
    """fp8_wgmma (Gluon, sm_90) against fp8_gemv_ref on W in ModelOpt's order: QKV and o_proj
    (4 / 5 K ranges, FIXUP to FIXUP_ROWS rows, the reduce launch past) and a one-range shape,
    odd row counts; graphs; row 0 alone and across the FIXUP boundary against 144 rows."""
    shapes = [(1, 3584, 2560), (3, 2560, 2560), (16, 3584, 2560), (17, 2560, 2560),
              (80, 3584, 2560), (144, 2560, 2560), (33, 192, 384)]
    if small:
        shapes = [(1, 64, 128), (17, 128, 256), (33, 192, 384)]
    for M, N, K in shapes:
        x = T.randn((M, K), g, device=B.DEV)
        w, s = T.fp8_weight(N, K, "tensor", g, device=B.DEV)
        stored = fp8_to_wgmma(w)
        out = fp8_wgmma(x, stored, s)
        e = T.rel_err(out, fp8_gemv_ref(x, w, s))
        msg = f"rel={e:.2e} " + check_graph(f"fp8_wgmma {M}x{K}x{N}",
                                            lambda: fp8_wgmma(x, stored, s), out)
        record(f"fp8_wgmma M={M} N={N} K={K}", e < TOL["gemv"], msg)
    for N, K in ((3584, 2560), (2560, 2560)):
        x = T.randn((144, K), g, device=B.DEV)
        w, s = T.fp8_weight(N, K, "tensor", g, device=B.DEV)
        stored = fp8_to_wgmma(w)
        check_gemv_invariance(f"fp8_wgmma {N}x{K}", lambda xx: fp8_wgmma(xx, stored, s), x,
                              ms=(1, 3, FIXUP_ROWS, FIXUP_ROWS + 1, 64, 80, 128))


def check_nvfp4_wgmma(g, small):
    """nvfp4_wgmma (Gluon, sm_90) against nvfp4_gemv_ref on the weight in ModelOpt's order, at
    odd row counts (one to three row launches), N not a multiple of 64; graphs; invariance."""
    shapes = [(1, 131072, 2560), (3, 511, 2560), (33, 60614, 2560), (80, 77, 256),
              (144, 4096, 2560), (17, 1, 512)]
    if small:
        shapes = [(1, 33, 256), (3, 511, 256), (80, 17, 512)]
    for M, N, K in shapes:
        x = T.randn((M, K), g, device=B.DEV)
        w, ws, ws2 = T.nvfp4_weight(N, K, g, device=B.DEV)
        stored = to_wgmma_storage(w)
        out = nvfp4_wgmma(x, stored, ws, ws2)
        e = T.rel_err(out, nvfp4_gemv_ref(x, w, ws, ws2))
        msg = f"rel={e:.2e} " + check_graph(f"nvfp4_wgmma {M}x{K}x{N}",
                                            lambda: nvfp4_wgmma(x, stored, ws, ws2), out)
        record(f"nvfp4_wgmma M={M} N={N} K={K}", e < TOL["gemv"], msg)
    x = T.randn((144, 2560), g, device=B.DEV)
    w, ws, ws2 = T.nvfp4_weight(4096, 2560, g, device=B.DEV)
    stored = to_wgmma_storage(w)
    check_gemv_invariance("nvfp4_wgmma", lambda xx: nvfp4_wgmma(xx, stored, ws, ws2), x,
                          ms=(1, 3, 16, 64, 80, 128))


def check_fp8gemv(g, small):
    shapes = [(1, 2560, 2560), (3, 511, 768), (33, 3584, 2560), (64, 33, 64), (65, 7, 128)]
    if small:
        shapes = [(1, 33, 64), (3, 70, 128), (65, 7, 128)]
    for mode in ("tensor", "channel", "block"):
        for M, N, K in shapes + ([(5, 37, 33)] if mode != "block" else []):
            x = T.randn((M, K), g, device=B.DEV)
            w = T.fp8_weight(N, K, mode, g, device=B.DEV)
            out = fp8_gemv(x, *w)
            e = T.rel_err(out, fp8_gemv_ref(x, *w))
            msg = f"rel={e:.2e} " + check_graph(f"fp8 {mode}", lambda: fp8_gemv(x, *w), out)
            record(f"fp8gemv {mode} M={M} N={N} K={K}", e < TOL["gemv"], msg)
        # o_proj and QKV (fp8_gemv.K_BLOCKS_BY_SHAPE) through every form: swapped, wide, 16-row
        x = T.randn((160, 2560), g, device=B.DEV)
        for n in (2560, 3584):
            w = T.fp8_weight(n, 2560, mode, g, device=B.DEV)
            check_gemv_invariance(f"fp8gemv {mode} N={n}", lambda xx: fp8_gemv(xx, *w), x,
                                  ms=(1, 3, 16, 33, 64, 128, 144))


FUSED_CASES = [  # (name, Fusion keyword flags): what the drafter fuses around its linears
    ("norm", dict(norm=1)), ("norm+swiglu", dict(norm=1, act="swiglu")),
    ("silu", dict(act="silu")), ("residual", dict(residual=True)),
    ("residual+silu", dict(residual=True, act="silu")), ("norm x3 segments", dict(norm=3)),
    ("x_rows", dict(x_rows=True)), ("x_rows+norm+silu", dict(x_rows=True, norm=1, act="silu")),
]


def _fusion(opts, M, N, K, g):
    """The Fusion of `opts` (flags -> tensors on B.DEV) for [M, K] inputs and N weight rows, and
    the x the call takes (a 97-row table when the rows are gathered)."""
    x = T.randn((97 if opts.get("x_rows") else M, K), g, device=B.DEV)
    kw = {"act": opts.get("act", "none")}
    if opts.get("norm"):
        kw["norm"] = (1 + 0.5 * T.randn((K,), g).float()).to(torch.bfloat16).to(B.DEV)
        kw["norm_segments"] = opts["norm"]
    if opts.get("residual"):
        kw["residual"] = T.randn((M, N), g, device=B.DEV)
    if opts.get("x_rows"):
        kw["x_rows"] = torch.randint(0, 97, (M,), generator=g).to(B.DEV)
    return x, Fusion(**kw)


def check_fp8fused(g, small):
    """fp8_gemv's fused options (block-FP8, the drafter's format) vs the torch composition they
    replace, over odd sizes, split-K 1 and 2, CUDA graphs replayed twice; batch invariance."""
    import importlib
    mod = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    shapes = [(1, 34, 64), (4, 1024, 256), (33, 66, 768)] if small else \
        [(1, 34, 64), (4, 1024, 256), (4, 768, 768), (33, 66, 768), (64, 5120, 2560)]
    saved = mod.SPLIT_K
    try:
        for split in (1, 2):
            mod.SPLIT_K = split
            for name, opts in FUSED_CASES:
                for M, N, K in shapes:
                    if K % opts.get("norm", 1):
                        continue      # segments must divide K
                    x, f = _fusion(opts, M, N, K, g)
                    w = T.fp8_weight(N, K, "block", g, device=B.DEV)
                    out = fp8_gemv(x, *w, **f._asdict())
                    e = T.rel_err(out, fp8_gemv_ref(x, *w, f))
                    msg = f"rel={e:.2e} " + check_graph(
                        f"fp8fused {name}", lambda: fp8_gemv(x, *w, **f._asdict()), out)
                    record(f"fp8fused {name} S={split} M={M} N={N} K={K}", e < TOL["gemv"], msg)
    finally:
        mod.SPLIT_K = saved
    x, f = _fusion(dict(norm=1, act="swiglu"), 64, 1024, 256, g)
    w = T.fp8_weight(1024, 256, "block", g, device=B.DEV)
    check_gemv_invariance("fp8fused norm+swiglu",
                          lambda xx: fp8_gemv(xx, *w, norm=f.norm, act="swiglu"), x)


# ---------------------------------------------------------------- MoE
def check_moe(g, small):
    """moe_forward against its reference (graphs replayed), batch invariance, and chunks of
    MAX_TOKENS (one unit per expert, the shared expert in 64-token groups) against chunks of
    64 (one unit per pair): the same bits."""
    import importlib
    me = importlib.import_module("kolibri_trt_plugins.moe_experts")
    cfgs = [("small", 8, 256, 128, 128, 2, (1, 3, 33, 70, 200)),
            ("small-noshared", 8, 256, 128, 0, 2, (3, 130))]
    if not small:
        cfgs.append(("full", 256, 2560, 768, 768, 6, (1, 16, 64, 130)))
    for label, E, H, I_, Is, k, Ms in cfgs:
        wts = T.moe_weights(E, H, I_, Is, g, device=B.DEV)
        for M in Ms:
            x = T.randn((M, H), g, device=B.DEV)
            out = moe_forward(x, *wts, top_k=k)
            e = T.rel_err(out, moe_forward_ref(x, *wts, top_k=k))
            msg = f"rel={e:.2e} " + check_graph(f"moe {label}", lambda: moe_forward(x, *wts, top_k=k), out)
            record(f"moe {label} E={E} H={H} I={I_} top{k} M={M}", e < TOL["moe"], msg)
        x = T.randn((max(Ms), H), g, device=B.DEV)
        check_gemv_invariance(f"moe {label}", lambda xx: moe_forward(xx, *wts, top_k=k), x)
        want = moe_forward(x, *wts, top_k=k)
        saved = me.MAX_TOKENS, me.BY_EXPERT_TOKENS, me.ALIGN_TOKENS
        try:   # chunks of 64, (token, slot) units scanning ids: the layout before 2026-12-01e
            me.MAX_TOKENS, me.BY_EXPERT_TOKENS, me.ALIGN_TOKENS = 64, 1 << 30, 1 << 30
            same = torch.equal(moe_forward(x, *wts, top_k=k), want)
        finally:
            me.MAX_TOKENS, me.BY_EXPERT_TOKENS, me.ALIGN_TOKENS = saved
        record(f"moe {label} chunks of {saved[0]} = chunks of 64 (M={x.shape[0]})", same,
               "bit-identical" if same else "DIFFERS")


def check_moe_prefetch(g, small):
    """The MoE with its experts' weights asked of L2 by the top-k kernel (moe_route.PREFETCH 1,
    2 and 3, chunks up to 4 tokens), and with a next layer's QKV weight asked for by its
    combine kernel (moe.PREFETCH_NEXT_TOKENS): the bits of the prefetch off, eager and in a
    CUDA graph replayed twice."""
    import importlib
    rt = importlib.import_module("kolibri_trt_plugins.moe_route")
    mo = importlib.import_module("kolibri_trt_plugins.moe")
    E, H, I_, Is, k = (8, 256, 128, 128, 2) if small else (256, 2560, 768, 768, 6)
    full = T.moe_weights(E, H, I_, Is, g, device=B.DEV)
    nxt = T.randn((3584 if not small else 96, H), g, device=B.DEV).to(torch.float8_e4m3fn)
    saved, saved_next = (rt.PREFETCH_TOKENS, rt.PREFETCH), mo.PREFETCH_NEXT_TOKENS
    try:
        for M, wts, label in ((1, full, ""), (2, full, ""), (4, full, ""),
                              (1, full[:5], " no shared expert")):
            x = T.randn((M, H), g, device=B.DEV)
            rt.PREFETCH_TOKENS = 0
            want = moe_forward(x, *wts, top_k=k)
            for mode in (1, 2, 3):
                rt.PREFETCH_TOKENS, rt.PREFETCH = 4, mode
                got = moe_forward(x, *wts, top_k=k)
                ok = torch.equal(got, want)
                msg = ("bit-identical " if ok else "DIFFERS ") + check_graph(
                    "moe prefetch", lambda: moe_forward(x, *wts, top_k=k), want)
                record(f"moe prefetch PREFETCH={mode} E={E} H={H} M={M}{label} = off", ok, msg)
            rt.PREFETCH_TOKENS = 0
            mo.PREFETCH_NEXT_TOKENS = 4   # the next layer's QKV weight from the combine kernel
            got = moe_forward(x, *wts, top_k=k, prefetch_next=nxt)
            ok = torch.equal(got, want)
            msg = ("bit-identical " if ok else "DIFFERS ") + check_graph(
                "moe prefetch_next", lambda: moe_forward(x, *wts, top_k=k, prefetch_next=nxt),
                want)
            record(f"moe prefetch_next {tuple(nxt.shape)} E={E} H={H} M={M}{label} = off", ok,
                   msg)
            mo.PREFETCH_NEXT_TOKENS = 0
    finally:
        rt.PREFETCH_TOKENS, rt.PREFETCH = saved
        mo.PREFETCH_NEXT_TOKENS = saved_next


def check_split_k(g, small):
    """fp8_gemv and the MoE experts with K split (SPLIT_K > 1; the default 1 is checked above):
    against the reference, CUDA graph replay, batch invariance."""
    import importlib
    f8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
    me = importlib.import_module("kolibri_trt_plugins.moe_experts")
    saved = (f8.SPLIT_K, me.SPLIT_K_GATED, me.SPLIT_K_DOWN)
    shapes = [(1, 3584, 2560), (16, 2560, 2560), (64, 7680, 2560), (33, 97, 272)]
    if small:
        shapes = [(1, 33, 512), (3, 70, 768), (5, 7, 272)]
    try:
        for S in (2, 3, 5):
            f8.SPLIT_K = S
            for mode in ("tensor", "channel", "block"):
                for M, N, K in shapes:
                    if mode == "block" and K % 64:
                        continue
                    x = T.randn((M, K), g, device=B.DEV)
                    w = T.fp8_weight(N, K, mode, g, device=B.DEV)
                    out = fp8_gemv(x, *w)
                    e = T.rel_err(out, fp8_gemv_ref(x, *w))
                    msg = f"rel={e:.2e} " + check_graph("fp8 split", lambda: fp8_gemv(x, *w), out)
                    record(f"fp8gemv SPLIT_K={S} {mode} M={M} N={N} K={K}", e < TOL["gemv"], msg)
                x = T.randn((64, 2560), g, device=B.DEV)
                w = T.fp8_weight(2560, 2560, mode, g, device=B.DEV)
                check_gemv_invariance(f"fp8gemv SPLIT_K={S} {mode}", lambda xx: fp8_gemv(xx, *w), x)
        E, H, I_, Is, k, Ms = ((8, 512, 96, 160, 2, (1, 3)) if small else
                               (256, 2560, 768, 768, 6, (1, 16, 64)))
        wts = T.moe_weights(E, H, I_, Is, g, device=B.DEV)
        for sg, sd in ((2, 3), (5, 2)):
            me.SPLIT_K_GATED, me.SPLIT_K_DOWN = sg, sd
            for M in Ms:
                x = T.randn((M, H), g, device=B.DEV)
                out = moe_forward(x, *wts, top_k=k)
                e = T.rel_err(out, moe_forward_ref(x, *wts, top_k=k))
                run = lambda: moe_forward(x, *wts, top_k=k)  # noqa: E731
                msg = f"rel={e:.2e} " + check_graph("moe split", run, out)
                record(f"moe SPLIT_K={sg},{sd} E={E} H={H} I={I_} top{k} M={M}", e < TOL["moe"], msg)
            x = T.randn((max(Ms), H), g, device=B.DEV)
            check_gemv_invariance(f"moe SPLIT_K={sg},{sd}",
                                  lambda xx: moe_forward(xx, *wts, top_k=k), x)
            for M in (1, 4, 9, 16):   # the sum in the launch (FIXUP_TOKENS) against the combine's
                x = T.randn((M, H), g, device=B.DEV)
                fixed = moe_forward(x, *wts, top_k=k)
                fixup_tokens, me.FIXUP_TOKENS = me.FIXUP_TOKENS, 0
                try:
                    combined = moe_forward(x, *wts, top_k=k)
                finally:
                    me.FIXUP_TOKENS = fixup_tokens
                record(f"moe SPLIT_K={sg},{sd} M={M}: summed in the launch == combine launch",
                       torch.equal(fixed, combined), "")
    finally:
        f8.SPLIT_K, me.SPLIT_K_GATED, me.SPLIT_K_DOWN = saved

