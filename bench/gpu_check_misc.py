"""gpu_check sections norm, qknorm, gumbel: add_rms_norm, qk_norm_rope and gumbel_argmax
against their references, CUDA graph replay, batch invariance. Run through bench/gpu_check.py."""

from __future__ import annotations

import gpu_check_base as B
import torch
from gpu_check_base import GUMBEL_FLIP_FRAC, NORM_FLIP_FRAC, TOL, check_graph, record
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.add_rms_norm import add_rms_norm, add_rms_norm_ref
from kolibri_trt_plugins.gumbel_argmax import (
    gumbel_argmax,
    gumbel_argmax_ref,
    gumbel_bits_ref,
    gumbel_noise_debug,
    gumbel_noise_ref,
)
from kolibri_trt_plugins.fp8_kv_write import fp8_kv_write
from kolibri_trt_plugins.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref
from kolibri_trt_plugins.qk_norm_rope_kv_write import qk_norm_rope_kv_write


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
                x = T.randn((T_, N + 64), g, device=B.DEV, scale=2.0)[:, :N]   # strided rows
                r = T.randn((T_, N), g, device=B.DEV) if res else None
                w = (1 + 0.2 * torch.randn(N, generator=g)).to(torch.bfloat16).to(B.DEV)
                h, y = add_rms_norm(x, r, w)
                hr, yr = add_rms_norm_ref(x, r, w, 1e-6)
                e, f = T.rel_err(y, yr), flip_frac(y, yr)
                msg = f"h exact={torch.equal(h, hr)} y rel={e:.2e} flips={f:.1e} "
                msg += check_graph(name, lambda: add_rms_norm(x, r, w), [h, y])
                record(name, torch.equal(h, hr) and e < TOL["norm"] and f < NORM_FLIP_FRAC, msg)
    x = T.randn((16, 2560), g, device=B.DEV)
    r = T.randn((16, 2560), g, device=B.DEV)
    w = T.randn((2560,), g, device=B.DEV)
    hb, yb = add_rms_norm(x, r, w)
    ok = all(torch.equal(add_rms_norm(x[i:i + 1], r[i:i + 1], w)[1], yb[i:i + 1])
             for i in (0, 7, 15))
    ok &= torch.equal(add_rms_norm(x[:3], r[:3], w)[1], yb[:3])
    record("add_rms_norm batch invariance 1,3 vs 16", ok, "bit-identical" if ok else "DIFFERS")


def qk_case(T_, hq, hkv, g):
    """q, k: strided views of a fused QKV output [T, (Hq + 2 Hkv) * 128]; cos/sin fp32 [T, 128]."""
    qkv = T.randn((T_, (hq + 2 * hkv) * 128), g, device=B.DEV, scale=3.0)
    q = qkv[:, :hq * 128].unflatten(1, (hq, 128))
    k = qkv[:, hq * 128:(hq + hkv) * 128].unflatten(1, (hkv, 128))
    gq, gk = ((1 + 0.2 * torch.randn(128, generator=g)).to(torch.bfloat16).to(B.DEV)
              for _ in range(2))
    pos = torch.randint(0, 40000, (T_,), generator=g).double()[:, None]
    ang = pos * 1e6 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)[None, :]
    ang = torch.cat([ang, ang], -1)   # = kolibri_trt.model.ops.rope_cos_sin
    return q, k, gq, gk, ang.cos().float().to(B.DEV), ang.sin().float().to(B.DEV)


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
                check_kv_write_fused(name, q, k, gq, gk, cos, sin, rope, out, g)
    q, k, gq, gk, cos, sin = qk_case(16, 20, 4, g)
    qb, kb = qk_norm_rope(q, k, gq, gk, cos, sin)
    ok = True
    for s in (slice(0, 1), slice(7, 8), slice(15, 16), slice(0, 3)):
        q1, k1 = qk_norm_rope(q[s], k[s], gq, gk, cos[s], sin[s])
        ok &= torch.equal(q1, qb[s]) and torch.equal(k1, kb[s])
    record("qk_norm_rope batch invariance 1,3 vs 16", ok, "bit-identical" if ok else "DIFFERS")


