"""Tensor parallelism: one rank's shard of the target and its all-reduces, on the reference path
(`load_target_shard`) and on the kernel path (`load_plugin_shard`); `build_rank` makes either
into the rank's KV cache and runner.

Each rank builds `KolibriForCausalLM` from its shard config (`builder.tp_shard.shard_config`:
query / KV heads and the routed / shared intermediate sizes divided by tp_size) and loads its
folder `target/rank{r}`, so the reference modules, `ModelRunner` and `KVCache` work unchanged on
the rank's heads (its cache holds only its KV heads). `shard_modules` then swaps three modules:

- `self_attn.o_proj` -> `RowParallelLinear`: the fp32 partial product over the rank's heads,
  one all_reduce(SUM) in fp32, one cast to the model dtype (the unsharded linear rounds once
  too);
- `mlp` -> `ParallelMoE`: the replicated router gives every rank the same experts; each chosen
  expert's (and the shared expert's) partial down_proj stays fp32, the [T, k+1, H] partials
  are all-reduced once, then the reference's own arithmetic runs: every expert output rounded
  to the model dtype, weighted and summed in fp32 in ascending expert order. This reduces
  k+1 rows per token instead of one, so that TP differs from TP1 only by the order of the fp32
  sums (the price of exactness on the reference path; a fused GPU MoE would reduce once);
- `lm_head` on ranks > 0 -> `SkippedHead` (only rank 0 samples; every shard stores the head).

Kernel path (`model_impl="plugins"`): the rank's shard goes into a `PluginModel` of the shard
config (`plugin_loader.load_plugin_weights`: its q/k/v heads fused into one QKV weight, its
o_proj input columns, each expert's and the shared expert's gate/up rows and down columns; the
router, embedding, norms and KV scales / rotations replicated; no head on ranks > 0) with the
hook `AllReduce`: the bf16 [T, H] partial outputs of o_proj and of the fused MoE op are summed
over the ranks (one all_reduce each, in bf16, as TensorRT-LLM and vLLM do) before the residual
add. Each rank runs a `PluginRunner` over its shard; every rank sees the same step metadata, so
they pick the same CUDA-graph buckets and capture / replay in lockstep. On CUDA the NCCL
all_reduce is captured inside the graphs (the eager warm-up run before each capture has already
run the collectives, which creates the NCCL communicator first); `enforce_eager=True` runs every
step eagerly on every rank instead (the documented way out; nothing falls back silently).

Precision: splitting a K-sum across ranks changes the fp32 summation order, so a rounded
result can differ by one ulp of the model dtype where the fp32 sum sits on a rounding
boundary (measured with torch 2.13 on CPU: bf16 outputs of a 1x2560x2560 linear agree in
99.96% of elements; tests/test_tensor_parallel.py reports the end-to-end figures).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..builder.tp_shard import shard_config
from ..config import KolibriConfig
from ..engine_format import TARGET_DIR, rank_dir
from ..model import ops
from ..model.reference import KolibriForCausalLM, MoE
from .cuda_graphs import PluginRunner
from .engine import EngineArgs, plan_cache
from .engine_loader import Manifest, load_target_weights
from .kv_cache import KVCache
from .model_runner import ModelRunner
from .plugin_loader import check_gpu_formats, load_plugin_weights


def check_tensor_parallel_size(manifest: Manifest, tensor_parallel_size) -> None:
    """Raises ValueError naming tensor_parallel_size unless it is an int >= 1 equal to the
    engine's manifest tp_size (the number of shards the build wrote)."""
    tp = tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel_size: must be an int >= 1, got {tp!r}")
    if tp != manifest.tp_size:
        raise ValueError(f"tensor_parallel_size={tp}, but the engine {manifest.path.parent} "
                         f"is sharded for tp_size={manifest.tp_size} (build it with "
                         f"`build.py --tp {tp}`, or pass tensor_parallel_size="
                         f"{manifest.tp_size})")


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank `rank`'s device: "cpu" for every rank, or CUDA device (index of `device`) + rank."""
    if device.type == "cpu":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def meta_to(meta, device: torch.device | str):
    """A copy of a StepMetadata (any frozen dataclass) with every tensor field on `device`."""
    moved = {f.name: getattr(meta, f.name).to(device) for f in dataclasses.fields(meta)
             if isinstance(getattr(meta, f.name), torch.Tensor)}
    return dataclasses.replace(meta, **moved)


