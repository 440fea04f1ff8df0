#!/usr/bin/env python3
"""All-in-one H200 check of kolibri_trt_plugins: every op against its torch reference (fp32 on
the GPU), eager and inside a CUDA graph replayed twice (bit-identical to eager), and batch
invariance (a row computed alone equals the same row inside a larger batch, bit for bit).

    python3 bench/gpu_check.py [--only fold,int4,fp8attn,nvfp4,fp8gemv,moe,moecompact,splitk,norm,qknorm,gumbel] [--log FILE]
    python3 bench/gpu_check.py --device cpu --small     # dry run of the script on the ref path

Exit status 1 if any check fails. Tolerances: see TOL.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import traceback

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_plugins():
    """import kolibri_trt_plugins, mapped onto ./plugins when the repo is not pip-installed
    (`standalone.py`)."""
    import standalone  # noqa: F401
    import kolibri_trt_plugins
    return kolibri_trt_plugins


load_plugins()
from kolibri_trt_plugins import testing as T  # noqa: E402
from kolibri_trt_plugins.add_rms_norm import add_rms_norm, add_rms_norm_ref  # noqa: E402
from kolibri_trt_plugins.fp8_gemv import fp8_gemv, fp8_gemv_ref  # noqa: E402
from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention, fp8_paged_attention_ref  # noqa: E402
from kolibri_trt_plugins.gumbel_argmax import (gumbel_argmax, gumbel_argmax_ref,  # noqa: E402
                                               gumbel_bits_ref, gumbel_noise_debug,
                                               gumbel_noise_ref)
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention, int4_paged_attention_ref  # noqa: E402
from kolibri_trt_plugins.moe import moe_forward, moe_forward_ref  # noqa: E402
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv, nvfp4_gemv_ref  # noqa: E402
from kolibri_trt_plugins.qk_norm_fold_int4 import (dequantize_int4_ref, fold_matrices,  # noqa: E402
                                                   hadamard_rotation, qk_norm_fold_int4,
                                                   qk_norm_fold_int4_ref)
from kolibri_trt_plugins.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref  # noqa: E402

TOL = {  # relative error vs the fp32 reference
    "attn": 1e-2,   # bf16 output (2^-9) + fp16 P·V operands; measured ~4e-3
    "gemv": 1e-2,   # bf16 output rounding; products are exact, fp32 sums in another order
    "moe": 2e-2,    # bf16 intermediate activation may round differently, then bf16 output
    "fold_q": 1e-2,  # bf16 output of an fp32 128x128 product
    "norm": 4e-3,   # bf16 outputs; fp32 sum order of mean(x²) (and rsqrt's last bit) may differ
}
CODE_FLIP_FRAC = 1e-3  # INT4 codes may differ by one step at rounding boundaries (fp32 order)
NORM_FLIP_FRAC = 2e-2  # norm outputs may move by one bf16 ulp at rounding boundaries (sum order)
GUMBEL_FLIP_FRAC = 0.0  # sampled ids: IEEE div as torch; tl.log is libdevice logf (FTZ build)

RESULTS: list[tuple[str, bool, str]] = []
DEV = "cuda"
GRAPHS = True


def record(name, ok, msg):
    RESULTS.append((name, bool(ok), msg))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)


def graph_replay(fn):
    """Capture fn() in a CUDA graph, replay twice; return the two replays' outputs (cloned)."""
    if not GRAPHS:
        return None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    res = []
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        res.append([o.clone() for o in (out if isinstance(out, (tuple, list)) else [out])])
    return res


def same(a, b):
    return all(torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x, y.view(torch.uint8)
               if y.dtype.itemsize == 1 else y) for x, y in zip(a, b))


def check_graph(name, fn, eager):
    reps = graph_replay(fn)
    if reps is None:
        return "graph=skipped"
    eager = eager if isinstance(eager, (tuple, list)) else [eager]
    ok = same(reps[0], eager) and same(reps[1], eager)
    if not ok:
        record(name + " graph", False, "CUDA graph replay differs from eager")
    return "graph=ok" if ok else "graph=DIFF"