def check_kv_write_fused(name, q, k, gq, gk, cos, sin, rope, out, g):
    """qk_norm_rope_kv_write against qk_norm_rope (its q, `out`) + fp8_kv_write of its keys:
    the same q and cache bytes (one slot in three skipped), eager and in a CUDA graph."""
    T_, hkv = k.shape[0], k.shape[1]
    v = T.randn(tuple(k.shape), g, device=B.DEV, scale=3.0)
    slots = torch.randperm(T_ * 2, generator=g)[:T_].to(B.DEV)
    slots[1::3] = -1
    first = T.fp8_cache(T_ // 8 + 1, 16, hkv, g, device=B.DEV)
    caches = [first, tuple(c.clone() for c in first)]
    scales = torch.tensor([0.05], device=B.DEV), torch.tensor([0.03], device=B.DEV)
    fp8_kv_write(out[1], v, slots, *caches[1], *scales)

    def fused():
        return qk_norm_rope_kv_write(q, k, v, gq, gk, cos, sin, slots, *caches[0], *scales,
                                     rope=rope)
    q_out = fused()
    same = torch.equal(q_out, out[0]) and all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        for a, b in zip(caches[0], caches[1]))
    msg = "same q and cache bytes as qk_norm_rope + fp8_kv_write " + check_graph(
        name + " kv_write", fused, [q_out])
    record(name.replace("qk_norm_rope", "qk_norm_rope_kv_write"), same, msg)


# ---------------------------------------------------------------- sampling
def gumbel_case(N, V, g):
    logits = T.randn((N, V + 3), g, dtype=torch.float32, device=B.DEV, scale=3.0)[:, :V]
    temp = (torch.rand(N, generator=g) * 1.5 + 0.1).to(B.DEV)
    return logits, temp, torch.randint(0, 2**32, (N,), generator=g).to(B.DEV)


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
    if B.DEV == "cuda":
        V = 131072
        keys = torch.tensor([0, 1, 222, 2**32 - 1], device=B.DEV)
        bits, noise = gumbel_noise_debug(keys, V)
        ref = gumbel_noise_ref(keys, V)
        fin = torch.isfinite(ref)   # all finite since 23-bit u (key 222 / token 94626 was +inf)
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
    check_fused_sampler(g, small)


def check_fused_sampler(g, small):
    """kolibri_trt.sampling.sample with FUSED_SAMPLER (the kernel) vs without (torch ops), on
    the check's device: fraction of sampled tokens that differ, with and without top-k/top-p."""
    from kolibri_trt import sampling
    from kolibri_trt.sampling import SamplingParams
    V = 1000 if small else 131072
    logits = torch.randn((32, V), generator=g).to(B.DEV) * 3
    for extra in ({}, dict(top_k=50, top_p=0.9)):
        params = [SamplingParams(temperature=0.5 + i / 32, seed=i, **extra) for i in range(32)]
        pos = list(range(100, 132))
        saved = sampling.FUSED_SAMPLER
        try:
            sampling.FUSED_SAMPLER = False
            plain = sampling.sample(logits, params, pos)
            sampling.FUSED_SAMPLER = True
            fused = sampling.sample(logits, params, pos)
        finally:
            sampling.FUSED_SAMPLER = saved
        f = flip_frac(fused, plain)
        record(f"sample() FUSED_SAMPLER vs torch ops V={V} {extra or 'no filter'}",
               f <= GUMBEL_FLIP_FRAC, f"flips={f:.1e}")


