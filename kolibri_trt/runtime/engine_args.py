"""`EngineArgs`: the engine's runtime options, checked on construction (vLLM's names where
they exist). Read by `LLMEngine` (`engine.py`), `LLM` and the servers."""

from __future__ import annotations

from dataclasses import dataclass

from ..drafter.plugin_weights import ATTN_IMPLS as DRAFTER_ATTENTION
from ..model.plugin_model import HEAD_KERNEL_OPTIONS, LINEAR_KERNELS
from ..spec.drafter_gate import GATES
from .cpu_affinity import check_spec as check_cpu_affinity

MODEL_IMPLS = ("auto", "reference", "plugins")
# command-line spelling of drafts_on_device (tools/eval_acceptance.py, bench/profile_generate.py)
DRAFTS_ON_DEVICE = {"auto": None, "on": True, "off": False}
ACCEPTANCE_METHODS = ("position-keyed", "rejection_sampler")
DRAFT_SAMPLING = ("coupled", "greedy")


@dataclass(frozen=True)
class EngineArgs:
    """Runtime limits. max_num_seqs: streams decoded together; max_model_len: tokens per
    stream (prompt + output); kv_cache_memory: bytes for the KV cache; block_size: tokens per
    cache block; max_num_batched_tokens: tokens per step (prefill chunk budget)."""

    max_num_seqs: int = 8
    max_model_len: int = 4096
    kv_cache_memory: int = 1 << 30
    block_size: int = 16
    max_num_batched_tokens: int = 512
    num_speculative_tokens: int = 8      # draft tokens per stream and pass, at most
    drafter_depth: int | None = None     # None: the drafter's serving_defaults.depth
    # the drafter's ring attention on the plugins path: "kernel" (ring_attention + rope_ring_write,
    # one launch each per layer; H200: a round 0.63 -> 0.42 ms vs "dense"), "dense", "sdpa"
    drafter_attention: str = "kernel"
    # a stream without a copy draft gets a drafter round: "always", or "adaptive" (only while
    # its accepted drafts pay for a drafted step's extra wall time: spec/drafter_gate.py)
    drafter_gate: str = "always"
    # start each step's drafter round right after the previous step, overlapping the host's
    # work (spec/speculator.py, `prefetch`): None = on with the drafter's kernel path on CUDA
    drafter_overlap: bool | None = None
    # leave the drafter's drafts on the device: the target pass reads them there and the host
    # only at verification, so no host sync waits for the round (spec/speculator.py, `defer`):
    # None = on with drafter_overlap on one device's kernel path
    drafts_on_device: bool | None = None
    # enqueue a stream's next drafter round on the device while its step is verified, its
    # inputs computed there from the step's tokens (spec/drafter_chain.py), instead of
    # launching it after the step: None = on with drafts_on_device
    drafter_chain: bool | None = None
    model_impl: str = "auto"             # "reference" | "plugins" | "auto" (plugins on CUDA)
    # the NVFP4 LM head's kernel on the plugins path: "mma" (nvfp4_gemv), "wgmma"
    # (nvfp4_wgmma, sm_90 only; H200 LM head µs at 1 / 64 / 144 rows 61.0 / 238.2 / 695.0 ->
    # 67.0 / 121.1 / 341.9, bench/results/h200-2026-12-02e/gn3/) or "auto" (wgmma where it
    # runs, at one rank; else mma: model/plugin_model.py `auto_head_kernel`)
    lm_head_kernel: str = "auto"
    # the FP8 QKV and o_proj GEMVs' kernel on the plugins path: "mma" (fp8_gemv) or "wgmma"
    # (fp8_wgmma, sm_90 only; H200 QKV µs at 1 / 64 / 144 rows 5.4 / 12.0 / 25.7 -> 5.9 / 8.9 /
    # 17.9, bench/results/h200-2026-12-02e/fw/)
    attention_linear_kernel: str = "mma"
    enforce_eager: bool = False          # True: no CUDA graphs on the plugins path
    # experimental: tensor parallelism on CUDA with CUDA graphs (each rank's NCCL all-reduces
    # captured, capture_error_mode "thread_local"); without it TP on CUDA needs enforce_eager
    tp_cuda_graphs: bool = False
    # how sampled drafts are accepted: "position-keyed" (identical to non-speculative output)
    # or "rejection_sampler" (Leviathan et al. 2023; same distribution, not the same tokens)
    acceptance_method: str = "position-keyed"
    # how the drafter picks a sampled stream's drafts: "coupled" (argmax of logits / T plus the
    # target sampler's own position-keyed Gumbel noise: plugins/vocab_argmax.py) or "greedy"
    draft_sampling: str = "coupled"
    # pin the engine's host thread: None (as it is), "gpu-local" (the CPUs next to the GPU) or
    # a CPU list such as "0-3,8" (runtime/cpu_affinity.py)
    cpu_affinity: str | None = None

    def __post_init__(self) -> None:
        check_cpu_affinity(self.cpu_affinity)
        for name, choices in (("acceptance_method", ACCEPTANCE_METHODS), ("drafter_gate", GATES),
                              ("draft_sampling", DRAFT_SAMPLING),
                              ("drafter_attention", DRAFTER_ATTENTION),
                              ("model_impl", MODEL_IMPLS),
                              ("lm_head_kernel", HEAD_KERNEL_OPTIONS),
                              ("attention_linear_kernel", LINEAR_KERNELS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}: must be one of {list(choices)}, got "
                                 f"{getattr(self, name)!r}")
        if self.drafter_depth is not None and (not isinstance(self.drafter_depth, int)
                                               or self.drafter_depth < 1):
            raise ValueError(f"drafter_depth: must be None or an int >= 1, got "
                             f"{self.drafter_depth!r}")
        for name in ("max_num_seqs", "max_model_len", "kv_cache_memory", "block_size",
                     "max_num_batched_tokens", "num_speculative_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        if self.block_size not in (16, 32, 64, 128):
            raise ValueError(f"block_size: must be one of 16, 32, 64, 128, got {self.block_size}")
