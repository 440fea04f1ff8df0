"""Tensor-parallel shards of the target: one weight folder per rank (TensorRT-LLM's layout idea).

Layout (`engine_format.py`): `<engine>/target/rank{r}/model.safetensors` (or shards + index) for
r = 0 .. tp_size - 1, beside the one `config.json` (the full model's), `hf_quant_config.json`
and tokenizer files in `<engine>/target/`; `manifest.json` records `tp_size`.

Split (Megatron style; rank r holds the r-th of tp_size equal contiguous pieces):
- column parallel, output rows (dim 0): `self_attn.{q,k,v}_proj` (q by query head, k/v by KV
  head: 20 q / 4 kv heads -> 10 / 2 per rank at TP2) and the `{gate,up}_proj` of every routed
  expert and of the shared expert (by intermediate channel);
- row parallel, input columns (dim 1): `self_attn.o_proj` and every `down_proj`; the runtime
  all-reduces their partial sums (`runtime/tensor_parallel.py`);
- replicated: `embed_tokens`, every norm (q_norm / k_norm are per head_dim), the router
  `mlp.gate`, `lm_head` (every shard holds it; only rank 0 runs it), the KV-plan tensors
  (`k_scale` / `v_scale` scalars, `q_rotation` / `k_rotation` [D, D] per head_dim).
Quantized linears: per-tensor scales (`weight_scale` [], `weight_scale_2`, `input_scale`) are
copied to every shard; block scales ([N, K/16] NVFP4, [N, ceil(K/64)] block FP8) follow their
rows (column parallel) or whole blocks of K (row parallel, which needs K / tp_size to be a
multiple of the block); NVFP4's two codes per byte lie along K, so a K split halves bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from ..checkpoint import save_tensors
from ..config import KolibriConfig
from ..engine_format import BLOCK_FP8_GROUP, NVFP4_GROUP, rank_dir
from .errors import BuildError

COLUMN_PARALLEL = (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.",
                   ".gate_proj.", ".up_proj.")
ROW_PARALLEL = (".self_attn.o_proj.", ".down_proj.")
# inputs per scale of the block formats (row-parallel splits must not cut a block)
BLOCK_GROUPS = {"block_fp8": BLOCK_FP8_GROUP, "nvfp4": NVFP4_GROUP}
# weight group -> the row-parallel linears in it and their input width K
_ROW_INPUTS = {"attention": lambda c: c.num_attention_heads * c.head_dim,
               "experts": lambda c: c.moe_intermediate_size,
               "shared_expert": lambda c: c.shared_expert_intermediate_size}


def split_kind(name: str) -> str | None:
    """"column", "row" or None (replicated) for target tensor `name`."""
    if any(p in name for p in COLUMN_PARALLEL):
        return "column"
    if any(p in name for p in ROW_PARALLEL):
        return "row"
    return None


def check_tp(cfg: KolibriConfig, tp_size: int, formats: Mapping[str, str] | None = None) -> None:
    """Raises ValueError naming the config field (or weight group) that `tp_size` cannot split:
    query heads, KV heads, the routed and shared intermediate sizes must divide evenly, and a
    row-parallel block-quantized group needs K / tp_size to be a multiple of its block.
    formats: weight group -> format (`manifest["weights"]["target"]`), None skips that check."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size: must be an int >= 1, got {tp_size!r}")
    sizes = {"num_attention_heads": cfg.num_attention_heads,
             "num_key_value_heads": cfg.num_key_value_heads,
             "moe_intermediate_size": cfg.moe_intermediate_size,
             "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size}
    for field, value in sizes.items():
        if value % tp_size:
            raise ValueError(f"{field}={value} of {cfg.source or 'the config'} is not divisible "
                             f"by tp_size={tp_size} (each rank must get an equal share)")
    for group, k_of in _ROW_INPUTS.items():
        fmt = (formats or {}).get(group, "bf16")
        block = BLOCK_GROUPS.get(fmt)
        k = k_of(cfg)
        if block is not None and k and (k // tp_size) % block:
            raise ValueError(f"weights.{group}: format {fmt!r} has blocks of {block} inputs; "
                             f"the row-parallel split of K={k} by tp_size={tp_size} cuts a block")


def shard_config(cfg: KolibriConfig, tp_size: int) -> KolibriConfig:
    """The config one rank's modules are built with: query / KV heads and the routed / shared
    intermediate sizes divided by tp_size, everything else (hidden size, vocab, experts,
    layers) unchanged. Raises ValueError as `check_tp`."""
    check_tp(cfg, tp_size)
    return cfg.replace(num_attention_heads=cfg.num_attention_heads // tp_size,
                       num_key_value_heads=cfg.num_key_value_heads // tp_size,
                       moe_intermediate_size=cfg.moe_intermediate_size // tp_size,
                       shared_expert_intermediate_size=cfg.shared_expert_intermediate_size
                       // tp_size)


def shard_tensor(name: str, t: torch.Tensor, rank: int, tp_size: int) -> torch.Tensor:
    """Rank `rank`'s piece of tensor `name` (any dtype; a contiguous copy).

    Column parallel: dim 0 split (weight [N, K or K/2] and any non-scalar scale). Row parallel:
    dim 1 split of 2-D tensors (weight, block scales); scalars and per-output-row [N] scales
    are copied. Replicated tensors are returned as they are.
    Raises BuildError naming the tensor when its split dimension is not divisible by tp_size.
    """
    kind = split_kind(name)
    if kind is None or t.dim() == 0 or (kind == "row" and t.dim() == 1):
        return t
    dim = 0 if kind == "column" else 1
    size = t.shape[dim]
    if size % tp_size:
        raise BuildError(f"{name}: dimension {dim} of shape {tuple(t.shape)} is not divisible "
                         f"by tp_size={tp_size}")
    step = size // tp_size
    return t.narrow(dim, rank * step, step).contiguous().clone()


def shard_tensors(tensors: Mapping[str, torch.Tensor], rank: int, tp_size: int
                  ) -> dict[str, torch.Tensor]:
    """Every target engine tensor, cut for `rank` (`shard_tensor`), same names."""
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank: must be in [0, {tp_size}), got {rank}")
    return {n: shard_tensor(n, t, rank, tp_size) for n, t in tensors.items()}


def write_target_shards(folder: Path, tensors: Mapping[str, torch.Tensor], tp_size: int,
                        max_shard_bytes: int | None) -> list[Path]:
    """Write `folder/rank{r}/` for every rank (safetensors, split into files above
    max_shard_bytes as `save_tensors` does). Returns the rank folders."""
    out = []
    for rank in range(tp_size):
        d = Path(folder) / rank_dir(rank)
        save_tensors(d, shard_tensors(tensors, rank, tp_size), max_shard_bytes=max_shard_bytes)
        out.append(d)
    return out


def tensor_parallel_manifest(tp_size: int) -> dict:
    """The manifest's descriptive "tensor_parallel" entry of a sharded build."""
    return {"shards": [f"target/{rank_dir(r)}" for r in range(tp_size)],
            "column_parallel": "self_attn.{q,k,v}_proj (by head), {gate,up}_proj of routed and "
                               "shared experts (by intermediate channel): output rows",
            "row_parallel": "self_attn.o_proj, down_proj: input columns; the runtime "
                            "all-reduces the partial sums",
            "replicated": "embed_tokens, norms, router mlp.gate, lm_head (run on rank 0), "
                          "k_scale/v_scale, q_rotation/k_rotation; per-tensor weight scales "
                          "copied to every shard",
            "drafter": "replicated in drafter/, runs on rank 0"}
