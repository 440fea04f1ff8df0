"""Build timings per stage, and a full-size (77B) estimate extrapolated from them.

Each stage records wall seconds and the amount of work it did in its natural unit (elements
quantized, bytes read or written, token-parameters run); the full-size estimate divides the
full model's work by the measured throughput. Memory and disk follow from tensor sizes.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from ..config import KolibriConfig
from ..drafter import DrafterConfig, KolibriBlockDrafter
from ..model.reference import KolibriForCausalLM

UNITS = {"startup": "fixed", "load": "bytes", "calibrate": "token-params", "modelopt_fp8": "elements",
         "nvfp4": "elements", "block_fp8": "elements", "write": "bytes", "hash": "bytes"}


@dataclass
class Stage:
    seconds: float = 0.0
    work: float = 0.0          # in UNITS[stage]


@dataclass
class BuildStats:
    """Per-stage seconds and work of one build (never written into the engine)."""

    stages: dict[str, Stage] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str, work: float = 0.0):
        st = self.stages.setdefault(name, Stage())
        t0 = time.perf_counter()
        try:
            yield st
        finally:
            st.seconds += time.perf_counter() - t0
            st.work += work

    def throughput(self, name: str) -> float | None:
        st = self.stages.get(name)
        return st.work / st.seconds if st and st.seconds > 0 and st.work > 0 else None


def stage_work(cfg: KolibriConfig, dcfg: DrafterConfig, calib_tokens: int) -> dict[str, float]:
    """The work of each stage for a target `cfg` + drafter `dcfg` (bf16 sources): source bytes,
    calibration token-params (tokens x active params of the reference forward), FP8 elements,
    NVFP4 head elements, block-FP8 elements, engine bytes written, bytes hashed."""
    with torch.device("meta"):
        t = KolibriForCausalLM.expected_shapes(cfg)
        d = KolibriBlockDrafter.expected_shapes(dcfg)
    n = {k: _numel(s) for k, s in t.items()}
    attn = sum(v for k, v in n.items() if "self_attn." in k and k.endswith("_proj.weight"))
    experts = sum(v for k, v in n.items() if ".mlp.experts." in k)
    shared = sum(v for k, v in n.items() if ".mlp.shared_expert." in k)
    head = n["lm_head.weight"]
    draft_head = dcfg.draft_vocab_size * cfg.hidden_size
    block = sum(_numel(s) for s in d.values() if len(s) == 2)
    fp8 = attn + experts + shared
    rest = sum(n.values()) - fp8 - head + sum(_numel(s) for s in d.values() if len(s) == 1)
    active = attn + shared + experts * cfg.num_experts_per_tok / cfg.num_experts
    source = 2 * (sum(n.values()) + sum(_numel(s) for s in d.values()))
    engine = fp8 + 2 * rest + (head + draft_head) * 9 / 16 + block * (1 + 4 / 64)
    return {"load": source, "calibrate": calib_tokens * active, "modelopt_fp8": fp8,
            "nvfp4": head + draft_head, "block_fp8": block, "write": engine,
            "hash": source + engine, "_engine_bytes": engine, "_source_bytes": source}


def _numel(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def estimate_full_size(stats: BuildStats, calib_tokens: int) -> dict:
    """Seconds per stage at full size from this build's throughput, plus memory and disk.

    Memory: this builder holds the bf16 model, its FP8 copy and the calibration captures at
    once (no streaming), so peak RAM ~ source bytes + engine bytes + captures.
    """
    work = stage_work(KolibriConfig(), DrafterConfig(), calib_tokens)
    seconds = {}
    for name, unit in UNITS.items():
        rate, st = stats.throughput(name), stats.stages.get(name)
        if unit == "fixed":
            seconds[name] = st.seconds if st else None
        else:
            seconds[name] = None if rate is None else work[name] / rate
    cfg = KolibriConfig()
    captures = calib_tokens * cfg.hidden_size * 2 * 4 * cfg.num_hidden_layers
    return {"seconds": seconds, "total_seconds": sum(s for s in seconds.values() if s),
            "peak_ram_bytes": work["_source_bytes"] + work["_engine_bytes"] + captures,
            "disk_bytes": work["_engine_bytes"], "source_bytes": work["_source_bytes"],
            "throughput": {k: stats.throughput(k) for k in UNITS}}


def format_report(stats: BuildStats, calib_tokens: int) -> str:
    """Human-readable stage timings and the full-size estimate."""
    lines = ["stage          seconds   throughput"]
    for name, unit in UNITS.items():
        st, rate = stats.stages.get(name), stats.throughput(name)
        if st:
            lines.append(f"{name:<14}{st.seconds:8.2f}   "
                         + (f"{rate:.3g} {unit}/s" if rate else "-"))
    est = estimate_full_size(stats, calib_tokens)
    lines.append("full-size (77B) estimate from these rates:")
    for name, s in est["seconds"].items():
        lines.append(f"  {name:<14}" + ("-" if s is None else f"{s / 60:8.1f} min"))
    lines.append(f"  total {est['total_seconds'] / 3600:.2f} h; peak RAM ~"
                 f"{est['peak_ram_bytes'] / 2**30:.0f} GiB; engine on disk ~"
                 f"{est['disk_bytes'] / 2**30:.0f} GiB (source {est['source_bytes'] / 2**30:.0f} GiB)")
    return "\n".join(lines)