def check_vocab_argmax(g, small):
    """vocab_argmax (the drafter heads' greedy pick) vs vocab[argmax], bf16 and fp32 scores with
    ties, a NaN and an all -inf row, into a strided column; CUDA graphs replayed twice."""
    from kolibri_trt_plugins.vocab_argmax import vocab_argmax, vocab_argmax_ref
    sizes = [(1, 7), (4, 8192), (33, 300)] if small else [(1, 7), (4, 8192), (33, 32768),
                                                          (64, 131072)]
    for dtype in (torch.bfloat16, torch.float32):
        for N, V in sizes:
            logits = (torch.randint(-8, 8, (N, V), generator=g).float() / 4).to(dtype).to(B.DEV)
            if N > 2:
                logits[1] = float("-inf")
                logits[2, V // 3] = float("nan")
            vocab = torch.randperm(2 * V, generator=g)[:V].to(B.DEV)
            drafts = torch.zeros((N, 4), dtype=torch.long, device=B.DEV)
            out = vocab_argmax(logits, vocab, out=drafts[:, 1]).clone()
            ok = torch.equal(out, vocab_argmax_ref(logits, vocab))
            msg = check_graph(f"vocab_argmax {N}x{V}",
                              lambda: vocab_argmax(logits, vocab, out=drafts[:, 1]), out)
            record(f"vocab_argmax {str(dtype)[6:]} N={N} V={V}", ok, "exact " + msg)



def check_vocab_argmax_keyed(g, small):
    """vocab_argmax with KeyedRows (a sampled stream's coupled drafts): against its torch
    reference on the same device (flip fraction), CUDA graphs replayed twice, and, over the
    whole vocabulary, exactly the token kolibri_trt.sampling.sample keeps (the fused sampler:
    the same noise at the same output position)."""
    from kolibri_trt import sampling
    from kolibri_trt.sampling import SamplingParams
    from kolibri_trt_plugins.vocab_argmax import KeyedRows, vocab_argmax, vocab_argmax_ref
    V = 1000 if small else 8192
    for N in (1, 5, 64):
        logits = (torch.randn((N, V), generator=g) * 3).to(torch.bfloat16).to(B.DEV)
        vocab = torch.randperm(16 * V, generator=g)[:V].to(B.DEV)
        z = 9
        temp = torch.rand(z, generator=g) + 0.3
        temp[0] = 0.0
        cols = torch.randint(0, 4000, (N, 2), generator=g)
        cols[:, 1] = torch.randint(0, z, (N,), generator=g)
        cols = cols.to(B.DEV)
        keyed = KeyedRows(cols[:, 1], cols[:, 0], temp.to(B.DEV),
                          torch.randint(0, 2**32, (z,), generator=g).to(B.DEV),
                          torch.randint(0, 50, (z,), generator=g).to(B.DEV))
        drafts = torch.zeros((N, 4), dtype=torch.long, device=B.DEV)
        out = vocab_argmax(logits, vocab, out=drafts[:, 2], keyed=keyed).clone()
        f = flip_frac(out, vocab_argmax_ref(logits, vocab, keyed))
        msg = check_graph(f"vocab_argmax keyed N={N}",
                          lambda: vocab_argmax(logits, vocab, out=drafts[:, 2], keyed=keyed), out)
        record(f"vocab_argmax keyed N={N} V={V}", f <= GUMBEL_FLIP_FRAC, f"flips={f:.1e} " + msg)
    V, n = (1000 if small else 131072), 32
    logits = torch.randn((n, V), generator=g).to(B.DEV) * 3
    params = [SamplingParams(temperature=0.5 + i / 32, seed=1000 + i) for i in range(n)]
    pos = torch.arange(100, 100 + n)
    want = sampling.sample(logits, params, pos.tolist())
    base = torch.randint(0, 50, (n,), generator=g)
    keyed = KeyedRows(torch.arange(n, device=B.DEV), (pos + base).to(B.DEV),
                      torch.tensor([p.temperature for p in params], dtype=torch.float32,
                                   device=B.DEV),
                      torch.tensor([sampling.seed_key(p.resolved_seed) for p in params],
                                   device=B.DEV), base.to(B.DEV))
    got = vocab_argmax(logits, torch.arange(V, device=B.DEV), keyed=keyed)
    ok = torch.equal(got, want)
    record(f"vocab_argmax keyed = the target sampler's token V={V}", ok,
           "exact" if ok else f"differs at {int((got != want).sum())} of {n}")


# ---------------------------------------------------------------- the norm fused into o_proj
def check_norm_fused(g, small):
    """fp8_gemv_add_rms_norm (o_proj 2560x2560, split-K 3) against the unfused launches it
    replaces (fp8_gemv, then add_rms_norm): h bit-exact, y bit-exact or within NORM_FLIP_FRAC
    one-ulp flips (the norm's sum order); CUDA graphs replayed; a row alone against the same
    row in a batch."""
    from kolibri_trt_plugins import fp8_gemv
    from kolibri_trt_plugins.gemv_add_rms_norm import fp8_gemv_add_rms_norm
    N = 2560
    w = T.fp8_weight(N, N, "tensor", g, device=B.DEV)
    gain = (1 + 0.2 * torch.randn(N, generator=g)).to(torch.bfloat16).to(B.DEV)
    for M in ((1, 3, 33) if small else (1, 3, 16, 33, 144)):
        x = T.randn((M, N), g, device=B.DEV)
        r = T.randn((M, N), g, device=B.DEV, scale=4.0)
        got = fp8_gemv_add_rms_norm(x, *w, r, gain)
        want = add_rms_norm(r, fp8_gemv(x, *w), gain)
        _record_fused(f"fp8_gemv_add_rms_norm 2560x2560 M={M}", got, want,
                      lambda: fp8_gemv_add_rms_norm(x, *w, r, gain))
    x = T.randn((16, N), g, device=B.DEV)
    r = T.randn((16, N), g, device=B.DEV)
    gn = T.randn((N,), g, device=B.DEV)
    hb, yb = fp8_gemv_add_rms_norm(x, *w, r, gn)
    ok = all(torch.equal(fp8_gemv_add_rms_norm(x[i:i + 1], *w, r[i:i + 1], gn)[1], yb[i:i + 1])
             for i in (0, 7, 15))
    record("fp8_gemv_add_rms_norm batch invariance 1 vs 16", ok,
           "bit-identical" if ok else "DIFFERS")


def _record_fused(name, got, want, fn):
    (h, y), (hw, yw) = got, want
    exact = torch.equal(y, yw)
    f = flip_frac(y, yw)
    msg = (f"h exact={torch.equal(h, hw)} y bit-identical={exact} flips={f:.1e} "
           + check_graph(name, fn, [h, y]))
    record(name, torch.equal(h, hw) and f < NORM_FLIP_FRAC, msg)
