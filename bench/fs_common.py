"""bench/fullsize.py, part 1 of 5: settings, the timing harness and the synthetic engine."""

from __future__ import annotations

import gc
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt.builder import synthetic  # noqa: E402
from kolibri_trt.config import KolibriConfig  # noqa: E402
from kolibri_trt.drafter.config import DrafterConfig  # noqa: E402
from kolibri_trt.fixtures import tiny_target_config  # noqa: E402
from kolibri_trt.runtime.kv_cache import ring_blocks_needed  # noqa: E402


BW = 4.14e12                 # measured HBM read bandwidth of the H200, B/s (notes/h200.md)
GIB = 1 << 30
MAX_DRAFTS = 8               # num_speculative_tokens: the sliding ring holds 1 + 8 new tokens
AIMS = {"step_vs_floor_1": 1.25, "step_vs_floor_64": 1.5, "int4_sessions_gain_64k": 0.85,
        "verify4_vs_step_1": 1.15}
OPS = ("fp8_gemv", "fp8_wgmma", "nvfp4_gemv", "nvfp4_wgmma", "moe_forward", "fp8_paged_attention",
       "int4_paged_attention", "qk_norm_fold_int4", "qk_norm_rope_kv_write", "add_rms_norm",
       "fp8_gemv_add_rms_norm")
ATTR_CLASSES = ("attn_sliding", "attn_full", "qkv", "o_proj", "moe", "head", "norms")


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
        self.tag = "_".join(args.parts)  # "+" would not survive the device copy-back
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

