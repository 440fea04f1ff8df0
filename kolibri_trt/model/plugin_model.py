"""Kolibri-1 over the paged cache through the `plugins/` kernels (the GPU serving path).

Weights stay in the engine's low-bit formats and are read directly by the kernels: FP8 body
(one fused QKV GEMV per layer, o_proj), FP8 routed + shared experts in one MoE op, an NVFP4 (or
FP8) LM head. Attention: FP8 sliding-window layers (`qk_norm_rope_kv_write`: QK-norm + RoPE +
the FP8 cache write in one kernel, then `fp8_paged_attention`), full layers in rotated INT4
(`qk_norm_fold_int4` + `int4_paged_attention`) or FP8 (as sliding layers, without RoPE); each
residual add fused with the norm after it (`add_rms_norm`), RoPE tables computed once per step.
Every op is a torch custom op without host syncs, so `forward` can be captured in a CUDA graph;
on CPU tensors the same code runs the kernels' torch references (tests).

Tensor parallelism (`runtime/tensor_parallel.py`): a rank's model is built from its shard (its
query / KV heads, its slice of every expert's channels) with an `all_reduce` hook that sums the
bf16 [T, H] partial outputs of o_proj and of the MoE across ranks before each residual add;
ranks > 0 have no head (they return [R, 0] logits). Without the hook (TP1) nothing changes.

Maths: `shared/spec/kolibri-1.md` §Forward pass, `kv-cache.md`; layouts: `plugins/LAYOUTS.md`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import torch

from kolibri_trt_plugins import (add_rms_norm, fp8_gemv, fp8_gemv_add_rms_norm,
                                 fp8_paged_attention, fp8_wgmma, int4_paged_attention,
                                 moe_forward, nvfp4_gemv, nvfp4_wgmma, qk_norm_fold_int4,
                                 qk_norm_rope_kv_write)
from kolibri_trt_plugins.fp8_wgmma import to_wgmma_storage as fp8_to_wgmma
from kolibri_trt_plugins.nvfp4_wgmma import to_wgmma_storage

from ..config import KolibriConfig
from . import ops
from .metadata import StepMetadata

# weight formats this path runs, per group of the engine manifest
GPU_FORMATS = {"attention": ("fp8",), "experts": ("fp8",), "shared_expert": ("fp8",),
               "router": ("bf16",), "embedding": ("bf16",), "norms": ("bf16",),
               "lm_head": ("nvfp4", "fp8")}
# kernels for an NVFP4 LM head: "mma" (nvfp4_gemv, mma.sync) or "wgmma" (nvfp4_wgmma, Hopper;
# the weight's bytes permuted once by `Head.with_kernel`). Their bits differ; each is batch
# invariant, so speculative decoding stays lossless with either (plugins/NOTES.md)
HEAD_KERNELS = ("mma", "wgmma")
# EngineArgs.lm_head_kernel's choices: HEAD_KERNELS or "auto" (`auto_head_kernel`)
HEAD_KERNEL_OPTIONS = ("auto",) + HEAD_KERNELS
# kernels for the FP8 QKV and o_proj GEMVs: "mma" (fp8_gemv) or "wgmma" (fp8_wgmma, Hopper;
# the weights permuted once by `PluginModel.use_linear_kernel`), as HEAD_KERNELS
LINEAR_KERNELS = ("mma", "wgmma")


def check_wgmma_weight(option: str, weight: torch.Tensor, rows: int, cols: int) -> None:
    """ValueError naming `option` unless weight [N, K'] has N % rows == 0 and K' % cols == 0
    and, on CUDA, sits on an sm_90 GPU (the wgmma kernels' needs)."""
    n, k = weight.shape
    if n % rows or k % cols:
        raise ValueError(f"{option}: 'wgmma' needs weights [N, K] with N % {rows} == 0 and "
                         f"K % {cols} == 0 (as stored), got {tuple(weight.shape)}")
    if weight.is_cuda and torch.cuda.get_device_capability(weight.device)[0] != 9:
        raise ValueError(f"{option}: 'wgmma' needs an sm_90 GPU (Hopper), {weight.device} "
                         f"is not one")


def auto_head_kernel(fmt: str, weight_shape: tuple[int, int], device: torch.device) -> str:
    """lm_head_kernel "auto": "wgmma" for an NVFP4 head (weight_shape [V, H/2] bytes, H % 256
    == 0) on an sm_90 GPU where Gluon imports (Triton >= 3.6), else "mma". H100, whole
    full-size steps with PDL (bench/results/h100-2026-12-07/wp/): 1 stream 2.800 -> 2.809 ms,
    64 streams 26.360 -> 26.248, 16 x 9-token verification 33.483 -> 33.134."""
    if fmt != "nvfp4" or weight_shape[1] % 128 or device.type != "cuda":
        return "mma"
    if torch.cuda.get_device_capability(device)[0] != 9:
        return "mma"
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return "mma"
    return "wgmma"


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer in kernel layouts (`plugins/LAYOUTS.md`); H hidden, D = 128."""

    input_norm: torch.Tensor      # bf16 [H]
    post_norm: torch.Tensor       # bf16 [H]
    qkv: torch.Tensor             # fp8 [(Hq + 2 Hkv) D, H]: q_proj, k_proj, v_proj rows
    qkv_scale: torch.Tensor       # fp32 [] (ModelOpt ties the three per-tensor scales)
    o_proj: torch.Tensor          # fp8 [H, Hq D]
    o_scale: torch.Tensor         # fp32 []
    q_norm: torch.Tensor          # bf16 [D]
    k_norm: torch.Tensor          # bf16 [D]
    rotation: tuple[torch.Tensor, torch.Tensor] | None  # fp32 (M_q, M_k) [D, D]: INT4 layers
    router: torch.Tensor          # bf16 [E, H]
    w13: torch.Tensor             # fp8 [E, 2I, H]: gate rows then up rows
    w13_scale: torch.Tensor       # fp32 [E]
    w2: torch.Tensor              # fp8 [E, H, I]
    w2_scale: torch.Tensor        # fp32 [E]
    shared: tuple[torch.Tensor, ...] | None  # (w13 [1,2Is,H], s [1], w2 [1,H,Is], s [1]) fp8/fp32


@dataclass(frozen=True)
class Head:
    """The LM head: fmt "nvfp4" (weight uint8 [V, H/2], scale e4m3 [V, H/16], scale_2 fp32 [])
    or "fp8" (weight e4m3 [V, H], scale fp32 [], scale_2 None); kernel one of HEAD_KERNELS
    ("wgmma": weight in `to_wgmma_storage`'s order, made by `with_kernel`)."""

    fmt: str
    weight: torch.Tensor
    scale: torch.Tensor
    scale_2: torch.Tensor | None
    kernel: str = "mma"

    def with_kernel(self, kernel: str) -> "Head":
        """This head run by `kernel` (HEAD_KERNEL_OPTIONS; "auto": `auto_head_kernel`), its
        weight re-laid out once if needed. Raises ValueError for an unknown kernel or "wgmma"
        on a head that is not NVFP4."""
        if kernel not in HEAD_KERNEL_OPTIONS:
            raise ValueError(f"lm_head_kernel: must be one of {list(HEAD_KERNEL_OPTIONS)}, got "
                             f"{kernel!r}")
        if kernel == "auto":
            kernel = auto_head_kernel(self.fmt, tuple(self.weight.shape), self.weight.device)
        if kernel == self.kernel:
            return self
        if self.fmt != "nvfp4" or self.kernel != "mma":
            raise ValueError(f"lm_head_kernel: {kernel!r} runs an NVFP4 head, this one is "
                             f"{self.fmt!r}")
        check_wgmma_weight("lm_head_kernel", self.weight, 1, 128)   # hidden_size % 256
        return replace(self, weight=to_wgmma_storage(self.weight), kernel=kernel)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x bf16 [M, H] -> bf16 [M, V]."""
        if self.kernel == "wgmma":
            return nvfp4_wgmma(x, self.weight, self.scale, self.scale_2)
        if self.fmt == "nvfp4":
            return nvfp4_gemv(x, self.weight, self.scale, self.scale_2)
        return fp8_gemv(x, self.weight, self.scale)


class PluginModel:
    """The target model as the kernels run it. Build with `plugin_loader.load_plugin_target`
    (or `tensor_parallel.load_plugin_shard` for one tensor-parallel rank).

    config: the model's (a rank's shard config under tensor parallelism: its heads and expert
    channels); embed: bf16 [V, H]; final_norm: bf16 [H]; layers: one `LayerWeights` per layer;
    head: the LM head, or None on a rank that does not sample (logits come back as [R, 0]);
    all_reduce: None (one rank), or a function that sums a bf16 [T, H] tensor over the ranks
    in place and returns it (applied to the o_proj and MoE partial outputs).
    """

    def __init__(self, config: KolibriConfig, embed: torch.Tensor, final_norm: torch.Tensor,
                 layers: Sequence[LayerWeights], head: Head | None,
                 all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.config, self.embed, self.final_norm = config, embed, final_norm
        self.linear_kernel = "mma"
        self.layers, self.head, self.all_reduce = list(layers), head, all_reduce
        self.device = embed.device
        # float64 [D] RoPE frequencies (config-only), made once: a step's tables are 3 ops
        self.rope_inv_freq = ops.rope_inv_freq(config.head_dim, config.rope_theta, self.device)

    @torch.no_grad()
    def forward(self, meta: StepMetadata, caches: Sequence[Mapping[str, torch.Tensor]],
                max_seq_len: int, max_q_len: int, all_rows: bool = False,
                tap_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One pass over the step's T tokens (layout: `metadata.py`); K/V written first.

        caches: per layer the cache tensors of `runtime/kv_cache.py` (k/v + k_scale/v_scale for
        FP8, k_codes/v_codes/k_meta/v_meta for INT4). max_seq_len, max_q_len: host bounds of
        seq_lens and of the per-stream token counts (fixed per CUDA graph; the kernels give
        the same bits for any bound). Slots < 0 are not written (padding rows).
        Returns fp32 logits [R, V] for meta.logits_rows (all T rows if all_rows), and taps
        [T, len(tap_layers), H] bf16 (the residual stream after those layers) or None.
        """
        eps = self.config.rms_norm_eps
        layers = list(zip(self.layers, caches))
        rope = self._rope_tables(meta, len(layers))
        # each norm is fused with the residual add before it: x = norm(h) with h = h + out;
        # the embedding rows are F.embedding's (index_select: the same gather, one op less)
        h, x = add_rms_norm(self.embed.index_select(0, meta.input_ids), None,
                            layers[0][0].input_norm if layers else self.final_norm, eps)
        taps = []
        for i, (w, cache) in enumerate(layers):
            a = self._attention(i, w, x, cache, meta, max_seq_len, max_q_len, rope)
            nxt_w = layers[i + 1][0] if i + 1 < len(layers) else None
            nxt = self.final_norm if nxt_w is None else nxt_w.input_norm
            h, x = self._mlp(w, self._o_proj(w, a, h, eps), nxt, eps,
                             None if nxt_w is None else nxt_w.qkv)
            if i in tap_layers:
                taps.append(h)
        rows = x if all_rows else x[meta.logits_rows]   # x = final_norm(h), row by row
        logits = rows.new_empty(rows.shape[0], 0) if self.head is None else self.head(rows)
        return logits.float(), (torch.stack(taps, dim=1) if tap_layers else None)

    def use_linear_kernel(self, kernel: str) -> None:
        """Run QKV and o_proj with `kernel` (LINEAR_KERNELS): "wgmma" permutes every layer's
        weights once (fp8_wgmma.to_wgmma_storage). Raises ValueError (naming
        attention_linear_kernel) for an unknown kernel, a switch back, or weights / a GPU
        that fp8_wgmma cannot run; at tensor-parallel ranks (all_reduce set) only "mma"."""
        if kernel not in LINEAR_KERNELS:
            raise ValueError(f"attention_linear_kernel: must be one of {list(LINEAR_KERNELS)}, "
                             f"got {kernel!r}")
        if kernel == self.linear_kernel:
            return
        if self.linear_kernel != "mma" or self.all_reduce is not None:
            raise ValueError(f"attention_linear_kernel: {kernel!r} runs from 'mma' at one "
                             f"rank only")
        for w in self.layers:
            for weight in (w.qkv, w.o_proj):
                check_wgmma_weight("attention_linear_kernel", weight, 64, 128)
        self.layers = [replace(w, qkv=fp8_to_wgmma(w.qkv), o_proj=fp8_to_wgmma(w.o_proj))
                       for w in self.layers]
        self.linear_kernel = kernel

    def _o_proj(self, w: LayerWeights, a: torch.Tensor, h: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + o_proj(a), post_attention_layernorm of it), bf16 [T, H] each: one op at one
        rank (fp8_gemv_add_rms_norm: for a split-K shape the sum, the add and the norm in one
        launch), else the all-reduce between the GEMV and the norm (the same maths); with
        linear_kernel "wgmma" fp8_wgmma, then add_rms_norm."""
        if self.linear_kernel == "wgmma":
            return add_rms_norm(h, fp8_wgmma(a, w.o_proj, w.o_scale), w.post_norm, eps)
        if self.all_reduce is None:
            return fp8_gemv_add_rms_norm(a, w.o_proj, w.o_scale, h, w.post_norm, eps)
        return add_rms_norm(h, self.all_reduce(fp8_gemv(a, w.o_proj, w.o_scale)), w.post_norm,
                            eps)

    def _mlp(self, w: LayerWeights, hx: tuple[torch.Tensor, torch.Tensor], nxt: torch.Tensor,
             eps: float, nxt_qkv: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + moe(x), the next norm of it) for hx = (h, x) after the attention block; nxt:
        the next layer's input_layernorm gain (the final norm's after the last layer); nxt_qkv:
        the next layer's QKV weight, which the MoE may ask L2 for (moe.PREFETCH_NEXT_TOKENS).
        The norm stays its own launch: in the MoE's combine (one program per token) it cost
        more than it saved (plugins/NOTES.md, "The norms in the launch before them")."""
        h, x = hx
        sh = w.shared or (None, None, None, None)
        out = moe_forward(x, w.router, w.w13, w.w13_scale, w.w2, w.w2_scale, *sh,
                          top_k=self.config.num_experts_per_tok,
                          renormalize=self.config.norm_topk_prob, prefetch_next=nxt_qkv)
        return add_rms_norm(h, out if self.all_reduce is None else self.all_reduce(out), nxt,
                            eps)

    def _rope_tables(self, meta: StepMetadata, num_layers: int
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """fp32 (cos, sin) [T, D] of the step's positions, computed once per forward for all
        sliding layers; None when no layer is sliding."""
        cfg = self.config
        if not any(cfg.is_sliding(i) for i in range(num_layers)):
            return None
        return ops.rope_tables(meta.positions, self.rope_inv_freq)   # = ops.rope_cos_sin

    def _attention(self, i: int, w: LayerWeights, x: torch.Tensor,
                   cache: Mapping[str, torch.Tensor], meta: StepMetadata, max_seq_len: int,
                   max_q_len: int, rope: tuple[torch.Tensor, torch.Tensor] | None
                   ) -> torch.Tensor:
        """Attention output bf16 [T, Hq D] (before o_proj); writes the step's K/V first.
        rope: the step's (cos, sin) tables (`_rope_tables`), used by sliding layers."""
        cfg = self.config
        t, d, hq, hkv = x.shape[0], cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        gemv = fp8_wgmma if self.linear_kernel == "wgmma" else fp8_gemv
        qkv = gemv(x, w.qkv, w.qkv_scale).view(t, hq + 2 * hkv, d)
        q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]   # views, head stride d
        sliding = cfg.is_sliding(i)
        tables = meta.sliding_block_tables if sliding else meta.full_block_tables
        slots = meta.sliding_slots if sliding else meta.full_slots
        bounds = (meta.seq_lens, meta.cu_q_lens, max_seq_len, max_q_len)
        if "k_codes" in cache:
            q = qk_norm_fold_int4(q, k, v, *w.rotation, slots, cache["k_codes"],
                                  cache["v_codes"], cache["k_meta"], cache["v_meta"],
                                  cfg.rms_norm_eps)
            out = int4_paged_attention(q, cache["k_codes"], cache["v_codes"], cache["k_meta"],
                                       cache["v_meta"], tables, *bounds)
            return out.view(t, hq * d)
        cos, sin = rope if sliding else (None, None)
        q = qk_norm_rope_kv_write(q, k, v, w.q_norm, w.k_norm, cos, sin, slots, cache["k"],
                                  cache["v"], cache["k_scale"], cache["v_scale"],
                                  cfg.rms_norm_eps, rope=sliding)
        out = fp8_paged_attention(q, cache["k"], cache["v"], cache["k_scale"],
                                  cache["v_scale"], tables, *bounds,
                                  window=cfg.sliding_window if sliding else 0)
        return out.view(t, hq * d)