# ---------------------------------------------------------------- fold
def fold_case(T_, blk, g, hq=20, hkv=4):
    nb = T.cdiv(max(T_, 1) * 2, blk) + 2
    q = T.randn((T_, hq, 128), g, device=DEV, scale=3.0)
    k = T.randn((T_, hkv, 128), g, device=DEV, scale=3.0)
    v = T.randn((T_, hkv, 128), g, device=DEV)
    mq, mk = fold_matrices(1 + 0.1 * torch.randn(128, generator=g), 1 + 0.1 * torch.randn(128, generator=g),
                           hadamard_rotation(7), 128 ** -0.5)
    slots = torch.randperm(nb * blk, generator=g)[:T_]
    if T_ > 2:
        slots[1] = -1
    caches = [torch.zeros((nb, blk, hkv, 64), dtype=torch.uint8, device=DEV) for _ in range(2)]
    caches += [torch.zeros((nb, blk, hkv, 2), dtype=torch.float16, device=DEV) for _ in range(2)]
    return q, k, v, mq.to(DEV), mk.to(DEV), slots.to(DEV), caches


def check_fold(g):
    for blk in (16, 64):
        for T_ in (1, 3, 33, 576):
            name = f"fold blk={blk} T={T_}"
            q, k, v, mq, mk, slots, caches = fold_case(T_, blk, g)
            ref_c = [c.clone() for c in caches]
            qo = qk_norm_fold_int4(q, k, v, mq, mk, slots, *caches)
            qr = qk_norm_fold_int4_ref(q, k, v, mq, mk, slots, *ref_c, 1e-6)
            e_q = T.rel_err(qo, qr)
            flips = sum(int((a != b).sum()) for a, b in zip(caches[:2], ref_c[:2]))
            frac = flips / max(1, caches[0].numel() * 2)
            deq = [(dequantize_int4_ref(caches[i], caches[i + 2]) -
                    dequantize_int4_ref(ref_c[i], ref_c[i + 2])).abs().max().item() for i in (0, 1)]
            step = max(ref_c[2][..., 0].float().max().item(), ref_c[3][..., 0].float().max().item())
            msg = f"q rel={e_q:.2e} code flips={frac:.1e} max dequant diff={max(deq):.3g} (step<={step:.3g})"
            cg = [c.clone() for c in caches]
            msg += " " + check_graph(name, lambda: [qk_norm_fold_int4(q, k, v, mq, mk, slots, *cg)] + cg,
                                     [qo] + caches)
            record(name, e_q < TOL["fold_q"] and frac < CODE_FLIP_FRAC and max(deq) <= step * 1.01 + 1e-3,
                   msg)
    # batch invariance: token 0 alone vs inside a batch of 16
    q, k, v, mq, mk, slots, caches = fold_case(16, 16, g)
    c1 = [c.clone() for c in caches]
    qb = qk_norm_fold_int4(q, k, v, mq, mk, slots, *caches)
    q1 = qk_norm_fold_int4(q[:1], k[:1], v[:1], mq, mk, slots[:1], *c1)
    s0 = int(slots[0])
    ok = torch.equal(qb[0], q1[0]) and all(torch.equal(a.view(-1, *a.shape[2:])[s0], b.view(-1, *b.shape[2:])[s0])
                                           for a, b in zip(caches, c1))
    record("fold batch invariance 1 vs 16", ok, "bit-identical" if ok else "DIFFERS")


# ---------------------------------------------------------------- attention
def attn_inputs(kind, seq_lens, q_lens, blk, g, hq=20, hkv=4):
    bt, sl, cu, nb = T.paged_layout(seq_lens, q_lens, blk, g, device=DEV)
    q = T.randn((sum(q_lens), hq, 128), g, device=DEV)
    if kind == "int4":
        cache = T.int4_cache(nb, blk, hkv, g, device=DEV)
    else:
        cache = T.fp8_cache(nb, blk, hkv, g, device=DEV) + (
            torch.tensor([0.7], device=DEV), torch.tensor([1.3], device=DEV))
    return q, cache, bt, sl, cu


