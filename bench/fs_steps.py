"""bench/fullsize.py, part 2 of 5: KV caches filled with random data, step metadata,
recording of the kernel calls, floors (bytes that must be read) and one measured step."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt.model import plugin_model as pm  # noqa: E402
from kolibri_trt.model.metadata import StepMetadata  # noqa: E402
from kolibri_trt.runtime.kv_cache import CacheGeometry  # noqa: E402
from kolibri_trt.runtime.kv_cache import KVCache  # noqa: E402
from kolibri_trt.runtime.kv_cache import KVPlan  # noqa: E402
from kolibri_trt.runtime.kv_cache import bytes_per_token  # noqa: E402
from kolibri_trt_plugins import moe_route  # noqa: E402

from fs_common import ATTR_CLASSES, BW, Bench, OPS, flush_l2, log, med, time_eager, time_graph  # noqa: E402


# =============================================================================== KV cache + steps
@dataclass
class Cache:
    layers: list            # per layer the cache dict the model reads
    full_tables: torch.Tensor   # int32 [streams, width]: random physical blocks
    ring_tables: torch.Tensor   # int32 [streams, width]: stream s's ring, logical b -> b % ring
    full_fmt: str
    streams: int
    max_len: int


def cache_bytes_per_session(b: Bench, full_fmt: str, seq_len: int) -> int:
    """Full layers: every position (whole blocks); sliding layers: the ring (window + one
    verification of 1 + 8 tokens, whole blocks)."""
    cfg = b.cfg
    n_full = sum(not cfg.is_sliding(i) for i in range(cfg.num_hidden_layers))
    n_sl = cfg.num_hidden_layers - n_full
    full = n_full * -(-seq_len // b.bs) * b.bs * bytes_per_token(cfg, full_fmt)
    return full + n_sl * b.ring * b.bs * bytes_per_token(cfg, "fp8")


def make_cache(b: Bench, full_fmt: str, streams: int, max_len: int) -> Cache:
    """Caches for `streams` streams of up to `max_len` positions, filled with random valid
    data (no prefill): INT4 codes uniform, fp16 scale ~0.25-0.35 with offset ~ -7.5 scale
    (codes span the rotated, normalised keys' range), FP8 values N(0, 1)."""
    width = -(-max_len // b.bs)
    geo = CacheGeometry(b.bs, streams * width, streams * b.ring, b.ring)
    kv = KVCache(b.cfg, KVPlan("fp8", full_fmt), geo, b.scales, b.dev)
    for layer in kv.layers:
        fill_random(b, layer)
    perm = torch.randperm(streams * width, generator=b.gen, device=b.dev).to(torch.int32)
    full_tables = perm.view(streams, width).contiguous()
    ring = torch.arange(width, device=b.dev) % b.ring
    ring_tables = (torch.arange(streams, device=b.dev)[:, None] * b.ring + ring[None, :])
    return Cache(kv.layers, full_tables, ring_tables.to(torch.int32).contiguous(), full_fmt,
                 streams, max_len)


def _chunks(t: torch.Tensor, elements: int = 1 << 25):
    flat = t.view(t.shape[0], -1)
    rows = max(1, elements // max(1, flat.shape[1]))
    for r in range(0, flat.shape[0], rows):
        yield flat[r:r + rows]


def fill_random(b: Bench, layer: dict) -> None:
    for name, t in layer.items():
        if name.endswith("_scale"):
            continue
        if t.dtype == torch.uint8:
            t.random_(0, 256, generator=b.gen)
        elif t.dtype == torch.float8_e4m3fn:
            for c in _chunks(t):
                c.copy_(torch.randn(c.shape, generator=b.gen, device=b.dev, dtype=torch.bfloat16))
        elif t.dtype == torch.float16:          # INT4 meta [..., 2] = (scale, offset)
            for c in _chunks(t):
                pairs = c.view(-1, 2)
                u = torch.rand(pairs.shape, generator=b.gen, device=b.dev)
                scale = 0.25 + 0.1 * u[:, 0]
                pairs.copy_(torch.stack([scale, -7.5 * scale + 0.2 * (u[:, 1] - 0.5)], -1))
        else:
            raise TypeError(f"cache tensor {name}: unexpected dtype {t.dtype}")


def step_meta(b: Bench, cache: Cache, streams: int, q: int, seq_len: int) -> StepMetadata:
    """`streams` streams (the cache's first ones) each bringing q tokens at positions
    seq_len - q .. seq_len - 1 (their K/V are written by the step); logits for every row."""
    if streams > cache.streams or seq_len > cache.max_len:
        raise ValueError(f"step {streams}x{seq_len} does not fit the cache "
                         f"{cache.streams}x{cache.max_len}")
    dev, bs = b.dev, b.bs
    ft, rt = cache.full_tables[:streams].contiguous(), cache.ring_tables[:streams].contiguous()
    pos = torch.arange(seq_len - q, seq_len, device=dev).repeat(streams)
    row = torch.arange(streams, device=dev).repeat_interleave(q)
    blk, off = pos // bs, pos % bs
    return StepMetadata(
        input_ids=torch.randint(0, b.cfg.vocab_size, (streams * q,), generator=b.gen,
                                device=dev),
        positions=pos, cu_q_lens=(torch.arange(streams + 1, device=dev) * q).to(torch.int32),
        seq_lens=torch.full((streams,), seq_len, dtype=torch.int32, device=dev),
        full_block_tables=ft, sliding_block_tables=rt,
        full_slots=ft[row, blk].long() * bs + off, sliding_slots=rt[row, blk].long() * bs + off,
        logits_rows=torch.arange(streams * q, device=dev), q_lens=(q,) * streams,
        seq_lens_host=(seq_len,) * streams)


def step_fn(b: Bench, cache: Cache, meta: StepMetadata):
    q = max(meta.q_lens)
    seq = max(meta.seq_lens_host)
    return lambda: b.model.forward(meta, cache.layers, seq, q, all_rows=True)[0]


# =============================================================================== recording
@contextlib.contextmanager
def recording(b: Bench, cache: Cache):
    """Patch the kernel entry points `PluginModel` calls so that one eager pass records every
    call (kernel class, function, arguments) and each MoE call's routing: distinct experts
    of the step (union) and summed over the MoE kernel's 64-token chunks."""
    model, cfg = b.model, b.cfg
    qkv_ids = {id(w.qkv) for w in model.layers}
    o_ids = {id(w.o_proj) for w in model.layers}
    head_id = id(model.head.weight)
    full_ids = {id(t) for i, c in enumerate(cache.layers) if not cfg.is_sliding(i)
                for t in c.values()}
    calls, routing = [], []

    def classify(name, args, kwargs):
        if name in ("fp8_gemv", "fp8_wgmma", "nvfp4_gemv", "nvfp4_wgmma"):
            w = id(args[1])
            return "qkv" if w in qkv_ids else "o_proj" if w in o_ids else \
                "head" if w == head_id else "other_gemv"
        if name == "moe_forward":
            return "moe"
        if name == "fp8_gemv_add_rms_norm":   # o_proj and post_attention_layernorm
            return "o_proj"
        if name == "add_rms_norm":
            return "norms"
        if name == "qk_norm_rope_kv_write":   # rope on sliding layers only (NoPE full layers)
            return "attn_sliding" if kwargs.get("rope", True) else "attn_full"
        if name in ("int4_paged_attention", "qk_norm_fold_int4"):
            return "attn_full"
        return "attn_full" if id(args[1]) in full_ids else "attn_sliding"

    def wrap(name, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            calls.append((classify(name, args, kwargs), fn, args, kwargs))
            if name == "moe_forward":
                ids, _ = moe_route(args[0], args[1], kwargs["top_k"], kwargs["renormalize"])
                chunks = sum(int(torch.unique(ids[c:c + 64]).numel())
                             for c in range(0, ids.shape[0], 64))
                routing.append((int(torch.unique(ids).numel()), chunks))
            return out
        return wrapped

    orig = {n: getattr(pm, n) for n in OPS}
    for n, fn in orig.items():
        setattr(pm, n, wrap(n, fn))
    try:
        yield calls, routing
    finally:
        for n, fn in orig.items():
            setattr(pm, n, fn)


def replay_calls(calls, cls: str | None, b: Bench | None = None):
    """A function that re-issues the recorded calls of class `cls` (all if None), after an L2
    flush when `b` is given."""
    sel = [(fn, a, k) for c, fn, a, k in calls if cls is None or c == cls]

    def run():
        if b is not None and b.cuda:
            flush_l2(b)
        return [fn(*a, **k) for fn, a, k in sel]
    return run, len(sel)


# =============================================================================== floors
def floor_bytes(b: Bench, streams: int, q: int, seq_len: int, full_fmt: str,
                distinct: list[int]) -> dict[str, int]:
    """Bytes a step must read at least, by kernel class: every weight it touches once, the
    distinct experts the routing selected (`distinct`, per layer), the KV the queries can
    see (sliding: window + q - 1 positions), the embedding rows. Writes are not counted."""
    cfg, model = b.cfg, b.model

    def nb(t):
        return t.numel() * t.element_size()

    out = dict.fromkeys(ATTR_CLASSES + ("norms_embed",), 0)
    n_sl_keys = min(seq_len, cfg.sliding_window + q - 1)
    for i, w in enumerate(model.layers):
        out["qkv"] += nb(w.qkv) + 4
        out["o_proj"] += nb(w.o_proj) + 4
        per_expert = nb(w.w13[0]) + nb(w.w2[0]) + 8
        shared = sum(nb(t) for t in w.shared) if w.shared else 0
        out["moe"] += nb(w.router) + distinct[i] * per_expert + shared
        out["norms_embed"] += nb(w.input_norm) + nb(w.post_norm) + nb(w.q_norm) + nb(w.k_norm)
        if cfg.is_sliding(i):
            out["attn_sliding"] += streams * n_sl_keys * bytes_per_token(cfg, "fp8")
        else:
            out["attn_full"] += streams * seq_len * bytes_per_token(cfg, full_fmt)
            if full_fmt in ("hadamard-int4", "int4") and w.rotation is not None:
                out["attn_full"] += sum(nb(t) for t in w.rotation)
    h = model.head
    out["head"] = nb(h.weight) + nb(h.scale) + (4 if h.scale_2 is not None else 0)
    out["norms_embed"] += nb(model.final_norm) + streams * q * cfg.hidden_size * 2
    out["total"] = sum(out.values())
    return out


# =============================================================================== one step, measured
def measure_step(b: Bench, cache: Cache, streams: int, q: int, seq_len: int,
                 attrib: bool, eager: bool, label: str) -> dict:
    """Graph (and eager) time of one step, its floor, and optionally the per-class times."""
    meta = step_meta(b, cache, streams, q, seq_len)
    fn = step_fn(b, cache, meta)
    fn()                                              # compile (first use) outside any graph
    b.sync()
    with recording(b, cache) as (calls, routing):
        fn()
    b.sync()
    distinct = [d for d, _ in routing]
    fb = floor_bytes(b, streams, q, seq_len, cache.full_fmt, distinct)
    reps = b.sizes.replays
    g_ms = med(time_graph(b, fn, reps))
    floor_ms = fb["total"] / BW * 1e3
    row = dict(label=label, streams=streams, q=q, seq_len=seq_len, full_kv=cache.full_fmt,
               block_size=b.bs, graph_ms=g_ms, floor_ms=floor_ms, ratio=g_ms / floor_ms,
               tokens_per_s=streams * q / (g_ms * 1e-3), floor_bytes=fb,
               distinct_experts_mean=sum(distinct) / len(distinct),
               distinct_experts_min=min(distinct), distinct_experts_max=max(distinct),
               expert_reads_by_chunks_mean=sum(c for _, c in routing) / len(routing))
    if eager:
        row["eager_ms"] = med(time_eager(b, fn, b.sizes.eager_reps))
        row["eager_over_graph"] = row["eager_ms"] / g_ms
    if attrib:
        row["attribution"] = attribute(b, calls, fb, g_ms)
    del calls
    msg = (f"{label}: {streams:3d} x q{q} @ {seq_len:6d}: graph {g_ms:8.3f} ms, floor "
           f"{floor_ms:7.3f} ms ({row['ratio']:.2f}x), {row['distinct_experts_mean']:.1f} "
           f"experts/layer")
    if eager:
        msg += f", eager {row['eager_ms']:.2f} ms ({row['eager_over_graph']:.2f}x)"
    log(msg)
    return row


def attribute(b: Bench, calls, fb: dict, step_ms: float) -> dict:
    """Each kernel class of every layer alone in one graph (an L2 flush in front, its own time
    subtracted): ms, floor ms ('norms': the fused residual add + RMSNorm kernels, counted in
    the floor's norms_embed), and the remainder of the step (embedding, casts, RoPE tables)
    as 'rest'."""
    reps = b.sizes.replays
    base = med(time_graph(b, lambda: flush_l2(b), reps)) if b.cuda else 0.0
    out, total = {}, 0.0
    for cls in ATTR_CLASSES:
        run, n = replay_calls(calls, cls, b)
        if n == 0:
            continue
        ms = max(0.0, med(time_graph(b, run, reps)) - base)
        total += ms
        out[cls] = dict(ms=ms, calls=n, floor_ms=fb.get(cls, 0) / BW * 1e3, share=ms / step_ms)
    out["rest"] = dict(ms=step_ms - total, share=(step_ms - total) / step_ms,
                       floor_ms=fb["norms_embed"] / BW * 1e3)
    top = max((c for c in out if c != "rest"), key=lambda c: out[c]["ms"])
    log("    attribution: " + ", ".join(f"{c} {v['ms']:.3f}" for c, v in out.items())
        + f" ms; largest: {top}")
    return out