class RowParallelLinear(nn.Module):
    """A row-parallel linear: this rank's input columns `weight` [N, K/tp] (bf16 parameter, or
    the fp32 dequantized buffer of a `DequantLinear`). forward(x [..., K/tp]) -> [..., N] in
    x.dtype: fp32 partial product, all_reduce(SUM) over the group, one cast."""

    def __init__(self, inner: nn.Module, group=None):
        super().__init__()
        self.weight, self.group = inner.weight, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = ops.linear(x.float(), self.weight.float())
        dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=self.group)
        return partial.to(x.dtype)


def _expert_partial(expert: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One rank's fp32 partial of a SwiGLU expert: x [n, H] -> fp32 [n, H]; gate/up are the
    rank's output channels (column parallel), down_proj its matching input columns."""
    a = F.silu(expert.gate_proj(x)) * expert.up_proj(x)
    return ops.linear(a.float(), expert.down_proj.weight.float())


class ParallelMoE(nn.Module):
    """The reference `MoE` over one rank's expert channels, with one all_reduce of the
    per-expert partial outputs (module docstring). forward(x [..., H]) -> [..., H] x.dtype."""

    def __init__(self, moe: MoE, group=None):
        super().__init__()
        self.gate, self.experts, self.shared_expert = moe.gate, moe.experts, moe.shared_expert
        self.cfg, self.group = moe.cfg, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, k = x.shape, self.cfg.num_experts_per_tok
        x = x.reshape(-1, shape[-1])
        logits = ops.linear(x.float(), self.gate.weight.float())
        weights, experts = ops.route_topk(logits, k, self.cfg.norm_topk_prob)
        order = torch.unique(experts).tolist()
        parts = torch.zeros(x.shape[0], k + 1, x.shape[1], dtype=torch.float32, device=x.device)
        for e in order:
            rows, slot = torch.nonzero(experts == e, as_tuple=True)
            parts[rows, slot] = _expert_partial(self.experts[e], x[rows])
        if self.shared_expert is not None:
            parts[:, k] = _expert_partial(self.shared_expert, x)
        dist.all_reduce(parts, op=dist.ReduceOp.SUM, group=self.group)
        out = parts.to(x.dtype).float()      # the reference rounds each expert's output
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in order:
            rows, slot = torch.nonzero(experts == e, as_tuple=True)
            y.index_add_(0, rows, out[rows, slot] * weights[rows, slot, None])
        if self.shared_expert is not None:
            y = y + out[:, k]
        return y.to(x.dtype).reshape(shape)


class SkippedHead(nn.Module):
    """The LM head of a rank that does not sample (ranks > 0): x [R, H] -> fp32 [R, 0]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], 0, dtype=torch.float32)


def shard_modules(model: KolibriForCausalLM, rank: int, group=None) -> KolibriForCausalLM:
    """Swap a shard model's o_proj, MoE and (ranks > 0) lm_head for their parallel forms
    (module docstring); returns `model`. The collectives run over `group` (None: default)."""
    for layer in model.model.layers:
        layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj, group)
        layer.mlp = ParallelMoE(layer.mlp, group)
    if rank > 0:
        model.lm_head = SkippedHead()
    return model


def _check_rank(engine_dir: Path, manifest: Manifest, rank: int) -> None:
    tp = manifest.tp_size
    if tp < 2:
        raise ValueError(f"tensor_parallel_size: the engine {Path(engine_dir)} is not sharded "
                         "(manifest tp_size 1)")
    if not 0 <= rank < tp:
        raise ValueError(f"rank: must be in [0, {tp}), got {rank}")


def load_target_shard(engine_dir: Path, manifest: Manifest, rank: int,
                      device: torch.device | str, group=None):
    """Rank `rank`'s target from `engine_dir/target/rank{rank}` with its parallel modules.

    Returns (model with the rank's shard config, rotations {layer: (M_q, M_k) fp32 [D, D]},
    kv scales {layer: (k_scale, v_scale)}, the whole model's KolibriConfig).
    Raises ValueError naming tensor_parallel_size (an unsharded engine), rank (out of range)
    or the config field tp_size cannot split; CheckpointError for a missing / mis-shaped tensor.
    """
    _check_rank(engine_dir, manifest, rank)
    folder = Path(engine_dir) / TARGET_DIR
    full = KolibriConfig.from_json(folder / "config.json")
    model, rotations, scales = load_target_weights(folder / rank_dir(rank),
                                                   shard_config(full, manifest.tp_size),
                                                   manifest, device)
    return shard_modules(model, rank, group), rotations, scales, full


class AllReduce:
    """`PluginModel`'s all_reduce hook: sums a tensor over `group` in place (SUM) and returns
    it. Plain collective calls, so a CUDA graph captures them (NCCL)."""

    def __init__(self, group=None):
        self.group = group

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=self.group)
        return partial


def load_plugin_shard(engine_dir: Path, manifest: Manifest, rank: int,
                      device: torch.device | str, group=None):
    """Rank `rank`'s target for the kernel path (module docstring): a `PluginModel` of the
    shard config with the `AllReduce` hook (no head on ranks > 0).

    Returns (model, DrafterTarget (the replicated embedding, the whole head's shape), kv
    scales {layer: (k_scale, v_scale)}, the whole model's KolibriConfig).
    Raises ValueError as `load_target_shard`, and naming the weight group whose format the
    kernels do not run (`check_gpu_formats`); CheckpointError as `load_plugin_target`.
    """
    _check_rank(engine_dir, manifest, rank)
    check_gpu_formats(manifest)
    folder = Path(engine_dir) / TARGET_DIR
    full = KolibriConfig.from_json(folder / "config.json")
    model, target, scales = load_plugin_weights(
        folder / rank_dir(rank), shard_config(full, manifest.tp_size), manifest, device,
        with_head=rank == 0, all_reduce=AllReduce(group))
    return model, target, scales, full


def resolve_model_impl(model_impl: str, device: torch.device) -> str:
    """"reference" or "plugins" for EngineArgs.model_impl ("auto": plugins on CUDA, as at
    TP1)."""
    if model_impl == "auto":
        return "plugins" if device.type == "cuda" else "reference"
    return model_impl


def build_rank(engine_dir: Path, manifest: Manifest, args: EngineArgs, rank: int,
               device: torch.device, impl: str):
    """Rank `rank`'s shard, its KV cache (only its KV heads; kv_cache_memory is per rank) and
    its runner: a `ModelRunner` (impl "reference") or a `PluginRunner` (impl "plugins"; CUDA
    graphs on CUDA unless args.enforce_eager).

    Returns (runner, cache, what the drafter borrows (the reference shard model, or the
    plugin path's DrafterTarget), the whole model's KolibriConfig).
    """
    if impl == "plugins":
        model, target, scales, full = load_plugin_shard(engine_dir, manifest, rank, device)
    else:
        model, rotations, scales, full = load_target_shard(engine_dir, manifest, rank, device)
        target = model
    geometry = plan_cache(model.config, manifest.kv, args, args.max_num_batched_tokens)
    cache = KVCache(model.config, manifest.kv, geometry, scales, device)
    if impl == "plugins":
        runner = PluginRunner(model, cache.layers, args.max_num_seqs, args.max_model_len,
                              1 + args.num_speculative_tokens, args.block_size,
                              use_graphs=device.type == "cuda" and not args.enforce_eager)
    else:
        runner = ModelRunner(model, cache, rotations)
    return runner, cache, target, full