def run_attn(kind, q, cache, bt, sl, cu, window, ref=False, bounds=None):
    """bounds = (max_seq_len, max_q_len): pass them when capturing (no host sync allowed)."""
    mx, mq = bounds if bounds else (int(sl.max()), int((cu[1:] - cu[:-1]).max()))
    if kind == "int4":
        if ref:
            return int4_paged_attention_ref(q, *cache, bt, sl, cu, 128 ** -0.5, window)
        return int4_paged_attention(q, *cache, bt, sl, cu, mx, mq, window=window)
    if ref:
        return fp8_paged_attention_ref(q, *cache, bt, sl, cu, 128 ** -0.5, window)
    return fp8_paged_attention(q, *cache, bt, sl, cu, mx, mq, window=window)


def attn_cases(small):
    dec = [1, 3, 33, 511, 4097] if not small else [1, 3, 33, 130]
    ver_s = [9, 40, 600, 2049] if not small else [9, 40, 200]
    ver_q = [9, 1, 5, 8][: len(ver_s)]
    return [("decode", dec, [1] * len(dec)), ("verify", ver_s, ver_q)]


def check_attention(kind, g, small):
    windows = (0, 513) if kind == "int4" else (513, 0)
    for blk in (16, 64):
        for label, seqs, qls in attn_cases(small):
            for window in windows:
                name = f"{kind} attn blk={blk} {label} window={window}"
                q, cache, bt, sl, cu = attn_inputs(kind, seqs, qls, blk, g)
                out = run_attn(kind, q, cache, bt, sl, cu, window)
                ref = run_attn(kind, q, cache, bt, sl, cu, window, ref=True)
                e = T.rel_err(out, ref)
                # a graph captured for a larger bucket (more splits, row tiles) must give the same bits
                bd = (int(sl.max()) + 777, 9)
                btp = torch.cat([bt, torch.zeros((bt.shape[0], 777 // blk + 1), dtype=bt.dtype,
                                                 device=DEV)], 1)
                msg = f"rel={e:.2e} " + check_graph(
                    name, lambda: run_attn(kind, q, cache, btp, sl, cu, window, bounds=bd), out)
                record(name, e < TOL["attn"], msg)
    check_attention_invariance(kind, g, small)


def check_attention_invariance(kind, g, small):
    n = 16
    seqs = [int(x) for x in torch.randint(9, 1500 if not small else 200, (n,), generator=g)]
    for qlab, qls in (("decode", [1] * n), ("verify", [int(x) for x in torch.randint(1, 10, (n,), generator=g)])):
        for window in ((0,) if kind == "int4" else (513, 0)):
            q, cache, bt, sl, cu = attn_inputs(kind, seqs, qls, 16, g)
            full = run_attn(kind, q, cache, bt, sl, cu, window)
            ok = True
            for s in (0, 7, 15):
                q0, q1 = int(cu[s]), int(cu[s + 1])
                one = run_attn(kind, q[q0:q1].contiguous(), cache, bt[s:s + 1].contiguous(), sl[s:s + 1].contiguous(),
                               torch.tensor([0, q1 - q0], dtype=torch.int32, device=DEV), window)
                ok &= torch.equal(one, full[q0:q1])
            record(f"{kind} attn batch invariance {qlab} window={window} 1 vs 16", ok,
                   "bit-identical" if ok else "DIFFERS")


def check_int4_noasm(g, small):
    """The plain-Triton nibble decode (USE_ASM=False) must also pass (it is the fallback)."""
    mod = sys.modules["kolibri_trt_plugins.int4_paged_attention"]
    mod.USE_ASM = False
    try:
        for label, seqs, qls in attn_cases(small):
            q, cache, bt, sl, cu = attn_inputs("int4", seqs, qls, 64, g)
            e = T.rel_err(run_attn("int4", q, cache, bt, sl, cu, 0),
                          run_attn("int4", q, cache, bt, sl, cu, 0, ref=True))
            record(f"int4 attn USE_ASM=False blk=64 {label}", e < TOL["attn"], f"rel={e:.2e}")
    finally:
        mod.USE_ASM = True


# ---------------------------------------------------------------- GEMV
def check_gemv_invariance(name, fn, x):
    full = fn(x)
    ok = all(torch.equal(fn(x[:m].contiguous())[0], full[0]) for m in (1, 3, 16))
    record(name + " batch invariance", ok, "bit-identical (M=1,3,16 vs %d)" % x.shape[0] if ok else "DIFFERS")


def check_nvfp4(g, small):
    shapes = [(1, 131072, 2560), (3, 511, 2560), (33, 60614, 2560), (64, 1, 64), (65, 33, 128)]
    if small:
        shapes = [(1, 33, 64), (3, 511, 256), (65, 33, 128)]
    for M, N, K in shapes:
        x = T.randn((M, K), g, device=DEV)
        w = T.nvfp4_weight(N, K, g, device=DEV)
        out = nvfp4_gemv(x, *w)
        e = T.rel_err(out, nvfp4_gemv_ref(x, *w))
        msg = f"rel={e:.2e} " + check_graph(f"nvfp4 {M}x{K}x{N}", lambda: nvfp4_gemv(x, *w), out)
        record(f"nvfp4 M={M} N={N} K={K}", e < TOL["gemv"], msg)
    x = T.randn((64, 2560), g, device=DEV)
    w = T.nvfp4_weight(4096, 2560, g, device=DEV)
    check_gemv_invariance("nvfp4", lambda xx: nvfp4_gemv(xx, *w), x)


def check_fp8gemv(g, small):
    shapes = [(1, 2560, 2560), (3, 511, 768), (33, 3584, 2560), (64, 33, 64), (65, 7, 128)]
    if small:
        shapes = [(1, 33, 64), (3, 70, 128), (65, 7, 128)]
    for mode in ("tensor", "channel", "block"):
        for M, N, K in shapes + ([(5, 37, 33)] if mode != "block" else []):
            x = T.randn((M, K), g, device=DEV)
            w = T.fp8_weight(N, K, mode, g, device=DEV)
            out = fp8_gemv(x, *w)
            e = T.rel_err(out, fp8_gemv_ref(x, *w))
            msg = f"rel={e:.2e} " + check_graph(f"fp8 {mode}", lambda: fp8_gemv(x, *w), out)
            record(f"fp8gemv {mode} M={M} N={N} K={K}", e < TOL["gemv"], msg)
        x = T.randn((64, 2560), g, device=DEV)
        w = T.fp8_weight(2560, 2560, mode, g, device=DEV)
        check_gemv_invariance(f"fp8gemv {mode}", lambda xx: fp8_gemv(xx, *w), x)


# ---------------------------------------------------------------- MoE
def check_moe(g, small):
    cfgs = [("small", 8, 256, 128, 128, 2, (1, 3, 33, 70)), ("small-noshared", 8, 256, 128, 0, 2, (3,))]
    if not small:
        cfgs.append(("full", 256, 2560, 768, 768, 6, (1, 16, 64)))
    for label, E, H, I_, Is, k, Ms in cfgs:
        wts = T.moe_weights(E, H, I_, Is, g, device=DEV)
        for M in Ms:
            x = T.randn((M, H), g, device=DEV)
            out = moe_forward(x, *wts, top_k=k)
            e = T.rel_err(out, moe_forward_ref(x, *wts, top_k=k))
            msg = f"rel={e:.2e} " + check_graph(f"moe {label}", lambda: moe_forward(x, *wts, top_k=k), out)
            record(f"moe {label} E={E} H={H} I={I_} top{k} M={M}", e < TOL["moe"], msg)
        x = T.randn((max(Ms), H), g, device=DEV)
        check_gemv_invariance(f"moe {label}", lambda xx: moe_forward(xx, *wts, top_k=k), x)


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
                    x = T.randn((M, K), g, device=DEV)
                    w = T.fp8_weight(N, K, mode, g, device=DEV)
                    out = fp8_gemv(x, *w)
                    e = T.rel_err(out, fp8_gemv_ref(x, *w))
                    msg = f"rel={e:.2e} " + check_graph("fp8 split", lambda: fp8_gemv(x, *w), out)
                    record(f"fp8gemv SPLIT_K={S} {mode} M={M} N={N} K={K}", e < TOL["gemv"], msg)
                x = T.randn((64, 2560), g, device=DEV)
                w = T.fp8_weight(2560, 2560, mode, g, device=DEV)
                check_gemv_invariance(f"fp8gemv SPLIT_K={S} {mode}", lambda xx: fp8_gemv(xx, *w), x)
        E, H, I_, Is, k, Ms = ((8, 512, 96, 160, 2, (1, 3)) if small else
                               (256, 2560, 768, 768, 6, (1, 16, 64)))
        wts = T.moe_weights(E, H, I_, Is, g, device=DEV)
        for sg, sd in ((2, 3), (5, 2)):
            me.SPLIT_K_GATED, me.SPLIT_K_DOWN = sg, sd
            for M in Ms:
                x = T.randn((M, H), g, device=DEV)
                out = moe_forward(x, *wts, top_k=k)
                e = T.rel_err(out, moe_forward_ref(x, *wts, top_k=k))
                run = lambda: moe_forward(x, *wts, top_k=k)  # noqa: E731
                msg = f"rel={e:.2e} " + check_graph("moe split", run, out)
                record(f"moe SPLIT_K={sg},{sd} E={E} H={H} I={I_} top{k} M={M}", e < TOL["moe"], msg)
            x = T.randn((max(Ms), H), g, device=DEV)
            check_gemv_invariance(f"moe SPLIT_K={sg},{sd}",
                                  lambda xx: moe_forward(xx, *wts, top_k=k), x)
    finally:
        f8.SPLIT_K, me.SPLIT_K_GATED, me.SPLIT_K_DOWN = saved


def check_moe_compact(g, small):
    """The MoE experts walking the work list (moe_experts.COMPACT_UNITS; plugins/moe_units.py):
    the list against its reference, the output bit-identical to the per-unit launch, against
    the reference, CUDA graph replay, batch invariance; 1, 64 and 128 programs, split-K too."""
    import importlib
    me = importlib.import_module("kolibri_trt_plugins.moe_experts")
    from kolibri_trt_plugins.moe_units import moe_units, moe_units_ref
    for M, k, E in ((1, 6, 256), (16, 6, 256), (64, 6, 256), (64, 6, 8), (33, 5, 300)):
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).int().to(DEV)
        units, count = moe_units(ids)
        want, n = moe_units_ref(ids.cpu())
        ok = int(count[0]) == n and torch.equal(units[:n].cpu(), want)
        record(f"moe_units M={M} k={k} E={E}", ok, f"count={int(count[0])} want {n}")
    saved = (me.COMPACT_UNITS, me.UNIT_PROGRAMS, me.SPLIT_K_GATED)
    E, H, I_, Is, k, Ms = ((8, 512, 96, 160, 2, (1, 3, 33, 70)) if small else
                           (256, 2560, 768, 768, 6, (1, 3, 16, 64, 70)))
    wts = T.moe_weights(E, H, I_, Is, g, device=DEV)
    try:
        for programs, sg in ((64, 1), (1, 1), (128, 1), (64, 2)):
            tag = f"moe COMPACT_UNITS programs={programs} SPLIT_K={sg},1"
            for M in Ms:
                x = T.randn((M, H), g, device=DEV)
                me.COMPACT_UNITS, me.SPLIT_K_GATED = False, sg
                per_unit = moe_forward(x, *wts, top_k=k)
                me.COMPACT_UNITS, me.UNIT_PROGRAMS = True, programs
                out = moe_forward(x, *wts, top_k=k)
                e = T.rel_err(out, moe_forward_ref(x, *wts, top_k=k))
                run = lambda: moe_forward(x, *wts, top_k=k)  # noqa: E731
                msg = f"rel={e:.2e} same bits as per-unit: {torch.equal(out, per_unit)} "
                msg += check_graph(tag, run, out)
                record(f"{tag} E={E} H={H} I={I_} top{k} M={M}",
                       e < TOL["moe"] and torch.equal(out, per_unit), msg)
            x = T.randn((64, H), g, device=DEV)
            check_gemv_invariance(tag, lambda xx: moe_forward(xx, *wts, top_k=k), x)
    finally:
        me.COMPACT_UNITS, me.UNIT_PROGRAMS, me.SPLIT_K_GATED = saved


