#!/usr/bin/env python3
"""Full-size Kolibri-1 on one H200 (issue 8): a synthetic engine made on the GPU, then timings.

    python3 bench/fullsize.py --out DIR [--parts decode,verify,kv,drafter] [--budget 480]
    python3 bench/fullsize.py --tiny --out DIR          # CPU dry run (kernels' torch references)

On the H200 (torch + Triton only; the repository need not be pip-installed), in two calls:
    python3 bench/fullsize.py --out $OUT --parts decode,verify
    python3 bench/fullsize.py --out $OUT --parts kv,drafter
Each call makes the engine again (~1 min with Triton compiles counted elsewhere); --budget
(seconds from start) stops starting new measurements so a call ends before its time limit,
with everything measured so far written.

The engine: `kolibri_trt/builder/synthetic.py` (random weights of the spec's exact shapes, made
and quantized layer by layer on the device into the fp8-nvfp4 engine tensors, FP8 sliding KV +
rotated INT4 full-layer KV; one copy of the ~78 GB of weights for every part). KV caches are
filled with random but valid data for the context (INT4 codes + fp16 scale/offset, FP8 values
N(0, 1)) instead of running prefill; each step's `StepMetadata` is built directly (random block
placement in the full layers, a per-stream ring in the sliding layers) and
`PluginModel.forward` is captured in our own CUDA graph (exact shapes, no bucket padding).

Parts (each writes DIR/fullsize-<parts>.json as it goes, and a PNG per figure if matplotlib
imports):
- decode:  one decode step (the whole target forward, all rows' logits) at 1/4/16/64 streams x
           contexts 1k/8k/32k: CUDA-graph median, eager median, floor = bytes that must be read /
           4.14e12 B/s (attention + o_proj of every layer, router + the distinct routed experts
           the step selected (counted) + shared expert, LM head, embedding rows, norms, the KV
           bytes the queries can see); per-kernel-class attribution (each class of every layer
           alone in one graph behind an L2 flush).
- verify:  1 + k tokens per stream (k = 0..8) vs the 1-token step, at 1 and 16 streams.
- kv:      rotated INT4 vs FP8 full-layer KV: sessions that fit at 64k / 256k in the memory left
           after the weights (bytes per token, sliding ring included) and decode tokens/s at full
           memory (largest batch that fits, capped by --kv-max-streams).
- drafter: one block-drafter pass as plugin ops in a graph (no drafter kernel path exists yet):
           block-FP8 body (fp8_gemv with [N, K/64] scales), FP8 paged attention over its own
           context cache (2048 rows + the 4 block rows, causal), the NVFP4 head slice
           (60614 x 2560) once per block row; at 1 and 4 streams, against the target step.
CUDA graphs vs eager: every timed step of decode / verify / drafter is also timed eagerly.
Aims (reported, not asserted): step <= 1.25x floor at 1 stream, <= 1.5x at 64; INT4 >= +85 %
sessions at 64k; 4-token verification <= 1.15x a 1-token step at 1 stream.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt_plugins import (fp8_gemv, fp8_kv_write, fp8_paged_attention,  # noqa: E402
                                 moe_route, nvfp4_gemv)

from kolibri_trt.builder import synthetic  # noqa: E402
from kolibri_trt.builder.quantize import quantize_block_fp8, quantize_nvfp4  # noqa: E402
from kolibri_trt.config import KolibriConfig  # noqa: E402
from kolibri_trt.drafter.config import DrafterConfig  # noqa: E402
from kolibri_trt.fixtures import tiny_target_config  # noqa: E402
from kolibri_trt.model import ops  # noqa: E402
from kolibri_trt.model import plugin_model as pm  # noqa: E402
from kolibri_trt.model.metadata import StepMetadata  # noqa: E402
from kolibri_trt.runtime.kv_cache import (CacheGeometry, KVCache, KVPlan,  # noqa: E402
                                          bytes_per_token, ring_blocks_needed)

BW = 4.14e12                 # measured HBM read bandwidth of the H200, B/s (notes/h200.md)
GIB = 1 << 30
MAX_DRAFTS = 8               # num_speculative_tokens: the sliding ring holds 1 + 8 new tokens
AIMS = {"step_vs_floor_1": 1.25, "step_vs_floor_64": 1.5, "int4_sessions_gain_64k": 0.85,
        "verify4_vs_step_1": 1.15}
OPS = ("fp8_gemv", "nvfp4_gemv", "moe_forward", "fp8_paged_attention", "int4_paged_attention",
       "qk_norm_fold_int4", "fp8_kv_write")
ATTR_CLASSES = ("attn_sliding", "attn_full", "qkv", "o_proj", "moe", "head")


# =============================================================================== settings
@dataclass
class Sizes:
    """What each part runs (full size, or the --tiny dry run)."""
    contexts: tuple[int, ...]
    streams: tuple[int, ...]
    verify_streams: tuple[int, ...]
    verify_context: int
    verify_k: tuple[int, ...]
    verify_attrib_q: tuple[int, ...]
    kv_contexts: tuple[int, ...]
    drafter_streams: tuple[int, ...]
    drafter_context: int         # target context of the step the drafter pass is compared to
    replays: int
    eager_reps: int


FULL = Sizes(contexts=(1024, 8192, 32768), streams=(1, 4, 16, 64), verify_streams=(1, 16),
             verify_context=8192, verify_k=tuple(range(9)), verify_attrib_q=(1, 4, 9),
             kv_contexts=(65536, 262144), drafter_streams=(1, 4), drafter_context=8192,
             replays=12, eager_reps=5)
TINY = Sizes(contexts=(40, 100), streams=(1, 3), verify_streams=(1, 2), verify_context=60,
             verify_k=(0, 1, 3), verify_attrib_q=(1, 4), kv_contexts=(256, 1024),
             drafter_streams=(1, 2), drafter_context=60, replays=2, eager_reps=2)


def tiny_config() -> KolibriConfig:
    """5 layers (4 sliding + 1 full), head_dim 128 (the kernels' size), window 32."""
    return tiny_target_config(vocab_size=1024, hidden_size=128, num_hidden_layers=5,
                              num_attention_heads=2, num_key_value_heads=1, sliding_window=32,
                              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                              shared_expert_intermediate_size=64)


def tiny_drafter_config(cfg: KolibriConfig) -> DrafterConfig:
    n = cfg.num_hidden_layers
    return DrafterConfig(hidden_size=cfg.hidden_size, target_hidden_size=cfg.hidden_size,
                         target_layer_ids=(n - 3, n - 2, n - 1), num_attention_heads=1,
                         num_key_value_heads=1, intermediate_size=256, block_size=4,
                         context_window=32, predecessor_rank=64, spine_rank=64,
                         draft_vocab_size=300)


class Bench:
    """Device, model, sizes, results and the time budget of one run."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        self.sizes = TINY if args.tiny else FULL
        self.cfg = tiny_config() if args.tiny else KolibriConfig()
        self.bs = args.block_size
        self.ring = ring_blocks_needed(self.cfg.sliding_window, 1 + MAX_DRAFTS, self.bs)
        self.gen = torch.Generator(device=self.dev).manual_seed(args.seed + 17)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tag = "+".join(args.parts)
        self.results: dict = {"meta": {}, "errors": []}
        self.model = None
        self.scales: dict = {}
        self.flush_buf = None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.args.budget - self.elapsed()

    def enough(self, need: float, what: str) -> bool:
        """False (and noted) when fewer than `need` seconds of the budget are left."""
        if self.left() >= need:
            return True
        log(f"SKIP {what}: {self.left():.0f} s of the budget left (< {need:.0f} s)")
        self.results.setdefault("skipped", []).append(what)
        return False

    def save(self) -> Path:
        path = self.out / f"fullsize-{self.tag}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=_jsonable))
        tmp.replace(path)
        return path

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def _jsonable(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    return repr(x)


def log(msg: str) -> None:
    print(msg, flush=True)


def med(xs) -> float:
    return float(statistics.median(xs))


# =============================================================================== timing
class Graph:
    """`fn` captured in a CUDA graph after a warm-up on a side stream (compiles the Triton
    kernels, as PluginRunner does); on CPU it just runs `fn` (dry run)."""

    def __init__(self, b: Bench, fn):
        self.b, self.fn, self.graph = b, fn, None
        if b.cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.output = fn()
            self.graph.replay()
            torch.cuda.synchronize()

    def replay(self):
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.output

    def time(self, reps: int) -> list[float]:
        """ms per replay, one CUDA event pair around each."""
        if self.graph is None:
            return time_eager(self.b, self.fn, reps, warm=False)
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(reps)]
        for a, z in evs:
            a.record()
            self.graph.replay()
            z.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(z) for a, z in evs]


def time_eager(b: Bench, fn, reps: int, warm: bool = True) -> list[float]:
    """ms per call, host clock around fn + device sync."""
    if warm:
        fn()
        b.sync()
    out = []
    for _ in range(reps):
        b.sync()
        t = time.perf_counter()
        fn()
        b.sync()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def time_graph(b: Bench, fn, reps: int) -> list[float]:
    g = Graph(b, fn)
    ts = g.time(reps)
    del g
    return ts


def flush_l2(b: Bench):
    """A read of 256 MiB (H200 L2: 50 MiB) so that a class timed alone starts cold."""
    if b.flush_buf is None:
        b.flush_buf = torch.zeros(128 << 20, dtype=torch.bfloat16, device=b.dev)
    return torch.amax(b.flush_buf)


# =============================================================================== engine
def build_engine(b: Bench) -> None:
    """The synthetic target on the device; records its size and the build time."""
    t = time.monotonic()

    def progress(i: int, n: int) -> None:
        if i % 10 == 0 or i == n:
            mem = torch.cuda.memory_allocated() / GIB if b.cuda else 0.0
            log(f"  engine: layer {i}/{n} quantized, {time.monotonic() - t:.1f} s, "
                f"{mem:.1f} GiB allocated")

    model, target, scales = synthetic.synthetic_plugin_model(
        b.cfg, b.dev, seed=b.args.seed, progress=progress)
    b.model, b.scales = model, scales
    b.free()
    if b.cuda:
        flush_l2(b)           # allocate the flush buffer now, outside any capture
    wbytes = model_bytes(model)
    meta = b.results["meta"]
    meta.update(engine_build_s=round(time.monotonic() - t, 1), weight_bytes=wbytes)
    if b.cuda:
        meta.update(mem_after_engine_gib=torch.cuda.memory_allocated() / GIB,
                    max_allocated_gib=torch.cuda.max_memory_allocated() / GIB)
    log(f"engine: {wbytes / 1e9:.2f} GB of weights on {b.dev} in {meta['engine_build_s']} s")


def model_bytes(model) -> int:
    seen, total = set(), 0
    tensors = [model.embed, model.final_norm, model.head.weight, model.head.scale,
               model.head.scale_2]
    for w in model.layers:
        for name in w.__dataclass_fields__:
            v = getattr(w, name)
            tensors += list(v) if isinstance(v, tuple) else [v]
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


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

    def classify(name, args):
        if name in ("fp8_gemv", "nvfp4_gemv"):
            w = id(args[1])
            return "qkv" if w in qkv_ids else "o_proj" if w in o_ids else \
                "head" if w == head_id else "other_gemv"
        if name == "moe_forward":
            return "moe"
        if name in ("int4_paged_attention", "qk_norm_fold_int4"):
            return "attn_full"
        return "attn_full" if id(args[3 if name == "fp8_kv_write" else 1]) in full_ids \
            else "attn_sliding"

    def wrap(name, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            calls.append((classify(name, args), fn, args, kwargs))
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
    subtracted): ms, floor ms, and the remainder of the step (norms, RoPE, residual adds,
    embedding, casts) as 'rest'."""
    reps = b.sizes.replays
    base = med(time_graph(b, lambda: flush_l2(b), reps)) if b.cuda else 0.0
    out, total = {}, 0.0
    for cls in ATTR_CLASSES:
        run, n = replay_calls(calls, cls, b)
        if n == 0:
            continue
        ms = max(0.0, med(time_graph(b, run, reps)) - base)
        total += ms
        out[cls] = dict(ms=ms, calls=n, floor_ms=fb[cls] / BW * 1e3, share=ms / step_ms)
    out["rest"] = dict(ms=step_ms - total, share=(step_ms - total) / step_ms,
                       floor_ms=fb["norms_embed"] / BW * 1e3)
    top = max((c for c in out if c != "rest"), key=lambda c: out[c]["ms"])
    log("    attribution: " + ", ".join(f"{c} {v['ms']:.3f}" for c, v in out.items())
        + f" ms; largest: {top}")
    return out


# =============================================================================== parts
def part_decode(b: Bench) -> None:
    s = b.sizes
    res = b.results.setdefault("decode", {"rows": []})
    res["definition"] = ("one decode step: PluginModel.forward over S streams x 1 token, "
                         "logits of every row, CUDA graph; context = seq_len (cached + the new "
                         "token); full-layer KV rotated INT4, sliding FP8")
    for ctx in s.contexts:
        if not b.enough(20, f"decode ctx {ctx}"):
            break
        cache = make_cache(b, "hadamard-int4", max(s.streams), ctx)
        for n in s.streams:
            if not b.enough(10, f"decode {n}x{ctx}"):
                break
            row = measure_step(b, cache, n, 1, ctx, attrib=not b.args.no_attrib,
                               eager=not b.args.no_eager, label="decode")
            aim = AIMS["step_vs_floor_1"] if n == 1 else \
                AIMS["step_vs_floor_64"] if n == 64 else None
            if aim is not None:
                row["aim_ratio"], row["aim_met"] = aim, row["ratio"] <= aim
            res["rows"].append(row)
            b.save()
        del cache
        b.free()
    if b.cuda and not b.args.tiny and b.bs != 16 and b.enough(20, "decode block 16"):
        # the runtime's default block size (EngineArgs.block_size = 16), one point
        keep = b.bs
        b.bs, b.ring = 16, ring_blocks_needed(b.cfg.sliding_window, 1 + MAX_DRAFTS, 16)
        try:
            cache = make_cache(b, "hadamard-int4", 16, 32768)
            res["block16"] = measure_step(b, cache, 16, 1, 32768, attrib=False, eager=False,
                                          label="decode bs16")
            del cache
        finally:
            b.bs, b.ring = keep, ring_blocks_needed(b.cfg.sliding_window, 1 + MAX_DRAFTS, keep)
            b.free()
    b.save()


def part_verify(b: Bench) -> None:
    s = b.sizes
    res = b.results.setdefault("verify", {"rows": []})
    res["definition"] = (f"one verification pass: S streams x (1 + k) tokens at context "
                         f"{s.verify_context} (cached {s.verify_context - 1} + the new tokens), "
                         "logits of every row, CUDA graph, exact shapes (PluginRunner would pad "
                         "1 + k to a power of two)")
    cache = make_cache(b, "hadamard-int4", max(s.verify_streams),
                       s.verify_context + MAX_DRAFTS)
    for n in s.verify_streams:
        base = None
        for k in s.verify_k:
            q = 1 + k
            if not b.enough(10, f"verify {n}x{q}"):
                break
            row = measure_step(b, cache, n, q, s.verify_context - 1 + q,
                               attrib=q in s.verify_attrib_q and not b.args.no_attrib,
                               eager=not b.args.no_eager, label="verify")
            row["k"] = k
            if k == 0:
                base = row["graph_ms"]
            if base:
                row["vs_1token"] = row["graph_ms"] / base
                log(f"    1 + {k}: {row['vs_1token']:.3f}x the 1-token step")
            if n == 1 and q == 4 and base:
                row["aim_ratio"] = AIMS["verify4_vs_step_1"]
                row["aim_met"] = row["vs_1token"] <= row["aim_ratio"]
            res["rows"].append(row)
            b.save()
    del cache
    b.free()


def part_kv(b: Bench) -> None:
    s, cfg = b.sizes, b.cfg
    res = b.results.setdefault("kv", {"contexts": {}})
    b.free()
    if b.cuda:
        free, total = torch.cuda.mem_get_info()
        budget = free - int(b.args.reserve_gib * GIB)
    else:
        free, total, budget = 0, 0, int(b.args.kv_budget_mib * (1 << 20))
    res.update(device_total_bytes=total, free_after_weights_bytes=free,
               reserve_bytes=int(b.args.reserve_gib * GIB) if b.cuda else 0,
               cache_budget_bytes=budget, weight_bytes=b.results["meta"].get("weight_bytes"),
               max_streams_cap=b.args.kv_max_streams, block_size=b.bs, ring_blocks=b.ring,
               definition=("sessions = floor(cache budget / bytes per session); a session of "
                           "context L holds L positions in each full layer (whole blocks) and "
                           "a ring of window + 1 + 8 positions (whole blocks) in each sliding "
                           "layer; budget = free memory after the weights - reserve "
                           "(activations, graphs, attention partials)"))
    log(f"kv: budget {budget / GIB:.1f} GiB (free {free / GIB:.1f} GiB, reserve "
        f"{b.args.reserve_gib} GiB)")
    for ctx in s.kv_contexts:
        row = {}
        for fmt in ("hadamard-int4", "fp8"):
            per = cache_bytes_per_session(b, fmt, ctx)
            row[fmt] = dict(bytes_per_session=per, sessions=budget // per,
                            bytes_per_token_full_layers=bytes_per_token(cfg, fmt)
                            * sum(not cfg.is_sliding(i) for i in range(cfg.num_hidden_layers)))
        gain = row["hadamard-int4"]["sessions"] / max(1, row["fp8"]["sessions"]) - 1
        row["int4_sessions_gain"] = gain
        if ctx == 65536:
            row["aim_gain"], row["aim_met"] = AIMS["int4_sessions_gain_64k"], \
                gain >= AIMS["int4_sessions_gain_64k"]
        log(f"kv {ctx}: sessions INT4 {row['hadamard-int4']['sessions']}, FP8 "
            f"{row['fp8']['sessions']} ({100 * gain:+.1f} %)")
        res["contexts"][str(ctx)] = row
        b.save()
    for ctx in s.kv_contexts:
        row = res["contexts"][str(ctx)]
        plan = [("hadamard-int4", None), ("fp8", None)]
        plan.append(("hadamard-int4", min(row["fp8"]["sessions"], b.args.kv_max_streams)))
        for fmt, forced in plan:
            n = forced if forced is not None else min(row[fmt]["sessions"],
                                                       b.args.kv_max_streams)
            key = "decode" if forced is None else "decode_at_fp8_batch"
            if n < 1 or not b.enough(40, f"kv decode {fmt} {ctx}"):
                continue
            try:
                row[fmt][key] = full_memory_decode(b, fmt, n, ctx)
            except torch.cuda.OutOfMemoryError as exc:
                row[fmt][key] = {"error": f"out of memory at {n} streams: {str(exc)[:200]}"}
                log(f"kv {fmt} {ctx}: out of memory at {n} streams")
            b.free()
            b.save()
        i4, f8 = row["hadamard-int4"].get("decode", {}), row["fp8"].get("decode", {})
        if "tokens_per_s" in i4 and "tokens_per_s" in f8:
            row["int4_tokens_per_s_gain"] = i4["tokens_per_s"] / f8["tokens_per_s"] - 1
            log(f"kv {ctx}: decode at full memory INT4 {i4['tokens_per_s']:.0f} tok/s "
                f"({i4['streams']} streams), FP8 {f8['tokens_per_s']:.0f} tok/s "
                f"({f8['streams']} streams): {100 * row['int4_tokens_per_s_gain']:+.1f} %")
    b.save()


def full_memory_decode(b: Bench, fmt: str, n: int, ctx: int) -> dict:
    cache = make_cache(b, fmt, n, ctx)
    try:
        meta = step_meta(b, cache, n, 1, ctx)
        fn = step_fn(b, cache, meta)
        fn()
        b.sync()
        ms = med(time_graph(b, fn, max(3, b.sizes.replays // 2)))
    finally:
        del cache
    out = dict(streams=n, step_ms=ms, tokens_per_s=n / (ms * 1e-3),
               cache_bytes=n * cache_bytes_per_session(b, fmt, ctx))
    log(f"  kv decode {fmt} {n} streams @ {ctx}: {ms:.2f} ms/step, "
        f"{out['tokens_per_s']:.0f} tok/s")
    return out


# =============================================================================== drafter
@dataclass
class DrafterLayerW:
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: tuple          # (e4m3 [3·heads·D, H], fp32 [N, H/64]): q, k, v rows fused
    o: tuple
    gu: tuple           # gate rows then up rows
    down: tuple
    spine: tuple | None  # (norm, A, U)
    k_cache: torch.Tensor
    v_cache: torch.Tensor


def make_drafter(b: Bench, dcfg: DrafterConfig, streams: int, context: int) -> dict:
    """Random drafter weights: body block-FP8 (`quantize_block_fp8`: one fp32 scale per row and
    per 64 inputs, so fusing q/k/v or gate/up rows is exact), head slice NVFP4
    (`quantize_nvfp4`), and an FP8 context cache of `context` rows + the 4 block rows per
    stream and layer, random valid data."""
    gen = torch.Generator(device=b.dev).manual_seed(b.args.seed + 99)
    h, d, hq, hkv = dcfg.hidden_size, dcfg.head_dim, dcfg.num_attention_heads, \
        dcfg.num_key_value_heads

    def lin(n, k):
        w = torch.randn((n, k), generator=gen, device=b.dev, dtype=torch.bfloat16)
        return quantize_block_fp8(w.mul_(1 / math.sqrt(k)))

    def gain(n):
        return (1 + 0.1 * torch.randn(n, generator=gen, device=b.dev)).to(torch.bfloat16)

    width = -(-(context + dcfg.block_size) // b.bs)
    layers = []
    for i in range(dcfg.num_hidden_layers):
        kc = torch.empty(streams * width, b.bs, hkv, d, dtype=torch.float8_e4m3fn, device=b.dev)
        vc = torch.empty_like(kc)
        fill_random(b, {"k": kc, "v": vc})
        layers.append(DrafterLayerW(
            gain(h), gain(h), lin((hq + 2 * hkv) * d, h), lin(h, hq * d),
            lin(2 * dcfg.intermediate_size, h), lin(h, dcfg.intermediate_size),
            (gain(h), lin(dcfg.spine_rank, h), lin(h, dcfg.spine_rank)) if i >= 1 else None,
            kc, vc))
    head = torch.randn((dcfg.draft_vocab_size, h), generator=gen, device=b.dev,
                       dtype=torch.bfloat16).mul_(1 / math.sqrt(h))
    r = dcfg.predecessor_rank
    w = dict(cfg=dcfg, layers=layers, fc=lin(h, 2 * h), fuse=lin(h, dcfg.num_taps * h),
             mask=torch.randn(h, generator=gen, device=b.dev).to(torch.bfloat16),
             pA=lin(r, h), pB=lin(r, h), pU=lin(h, r), norm=gain(h),
             tap_norms=[gain(h) for _ in range(dcfg.num_taps)],
             head=quantize_nvfp4(head),
             vocab=torch.randperm(b.cfg.vocab_size, generator=gen,
                                  device=b.dev)[:dcfg.draft_vocab_size])
    del head
    # step inputs: block rows at positions context .. context+3 of each stream's cache
    bsz, dev = dcfg.block_size, b.dev
    tables = torch.randperm(streams * width, generator=gen, device=dev).to(torch.int32)
    tables = tables.view(streams, width).contiguous()
    pos = torch.arange(context, context + bsz, device=dev).repeat(streams)
    row = torch.arange(streams, device=dev).repeat_interleave(bsz)
    cos, sin = ops.rope_cos_sin(pos, d, dcfg.rope_theta)
    one = torch.tensor(1.0, device=dev)
    w["step"] = dict(
        streams=streams, context=context, tables=tables, pos=pos, cos=cos, sin=sin,
        slots=tables[row, pos // b.bs].long() * b.bs + pos % b.bs,
        seq_lens=torch.full((streams,), context + bsz, dtype=torch.int32, device=dev),
        cu=(torch.arange(streams + 1, device=dev) * bsz).to(torch.int32), ks=one, vs=one.clone(),
        fused=torch.randn((streams, h), generator=gen, device=dev).to(torch.bfloat16),
        next_ids=torch.randint(0, b.cfg.vocab_size, (streams,), generator=gen, device=dev),
        taps=torch.randn((streams * bsz, dcfg.num_taps, h), generator=gen,
                         device=dev).to(torch.bfloat16) * 8,
        ctx_ids=torch.randint(0, b.cfg.vocab_size, (streams * bsz,), generator=gen, device=dev))
    return w


def _direct(cls, fn, *args, **kwargs):
    return fn(*args, **kwargs)


def drafter_pass(b: Bench, w: dict, call=_direct) -> torch.Tensor:
    """One block-drafter pass for S streams (`block-drafter.md` §Forward pass) as plugin ops:
    anchor row ctx_p = fc(fused_p, E[t_p+1]) and the mask rows fc(fused_p, mask) in one
    GEMV; 4 layers (spine on rows 1..3 from layer 1, fused QKV, RoPE, K/V of the block rows
    written after the stream's context rows, FP8 paged attention causal over context + block,
    o_proj, fused gate/up, down); then 4 sequential heads (predecessor for rows >= 1 from the
    previous row's draft, final norm, NVFP4 head slice, argmax, draft-vocabulary map).
    Returns int64 [S, 4] drafts. `call(cls, fn, *args)` runs each kernel (recording hook)."""
    c, st = w["cfg"], w["step"]
    s, bsz, h, d = st["streams"], c.block_size, c.hidden_size, c.head_dim
    hq, hkv, inter, eps = c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, \
        c.rms_norm_eps
    embed = b.model.embed
    fused = st["fused"]
    rows_in = torch.cat([torch.cat([fused, F.embedding(st["next_ids"], embed)], -1),
                         torch.cat([fused, w["mask"].expand(s, h)], -1)])
    both = call("body_gemv", fp8_gemv, rows_in, *w["fc"])
    x = torch.cat([both[:s, None], both[s:, None].expand(s, bsz - 1, h)], 1).reshape(s * bsz, h)
    for L in w["layers"]:
        if L.spine is not None:
            xs = x.view(s, bsz, h)
            prev = ops.rms_norm(xs[:, :-1].reshape(-1, h), L.spine[0], eps)
            a = call("body_gemv", fp8_gemv, prev, *L.spine[1])
            delta = call("body_gemv", fp8_gemv, F.silu(a), *L.spine[2]).view(s, bsz - 1, h)
            x = torch.cat([xs[:, :1], xs[:, 1:] + delta], 1).reshape(s * bsz, h)
        qkv = call("body_gemv", fp8_gemv, ops.rms_norm(x, L.in_norm, eps), *L.qkv)
        q = qkv[:, :hq * d].view(-1, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].view(-1, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(-1, hkv, d)
        q, k = ops.apply_rope(q, st["cos"], st["sin"]), ops.apply_rope(k, st["cos"], st["sin"])
        call("attention", fp8_kv_write, k, v, st["slots"], L.k_cache, L.v_cache, st["ks"],
             st["vs"])
        att = call("attention", fp8_paged_attention, q.contiguous(), L.k_cache, L.v_cache,
                   st["ks"], st["vs"], st["tables"], st["seq_lens"], st["cu"],
                   st["context"] + bsz, bsz, window=0)
        x = x + call("body_gemv", fp8_gemv, att.view(-1, hq * d), *L.o)
        gu = call("body_gemv", fp8_gemv, ops.rms_norm(x, L.post_norm, eps), *L.gu)
        act = (F.silu(gu[:, :inter].float()) * gu[:, inter:].float()).to(torch.bfloat16)
        x = x + call("body_gemv", fp8_gemv, act, *L.down)
    xs = x.view(s, bsz, h)
    drafts, prev = [], None
    for j in range(bsz):
        g = xs[:, j]
        if j >= 1:
            e = F.embedding(prev, embed)
            z = call("predecessor", fp8_gemv, g, *w["pA"]) + \
                call("predecessor", fp8_gemv, e, *w["pB"])
            g = g + call("predecessor", fp8_gemv, F.silu(z), *w["pU"])
        logits = call("head", nvfp4_gemv, ops.rms_norm(g, w["norm"], eps), *w["head"])
        prev = w["vocab"][torch.argmax(logits, -1)]
        drafts.append(prev)
    return torch.stack(drafts, 1)


def drafter_context_update(b: Bench, w: dict, call=_direct) -> torch.Tensor:
    """What each verification adds to the drafter (timed apart, not part of a pass): 4 new
    context rows per stream: tap norms + fuse, fc with the next tokens' embeddings, and per
    layer the rows' K/V (k_proj/v_proj rows of the fused QKV weight, RoPE, FP8 cache write)."""
    c, st = w["cfg"], w["step"]
    d, hq, hkv, eps = c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps
    taps = st["taps"]
    normed = torch.cat([ops.rms_norm(taps[:, i], g, eps) for i, g in enumerate(w["tap_norms"])],
                       -1)
    fused = call("body_gemv", fp8_gemv, normed, *w["fuse"])
    ctx = call("body_gemv", fp8_gemv,
               torch.cat([fused, F.embedding(st["ctx_ids"], b.model.embed)], -1), *w["fc"])
    for L in w["layers"]:
        wq, sq = L.qkv
        kv = call("body_gemv", fp8_gemv, ops.rms_norm(ctx, L.in_norm, eps), wq[hq * d:],
                  sq[hq * d:])
        k = ops.apply_rope(kv[:, :hkv * d].view(-1, hkv, d), st["cos"], st["sin"])
        call("attention", fp8_kv_write, k, kv[:, hkv * d:].view(-1, hkv, d), st["slots"],
             L.k_cache, L.v_cache, st["ks"], st["vs"])
    return ctx


def drafter_bytes(w: dict) -> dict:
    def nb(t):
        return t.numel() * t.element_size()
    c = w["cfg"]
    body = sum(nb(t) for L in w["layers"] for pair in (L.qkv, L.o, L.gu, L.down)
               for t in pair) + sum(nb(t) for L in w["layers"] if L.spine
                                    for t in (*L.spine[1], *L.spine[2]))
    body += sum(nb(t) for t in w["fc"])
    pred = sum(nb(t) for p in ("pA", "pB", "pU") for t in w[p])
    head = sum(nb(t) for t in w["head"])
    st = w["step"]
    kv = (c.num_hidden_layers * st["streams"] * (st["context"] + c.block_size) * 2
          * c.num_key_value_heads * c.head_dim)
    return dict(body_gemv=body, predecessor=pred, head_per_row=head,
                head=head * c.block_size, attention=kv,
                total=body + pred + head * c.block_size + kv)


def part_drafter(b: Bench) -> None:
    s = b.sizes
    dcfg = tiny_drafter_config(b.cfg) if b.args.tiny else DrafterConfig()
    res = b.results.setdefault("drafter", {"rows": []})
    res["definition"] = (
        "no drafter kernel path exists yet: one pass is timed as plugin ops in a CUDA graph - "
        "block-FP8 fp8_gemv ([N, K/64] scales) for fc (anchor + mask rows in one GEMV), spine, "
        "fused QKV, o_proj, fused gate/up, down, predecessor; RoPE; fp8_kv_write of the 4 block "
        f"rows and fp8_paged_attention (FP8 cache, causal over {dcfg.context_window} context "
        "rows + the block; the reference drafter keeps bf16 context K/V); the NVFP4 head slice "
        f"({dcfg.draft_vocab_size} x {dcfg.hidden_size}) via nvfp4_gemv once per block row "
        "(4 sequential heads), argmax. Not included: the context update after verification "
        "(timed apart as 'context_update'), sampling. Serving depth 2 = 2 passes + 1 update.")
    res["config"] = {k: getattr(dcfg, k) for k in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "block_size", "context_window", "predecessor_rank", "spine_rank",
        "draft_vocab_size")}
    ctx = s.drafter_context
    cache = make_cache(b, "hadamard-int4", max(s.drafter_streams), ctx + MAX_DRAFTS)
    for n in s.drafter_streams:
        if not b.enough(30, f"drafter {n}"):
            break
        w = make_drafter(b, dcfg, n, dcfg.context_window)
        fn = lambda: drafter_pass(b, w)            # noqa: E731
        drafts = fn()
        b.sync()
        assert drafts.shape == (n, dcfg.block_size)
        calls = []

        def rec(cls, f, *a, **k):
            calls.append((cls, f, a, k))
            return f(*a, **k)
        drafter_pass(b, w, rec)
        b.sync()
        reps = s.replays
        g_ms = med(time_graph(b, fn, reps))
        e_ms = med(time_eager(b, fn, s.eager_reps)) if not b.args.no_eager else None
        upd = lambda: drafter_context_update(b, w)  # noqa: E731
        upd()
        u_ms = med(time_graph(b, upd, reps))
        fb = drafter_bytes(w)
        attrib = {}
        base = med(time_graph(b, lambda: flush_l2(b), reps)) if b.cuda else 0.0
        for cls in ("body_gemv", "attention", "predecessor", "head"):
            run, k = replay_calls(calls, cls, b)
            ms = max(0.0, med(time_graph(b, run, reps)) - base)
            attrib[cls] = dict(ms=ms, calls=k, floor_ms=fb[cls] / BW * 1e3)
        attrib["rest"] = dict(ms=g_ms - sum(v["ms"] for v in attrib.values()))
        target = measure_step(b, cache, n, 1, ctx, attrib=False, eager=False,
                              label="drafter: target decode")
        target9 = measure_step(b, cache, n, 1 + MAX_DRAFTS, ctx - 1 + 1 + MAX_DRAFTS,
                               attrib=False, eager=False, label="drafter: target verify 1+8")
        row = dict(streams=n, rows=n * dcfg.block_size, pass_graph_ms=g_ms, pass_eager_ms=e_ms,
                   pass_floor_ms=fb["total"] / BW * 1e3, bytes=fb, attribution=attrib,
                   context_update_ms=u_ms, target_step_ms=target["graph_ms"],
                   target_verify9_ms=target9["graph_ms"], target_context=ctx,
                   pass_vs_target_step=g_ms / target["graph_ms"],
                   depth2_round_ms=2 * g_ms + u_ms)
        log(f"drafter {n} streams: pass {g_ms:.3f} ms (floor {row['pass_floor_ms']:.3f}), "
            f"{row['pass_vs_target_step']:.3f}x the target decode step ({target['graph_ms']:.3f} "
            f"ms); context update {u_ms:.3f} ms; " + ", ".join(
                f"{c} {v['ms']:.3f}" for c, v in attrib.items()))
        res["rows"].append(row)
        w = calls = fn = upd = None      # free the drafter before the next batch size
        b.free()
        b.save()
    del cache
    b.free()


# =============================================================================== figures
def figures(b: Bench) -> list[str]:
    """One PNG per figure if matplotlib imports; [] otherwise."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:       # noqa: BLE001 - absent or broken: no figures
        log("matplotlib not importable: no figures")
        return []
    r, made = b.results, []

    def save(fig, name):
        path = b.out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(str(path))

    rows = r.get("decode", {}).get("rows", [])
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for ctx in sorted({x["seq_len"] for x in rows}):
            sel = [x for x in rows if x["seq_len"] == ctx]
            line, = ax.plot([x["streams"] for x in sel], [x["graph_ms"] for x in sel], "o-",
                            label=f"step, {ctx // 1024 or ctx}{'k' if ctx >= 1024 else ''}")
            ax.plot([x["streams"] for x in sel], [x["floor_ms"] for x in sel], "--",
                    color=line.get_color(), label="floor")
        ax.set(xscale="log", yscale="log", xlabel="streams", ylabel="ms per decode step",
               title="Decode step (CUDA graph) vs bandwidth floor")
        ticks = sorted({x["streams"] for x in rows})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.minorticks_off()
        ax.legend(fontsize=7)
        save(fig, "decode.png")
        withattr = [x for x in rows if "attribution" in x]
        if withattr:
            fig, ax = plt.subplots(figsize=(9, 4.5))
            classes = list(ATTR_CLASSES) + ["rest"]
            bottom = [0.0] * len(withattr)
            for c in classes:
                vals = [max(0.0, x["attribution"].get(c, {}).get("ms", 0.0)) for x in withattr]
                ax.bar(range(len(withattr)), vals, bottom=bottom, label=c)
                bottom = [u + v for u, v in zip(bottom, vals)]
            ax.set_xticks(range(len(withattr)))
            ax.set_xticklabels([f"{x['streams']}x{x['seq_len'] // 1024 or x['seq_len']}"
                                for x in withattr], rotation=45, fontsize=7)
            ax.set(ylabel="ms", title="Decode step by kernel class (each alone in a graph)")
            ax.legend(fontsize=7)
            save(fig, "attribution.png")
        eager = [x for x in rows if "eager_ms" in x]
        if eager:
            fig, ax = plt.subplots(figsize=(9, 4))
            xs = range(len(eager))
            ax.bar([i - 0.2 for i in xs], [x["graph_ms"] for x in eager], 0.4, label="graph")
            ax.bar([i + 0.2 for i in xs], [x["eager_ms"] for x in eager], 0.4, label="eager")
            ax.set_xticks(list(xs))
            ax.set_xticklabels([f"{x['streams']}x{x['seq_len'] // 1024 or x['seq_len']}"
                                for x in eager], rotation=45, fontsize=7)
            ax.set(ylabel="ms", yscale="log", title="CUDA graphs vs eager (decode steps)")
            ax.legend()
            save(fig, "graphs_vs_eager.png")
    rows = r.get("verify", {}).get("rows", [])
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in sorted({x["streams"] for x in rows}):
            sel = [x for x in rows if x["streams"] == n and "vs_1token" in x]
            ax.plot([x["q"] for x in sel], [x["vs_1token"] for x in sel], "o-",
                    label=f"{n} stream(s)")
        ax.axhline(AIMS["verify4_vs_step_1"], ls=":", color="grey", label="aim at 4 tokens")
        ax.set(xlabel="tokens per stream (1 + k)", ylabel="time / 1-token step",
               title="Verification cost")
        ax.legend()
        save(fig, "verify.png")
    kv = r.get("kv", {}).get("contexts", {})
    if kv:
        fig, axes = plt.subplots(1, 2, figsize=(9, 4))
        ctxs = sorted(kv, key=int)
        for j, fmt in enumerate(("hadamard-int4", "fp8")):
            off = -0.2 + 0.4 * j
            axes[0].bar([i + off for i in range(len(ctxs))],
                        [kv[c][fmt]["sessions"] for c in ctxs], 0.4, label=fmt)
            axes[1].bar([i + off for i in range(len(ctxs))],
                        [kv[c][fmt].get("decode", {}).get("tokens_per_s", 0) for c in ctxs],
                        0.4, label=fmt)
        for ax, t in zip(axes, ("sessions that fit", "decode tok/s at full memory")):
            ax.set_xticks(range(len(ctxs)))
            ax.set_xticklabels([f"{int(c) // 1024}k" for c in ctxs])
            ax.set_title(t)
            ax.legend(fontsize=7)
        save(fig, "kv.png")
    rows = r.get("drafter", {}).get("rows", [])
    if rows:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = range(len(rows))
        ax.bar([i - 0.2 for i in xs], [x["pass_graph_ms"] for x in rows], 0.4,
               label="drafter pass")
        ax.bar([i + 0.2 for i in xs], [x["target_step_ms"] for x in rows], 0.4,
               label="target decode step")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{x['streams']} stream(s)" for x in rows])
        ax.set(ylabel="ms", title="Drafter pass vs target step")
        ax.legend()
        save(fig, "drafter.png")
    return made


# =============================================================================== summary
def summary(b: Bench) -> None:
    """The headline numbers again, compactly, at the end of the output."""
    r = b.results
    log("== summary")
    for x in r.get("decode", {}).get("rows", []):
        att = x.get("attribution", {})
        top = max((c for c in att if c != "rest"), key=lambda c: att[c]["ms"], default=None)
        aim = f" aim {x['aim_ratio']}x {'met' if x['aim_met'] else 'NOT met'}" \
            if "aim_ratio" in x else ""
        log(f"decode {x['streams']:3d} x {x['seq_len']:6d}: {x['graph_ms']:8.3f} ms graph, "
            f"{x.get('eager_ms', float('nan')):8.3f} ms eager, floor {x['floor_ms']:7.3f} ms, "
            f"{x['ratio']:5.2f}x floor{aim}" + (f"; largest class {top} "
                                                 f"{att[top]['ms']:.3f} ms" if top else ""))
    for x in r.get("verify", {}).get("rows", []):
        if "vs_1token" in x:
            aim = f" (aim {x['aim_ratio']}x: {'met' if x['aim_met'] else 'NOT met'})" \
                if "aim_ratio" in x else ""
            log(f"verify {x['streams']:3d} x (1+{x['k']}): {x['graph_ms']:8.3f} ms, "
                f"{x['vs_1token']:.3f}x the 1-token step{aim}")
    for ctx, x in r.get("kv", {}).get("contexts", {}).items():
        i4, f8 = x["hadamard-int4"], x["fp8"]
        tps = lambda d: d.get("decode", {}).get("tokens_per_s", float("nan"))  # noqa: E731
        aim = f" (aim +{100 * x['aim_gain']:.0f} %: {'met' if x['aim_met'] else 'NOT met'})" \
            if "aim_gain" in x else ""
        label = f"{int(ctx) // 1024}k" if int(ctx) >= 1024 else ctx
        log(f"kv {label}: sessions INT4 {i4['sessions']} / FP8 {f8['sessions']} "
            f"({100 * x['int4_sessions_gain']:+.1f} %){aim}; full-memory decode INT4 "
            f"{tps(i4):.0f} tok/s, FP8 {tps(f8):.0f} tok/s (cap {b.args.kv_max_streams} streams)")
    for x in r.get("drafter", {}).get("rows", []):
        log(f"drafter {x['streams']} stream(s): pass {x['pass_graph_ms']:.3f} ms = "
            f"{x['pass_vs_target_step']:.3f}x the target decode step "
            f"({x['target_step_ms']:.3f} ms at {x['target_context']}); depth-2 round "
            f"{x['depth2_round_ms']:.3f} ms")
    for e in r.get("errors", []):
        log(f"error in {e['part']}: {e['error']}")


# =============================================================================== main
PARTS = {"decode": part_decode, "verify": part_verify, "kv": part_kv, "drafter": part_drafter}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSON and the PNGs")
    p.add_argument("--parts", default="decode,verify,kv,drafter",
                   help="comma list of " + ", ".join(PARTS) + " (or 'all')")
    p.add_argument("--tiny", action="store_true",
                   help="dry run: a tiny config, device cpu, the kernels' torch references")
    p.add_argument("--device", default=None, help="cuda (default) or cpu (default with --tiny)")
    p.add_argument("--block-size", type=int, default=64,
                   help="KV block size (the attention kernels were tuned at 64; the runtime's "
                        "default is 16: decode adds one 16x32k point at 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=480.0,
                   help="seconds from start after which no new measurement starts")
    p.add_argument("--reserve-gib", type=float, default=4.0,
                   help="memory kept free of KV in the kv part (activations, graph pools)")
    p.add_argument("--kv-max-streams", type=int, default=256,
                   help="cap on the full-memory batch (streams per step)")
    p.add_argument("--kv-budget-mib", type=float, default=6.0,
                   help="cache budget on CPU (--tiny), where free memory is not measured")
    p.add_argument("--no-eager", action="store_true", help="skip the eager timings")
    p.add_argument("--no-attrib", action="store_true", help="skip the per-class attribution")
    args = p.parse_args(argv)
    args.parts = list(PARTS) if args.parts == "all" else [x for x in args.parts.split(",") if x]
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        p.error(f"--parts: unknown {bad}; choose from {list(PARTS)}")
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device (use --tiny for a CPU dry run)")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    b = Bench(args)
    meta = b.results["meta"]
    meta.update(argv=sys.argv[1:], parts=args.parts, device=str(b.dev), tiny=args.tiny,
                torch=torch.__version__, python=platform.python_version(), block_size=b.bs,
                ring_blocks=b.ring, bandwidth_Bps=BW, aims=AIMS, config=b.cfg.to_dict(),
                started=time.strftime("%Y-%m-%d %H:%M:%S"))
    if b.cuda:
        props = torch.cuda.get_device_properties(b.dev)
        meta.update(gpu=props.name, gpu_total_bytes=props.total_memory)
        try:
            import triton
            meta["triton"] = triton.__version__
        except ImportError:
            meta["triton"] = None
    log(f"fullsize: parts {args.parts} on {b.dev} ({meta.get('gpu', 'cpu')}), budget "
        f"{args.budget:.0f} s, block {b.bs}")
    torch.set_grad_enabled(False)
    status = 0
    try:
        build_engine(b)
        b.save()
        for name in args.parts:
            if not b.enough(15, f"part {name}"):
                continue
            t = time.monotonic()
            log(f"== {name} ({b.elapsed():.0f} s elapsed)")
            try:
                PARTS[name](b)
            except Exception as exc:    # noqa: BLE001 - record, go on with the next part
                status = 1
                tb = traceback.format_exc()
                b.results["errors"].append({"part": name, "error": repr(exc), "traceback": tb})
                log(f"ERROR in part {name}: {exc!r}\n{tb}")
            b.results.setdefault("part_seconds", {})[name] = round(time.monotonic() - t, 1)
            b.free()
            b.save()
    except Exception as exc:            # noqa: BLE001 - the engine build itself failed
        status = 1
        b.results["errors"].append({"part": "engine", "error": repr(exc),
                                    "traceback": traceback.format_exc()})
        log(f"ERROR building the engine: {exc!r}\n{traceback.format_exc()}")
    b.results["figures"] = figures(b)
    try:
        summary(b)
    except Exception as exc:            # noqa: BLE001 - the JSON is what counts
        log(f"(summary failed: {exc!r})")
    meta["total_s"] = round(b.elapsed(), 1)
    path = b.save()
    log(f"wrote {path} ({meta['total_s']} s)" + (" with errors" if status else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
