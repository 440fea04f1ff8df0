"""Paged KV cache: FP8 (or bf16) sliding layers in a per-stream ring, rotated INT4 (or FP8 or
bf16) full layers in blocks that grow with the stream.

Formats: `shared/spec/kv-cache.md`; layouts: `plugins/LAYOUTS.md` (the kernels read these
tensors directly). Sliding layers only ever need the last `sliding_window` positions plus the
tokens of one step, so each stream owns a fixed ring of `ring_blocks` physical blocks there and
logical block b maps to ring[b % ring_blocks]; keys outside the window are never read, so
reusing their slots is safe. Full layers keep every position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kolibri_trt_plugins.fp8_kv_write import fp8_kv_write
from kolibri_trt_plugins.qk_norm_fold_int4 import (dequantize_int4_ref, int4_rows,
                                                   int4_value_codes, quantize_int4_ref,
                                                   set_int4_value_codes)

from ..config import KolibriConfig

if TYPE_CHECKING:
    from .engine_args import EngineArgs

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
INT4_FULL = ("hadamard-int4", "int4")


@dataclass(frozen=True)
class KVPlan:
    """Cache formats from the manifest: sliding "fp8" | "bf16"; full "hadamard-int4" | "int4"
    | "fp8" | "bf16"."""

    sliding: str
    full: str


@dataclass(frozen=True)
class CacheGeometry:
    """Sizes of the cache. block_size in tokens; num_*_blocks: physical blocks per pool;
    ring_blocks: sliding blocks each stream owns (>= ceil((window + max step tokens)/bs) + 1)."""

    block_size: int
    num_full_blocks: int
    num_sliding_blocks: int
    ring_blocks: int


def ring_blocks_needed(window: int, max_step_tokens: int, block_size: int) -> int:
    """Blocks a sliding ring needs so that one step's new tokens never overwrite a key that a
    query of the same step can still see: the span is window + step - 1 positions, which
    touches at most ceil(span / bs) + 1 blocks."""
    span = window + max_step_tokens - 1
    return -(-span // block_size) + 1


def bytes_per_token(cfg: KolibriConfig, fmt: str) -> int:
    """Bytes of K and V for one token of one layer in format `fmt`."""
    per_head = {"bf16": 2 * cfg.head_dim, "fp8": cfg.head_dim,
                "hadamard-int4": cfg.head_dim // 2 + 4, "int4": cfg.head_dim // 2 + 4}[fmt]
    return 2 * cfg.num_key_value_heads * per_head


class KVCache:
    """The cache tensors of every layer, with write and gather in plain torch (the CPU path).

    Per sliding layer: k, v [num_sliding_blocks, bs, Hkv, D] (fp8 or bf16) and fp32 scalar
    k_scale, v_scale. Per full layer: int4 -> k_codes uint8 [nb, Hkv, bs, D/2], v_codes uint8
    [nb, Hkv, D/2, bs] (dim-major) and k_meta, v_meta fp16 [nb, Hkv, bs, 2] (head-major pages,
    plugins/LAYOUTS.md); fp8 / bf16 -> k, v [nb, bs, Hkv, D].
    """

    def __init__(self, cfg: KolibriConfig, plan: KVPlan, geometry: CacheGeometry,
                 scales: dict[int, tuple[float, float]], device: torch.device | str = "cpu"):
        self.cfg, self.plan, self.geometry = cfg, plan, geometry
        self.layers: list[dict[str, torch.Tensor]] = []
        bs, hkv, d = geometry.block_size, cfg.num_key_value_heads, cfg.head_dim
        for i in range(cfg.num_hidden_layers):
            fmt = plan.sliding if cfg.is_sliding(i) else plan.full
            nb = geometry.num_sliding_blocks if cfg.is_sliding(i) else geometry.num_full_blocks
            if fmt in INT4_FULL:
                t = {"k_codes": torch.zeros(nb, hkv, bs, d // 2, dtype=torch.uint8, device=device),
                     "k_meta": torch.zeros(nb, hkv, bs, 2, dtype=torch.float16, device=device)}
                t["v_codes"] = torch.zeros(nb, hkv, d // 2, bs, dtype=torch.uint8, device=device)
                t["v_meta"] = torch.zeros_like(t["k_meta"])
            else:
                dtype = FP8 if fmt == "fp8" else torch.bfloat16
                t = {"k": torch.zeros(nb, bs, hkv, d, dtype=dtype, device=device)}
                t["v"] = torch.zeros_like(t["k"])
            ks, vs = scales.get(i, (1.0, 1.0))
            t["k_scale"] = torch.tensor(ks, dtype=torch.float32, device=device)
            t["v_scale"] = torch.tensor(vs, dtype=torch.float32, device=device)
            self.layers.append(t)

    def format(self, layer: int) -> str:
        return self.plan.sliding if self.cfg.is_sliding(layer) else self.plan.full

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store new keys/values. k, v: [T, Hkv, D] (for INT4 layers k is already rotated,
        M_k·rms(k)); slots int64 [T] physical slots of this layer's pool."""
        t, fmt = self.layers[layer], self.format(layer)
        if fmt in INT4_FULL:
            rows = self._int4_rows(t, slots)
            for name, x in (("k", k), ("v", v)):
                codes, meta = quantize_int4_ref(x.float())
                if name == "k":
                    t["k_codes"].view(-1, codes.shape[-1])[rows] = codes
                else:   # dim-major value pages
                    set_int4_value_codes(t["v_codes"], slots, codes)
                t[f"{name}_meta"].view(-1, 2)[rows] = meta
        elif fmt == "fp8":
            fp8_kv_write(k, v, slots, t["k"], t["v"], t["k_scale"], t["v_scale"])
        else:
            t["k"].view(-1, *k.shape[1:])[slots] = k.to(torch.bfloat16)
            t["v"].view(-1, *v.shape[1:])[slots] = v.to(torch.bfloat16)

    @staticmethod
    def _int4_rows(t: dict, slots: torch.Tensor) -> torch.Tensor:
        """Flat rows [n, Hkv] of `slots` in a layer's head-major INT4 pages."""
        return int4_rows(slots, t["k_codes"].shape[1], t["k_codes"].shape[2])

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized keys and values at `slots` (int64 [n]): fp32 [n, Hkv, D] each."""
        t, fmt = self.layers[layer], self.format(layer)
        rows = self._int4_rows(t, slots) if fmt in INT4_FULL else None
        out = []
        for name in ("k", "v"):
            if fmt in INT4_FULL:
                codes = (t["k_codes"].view(-1, t["k_codes"].shape[-1])[rows] if name == "k"
                         else int4_value_codes(t["v_codes"], slots))
                meta = t[f"{name}_meta"].view(-1, 2)[rows]
                out.append(dequantize_int4_ref(codes, meta))
            else:
                x = t[name].view(-1, *t[name].shape[2:])[slots].float()
                out.append(x * t[f"{name}_scale"] if fmt == "fp8" else x)
        return out[0], out[1]


def plan_cache(cfg, plan, args: EngineArgs, max_step_tokens: int) -> CacheGeometry:
    """Split `kv_cache_memory` between the sliding rings (one per stream) and full blocks.

    Raises:
        ValueError: naming kv_cache_memory when it cannot hold one stream of max_model_len.
    """
    bs = args.block_size
    ring = ring_blocks_needed(cfg.sliding_window, max_step_tokens, bs)
    n_sliding = sum(cfg.is_sliding(i) for i in range(cfg.num_hidden_layers))
    n_full = cfg.num_hidden_layers - n_sliding
    sliding_block = bs * bytes_per_token(cfg, plan.sliding) * n_sliding
    full_block = max(1, bs * bytes_per_token(cfg, plan.full) * n_full)
    sliding_bytes = ring * args.max_num_seqs * sliding_block
    num_full = (args.kv_cache_memory - sliding_bytes) // full_block if n_full else 1 << 20
    need = -(-args.max_model_len // bs)
    if num_full < need:
        raise ValueError(f"kv_cache_memory: {args.kv_cache_memory} bytes hold {max(num_full, 0)} "
                         f"full-layer blocks after {sliding_bytes} bytes of sliding rings; one "
                         f"stream of max_model_len={args.max_model_len} needs {need}")
    return CacheGeometry(bs, int(num_full), ring * args.max_num_seqs, ring)