# ---------------------------------------------------------------- norms
def flip_frac(a, b):
    return (a != b).float().mean().item() if a.numel() else 0.0


def check_norm(g, small):
    """add_rms_norm vs add_rms_norm_ref: h = x + r bit-exact (elementwise), y within a bf16 ulp
    at rounding boundaries; eager, CUDA graph, row alone vs in a batch."""
    for N in (256, 2560):
        for T_ in ((1, 3, 33) if small else (1, 3, 33, 511)):
            for res in (True, False):
                name = f"add_rms_norm N={N} T={T_} residual={res}"
                x = T.randn((T_, N + 64), g, device=DEV, scale=2.0)[:, :N]   # strided rows
                r = T.randn((T_, N), g, device=DEV) if res else None
                w = (1 + 0.2 * torch.randn(N, generator=g)).to(torch.bfloat16).to(DEV)
                h, y = add_rms_norm(x, r, w)
                hr, yr = add_rms_norm_ref(x, r, w, 1e-6)
                e, f = T.rel_err(y, yr), flip_frac(y, yr)
                msg = f"h exact={torch.equal(h, hr)} y rel={e:.2e} flips={f:.1e} "
                msg += check_graph(name, lambda: add_rms_norm(x, r, w), [h, y])
                record(name, torch.equal(h, hr) and e < TOL["norm"] and f < NORM_FLIP_FRAC, msg)
    x = T.randn((16, 2560), g, device=DEV)
    r = T.randn((16, 2560), g, device=DEV)
    w = T.randn((2560,), g, device=DEV)
    hb, yb = add_rms_norm(x, r, w)
    ok = all(torch.equal(add_rms_norm(x[i:i + 1], r[i:i + 1], w)[1], yb[i:i + 1])
             for i in (0, 7, 15))
    ok &= torch.equal(add_rms_norm(x[:3], r[:3], w)[1], yb[:3])
    record("add_rms_norm batch invariance 1,3 vs 16", ok, "bit-identical" if ok else "DIFFERS")


def qk_case(T_, hq, hkv, g):
    """q, k: strided views of a fused QKV output [T, (Hq + 2 Hkv) * 128]; cos/sin fp32 [T, 128]."""
    qkv = T.randn((T_, (hq + 2 * hkv) * 128), g, device=DEV, scale=3.0)
    q = qkv[:, :hq * 128].unflatten(1, (hq, 128))
    k = qkv[:, hq * 128:(hq + hkv) * 128].unflatten(1, (hkv, 128))
    gq, gk = ((1 + 0.2 * torch.randn(128, generator=g)).to(torch.bfloat16).to(DEV)
              for _ in range(2))
    pos = torch.randint(0, 40000, (T_,), generator=g).double()[:, None]
    ang = pos * 1e6 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)[None, :]
    ang = torch.cat([ang, ang], -1)   # = kolibri_trt.model.ops.rope_cos_sin
    return q, k, gq, gk, ang.cos().float().to(DEV), ang.sin().float().to(DEV)


def check_qk_norm_rope(g, small):
    for hq, hkv in ((20, 4), (4, 2)):
        for T_ in ((1, 3, 33) if small else (1, 3, 33, 511)):
            for rope in (True, False):
                name = f"qk_norm_rope Hq={hq} Hkv={hkv} T={T_} rope={rope}"
                q, k, gq, gk, cos, sin = qk_case(T_, hq, hkv, g)
                out = qk_norm_rope(q, k, gq, gk, cos, sin, rope=rope)
                ref = qk_norm_rope_ref(q, k, gq, gk, cos, sin, 1e-6, rope)
                e = max(T.rel_err(a, b) for a, b in zip(out, ref))
                f = max(flip_frac(a, b) for a, b in zip(out, ref))
                msg = f"rel={e:.2e} flips={f:.1e} " + check_graph(
                    name, lambda: qk_norm_rope(q, k, gq, gk, cos, sin, rope=rope), list(out))
                record(name, e < TOL["norm"] and f < NORM_FLIP_FRAC, msg)
    q, k, gq, gk, cos, sin = qk_case(16, 20, 4, g)
    qb, kb = qk_norm_rope(q, k, gq, gk, cos, sin)
    ok = True
    for s in (slice(0, 1), slice(7, 8), slice(15, 16), slice(0, 3)):
        q1, k1 = qk_norm_rope(q[s], k[s], gq, gk, cos[s], sin[s])
        ok &= torch.equal(q1, qb[s]) and torch.equal(k1, kb[s])
    record("qk_norm_rope batch invariance 1,3 vs 16", ok, "bit-identical" if ok else "DIFFERS")


# ---------------------------------------------------------------- sampling
def gumbel_case(N, V, g):
    logits = T.randn((N, V + 3), g, dtype=torch.float32, device=DEV, scale=3.0)[:, :V]
    temp = (torch.rand(N, generator=g) * 1.5 + 0.1).to(DEV)
    return logits, temp, torch.randint(0, 2**32, (N,), generator=g).to(DEV)


def check_gumbel(g, small):
    """gumbel_argmax vs gumbel_argmax_ref (sampled ids; on CUDA also the kernel's hash bits and
    noise from its debug kernel), eager and CUDA graph, row alone vs in a batch."""
    sizes = ([(1, 7), (3, 1000), (33, 300)] if small else
             [(1, 7), (3, 1000), (33, 16384), (1, 131072), (64, 131072), (511, 4096)])
    for N, V in sizes:
        name = f"gumbel_argmax N={N} V={V}"
        logits, temp, keys = gumbel_case(N, V, g)
        out = gumbel_argmax(logits, temp, keys)
        f = flip_frac(out, gumbel_argmax_ref(logits, temp, keys))
        msg = f"flips={f:.1e} " + check_graph(name, lambda: gumbel_argmax(logits, temp, keys), out)
        record(name, f <= GUMBEL_FLIP_FRAC, msg)
    if DEV == "cuda":
        V = 131072
        keys = torch.tensor([0, 1, 222, 2**32 - 1], device=DEV)
        bits, noise = gumbel_noise_debug(keys, V)
        ref = gumbel_noise_ref(keys, V)
        fin = torch.isfinite(ref)   # key 222 has a +inf at token 94626 (u rounds to 1.0)
        nd = int((noise != ref).sum())
        dmax = float((noise[fin].double() - ref[fin].double()).abs().max())
        ok = torch.equal(bits, gumbel_bits_ref(keys, V))
        record(f"gumbel hash bits V={V}", ok, f"bits exact={ok}; noise differs at {nd} of "
               f"{noise.numel()} (max abs {dmax:.2e})")
    logits, temp, keys = gumbel_case(16, 1000 if small else 131072, g)
    full = gumbel_argmax(logits, temp, keys)
    ok = all(torch.equal(gumbel_argmax(logits[s], temp[s], keys[s]), full[s])
             for s in (slice(0, 1), slice(7, 8), slice(15, 16), slice(0, 3)))
    record("gumbel_argmax batch invariance 1,3 vs 16", ok, "bit-identical" if ok else "DIFFERS")


SECTIONS = {
    "fold": lambda g, small: check_fold(g),
    "int4": lambda g, small: check_attention("int4", g, small),
    "fp8attn": lambda g, small: check_attention("fp8", g, small),
    "int4_noasm": lambda g, small: check_int4_noasm(g, small),
    "nvfp4": check_nvfp4,
    "fp8gemv": check_fp8gemv,
    "moe": check_moe,
    "moecompact": check_moe_compact,
    "splitk": check_split_k,
    "norm": check_norm,
    "qknorm": check_qk_norm_rope,
    "gumbel": check_gumbel,
}


def main():
    global DEV, GRAPHS
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    DEV = args.device
    GRAPHS = DEV == "cuda"
    if DEV == "cuda":
        print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for sec in args.only.split(","):
        t0 = time.time()
        try:
            SECTIONS[sec](T.gen(1000 + list(SECTIONS).index(sec)), args.small)
        except Exception as exc:  # keep going: one broken op must not hide the others' results
            traceback.print_exc()
            record(f"{sec} (crashed)", False, repr(exc)[:300])
        print(f"-- {sec}: {time.time() - t0:.1f} s", flush=True)
    bad = [r for r in RESULTS if not r[1]]
    print(f"\nSUMMARY: {len(RESULTS) - len(bad)}/{len(RESULTS)} passed")
    for name, _, msg in bad:
        print(f"  FAIL {name}: {msg}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
