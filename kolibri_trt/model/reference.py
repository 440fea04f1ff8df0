"""`KolibriForCausalLM`: the plain-torch parity reference of Kolibri-1 (no KV cache).

Every detail follows `shared/spec/kolibri-1.md` §Forward pass; module and parameter names are
the checkpoint's tensor names, so `state_dict()` is the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import load_tensors, save_tensors
from ..config import KolibriConfig
from ..errors import CheckpointError
from . import ops


class RMSNorm(nn.Module):
    """RMSNorm with gain `weight` [dim], computed in fp32 (spec §Forward pass)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class Linear(nn.Module):
    """Bias-free linear layer with a row-invariant product (`ops.linear`); weight [out, in]."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight)


def _linear(n_out: int, n_in: int) -> Linear:
    return Linear(n_in, n_out)


class Attention(nn.Module):
    """QK-normed GQA attention; RoPE on sliding layers, NoPE on full layers."""

    def __init__(self, cfg: KolibriConfig, layer: int):
        super().__init__()
        d = cfg.head_dim
        self.q_proj = _linear(cfg.num_attention_heads * d, cfg.hidden_size)
        self.k_proj = _linear(cfg.num_key_value_heads * d, cfg.hidden_size)
        self.v_proj = _linear(cfg.num_key_value_heads * d, cfg.hidden_size)
        self.o_proj = _linear(cfg.hidden_size, cfg.num_attention_heads * d)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.cfg, self.sliding = cfg, cfg.is_sliding(layer)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections, QK-norm and (sliding layers) RoPE.

        x: [..., T, H]; positions int64 [T]. Returns q [..., T, Hq, D], k and v
        [..., T, Hkv, D] in x.dtype: exactly the keys and values a cache stores.
        """
        cfg = self.cfg
        lead = x.shape[:-1]
        q = self.q_norm(self.q_proj(x).view(*lead, cfg.num_attention_heads, cfg.head_dim))
        k = self.k_norm(self.k_proj(x).view(*lead, cfg.num_key_value_heads, cfg.head_dim))
        v = self.v_proj(x).view(*lead, cfg.num_key_value_heads, cfg.head_dim)
        if self.sliding:
            cos, sin = ops.rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
            q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        return q, k, v

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, T, H] -> [B, T, H]; positions int64 [T] counted from 0."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x, positions)
        window = self.cfg.sliding_window if self.sliding else None
        a = ops.attention(q, k, v, ops.causal_ranges(positions, 0, window))
        return self.o_proj(a.reshape(b, t, -1))


class Expert(nn.Module):
    """SwiGLU expert: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj, self.up_proj = _linear(inter, hidden), _linear(inter, hidden)
        self.down_proj = _linear(hidden, inter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Router (fp32 softmax, top-k, ties to the lower index) + routed experts + shared expert.

    Expert outputs are weighted and summed in fp32, then cast to the model dtype.
    """

    def __init__(self, cfg: KolibriConfig):
        super().__init__()
        self.gate = _linear(cfg.num_experts, cfg.hidden_size)
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, cfg.moe_intermediate_size)
                                     for _ in range(cfg.num_experts))
        si = cfg.shared_expert_intermediate_size
        self.shared_expert = Expert(cfg.hidden_size, si) if si > 0 else None
        self.cfg = cfg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = ops.linear(x.float(), self.gate.weight.float())
        weights, experts = ops.route_topk(logits, self.cfg.num_experts_per_tok,
                                          self.cfg.norm_topk_prob)
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(experts).tolist():
            rows, slot = torch.nonzero(experts == e, as_tuple=True)
            out = self.experts[e](x[rows]).float()
            y.index_add_(0, rows, out * weights[rows, slot, None])
        if self.shared_expert is not None:
            y = y + self.shared_expert(x).float()
        return y.to(x.dtype).reshape(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: KolibriConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg)

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class KolibriModel(nn.Module):
    def __init__(self, cfg: KolibriConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class KolibriForCausalLM(nn.Module):
    """Kolibri-1 reference model (`shared/spec/kolibri-1.md`), full-sequence, no cache.

    Call `model(input_ids)` with int64 [batch, seq] to get fp32 logits [batch, seq, vocab];
    `model(input_ids, tap_layers=(44, 47, 49))` returns `(logits, taps)` with taps
    [batch, seq, len(tap_layers), hidden] in the model dtype: the raw residual stream h after
    each listed layer (what the block drafter reads). Positions count from 0 at input_ids[:, 0].
    """

    def __init__(self, config: KolibriConfig):
        super().__init__()
        self.config = config
        self.model = KolibriModel(config)
        self.lm_head = _linear(config.vocab_size, config.hidden_size)

    def forward(self, input_ids: torch.Tensor, tap_layers: Sequence[int] | None = None):
        h, taps = self.residual_stream(input_ids, tap_layers)
        logits = self.lm_head(self.model.norm(h)).float()
        return logits if tap_layers is None else (logits, taps)

    def residual_stream(self, input_ids: torch.Tensor, tap_layers: Sequence[int] | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The final residual stream h [B, T, H] (before `model.norm`) and the taps
        [B, T, len(tap_layers), H] (None without tap_layers)."""
        if input_ids.dim() != 2 or input_ids.dtype != torch.long:
            raise ValueError(f"input_ids must be int64 [batch, seq], got "
                             f"{input_ids.dtype} {tuple(input_ids.shape)}")
        taps_at = self._check_taps(tap_layers)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.model.embed_tokens(input_ids)
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            h = layer(h, positions)
            if i in taps_at:
                taps[i] = h
        if tap_layers is None:
            return h, None
        return h, torch.stack([taps[i] for i in tap_layers], dim=2)

    def last_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits [B, V] of the last position only (the head runs on one row each)."""
        h, _ = self.residual_stream(input_ids)
        return self.lm_head(self.model.norm(h[:, -1])).float()

    def _check_taps(self, tap_layers: Sequence[int] | None) -> set[int]:
        if tap_layers is None:
            return set()
        n = self.config.num_hidden_layers
        for i in tap_layers:
            if not 0 <= i < n:
                raise ValueError(f"tap_layers: layer {i} does not exist (model has {n} layers)")
        return set(tap_layers)

    # ---- checkpoint I/O ------------------------------------------------------------------
    @staticmethod
    def expected_shapes(cfg: KolibriConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor name of a checkpoint for `cfg` and its shape (spec §Tensor names)."""
        with torch.device("meta"):
            model = KolibriForCausalLM(cfg)
        return {k: tuple(v.shape) for k, v in model.state_dict().items()}

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.bfloat16,
                        device: str | torch.device = "cpu") -> "KolibriForCausalLM":
        """Load `path/config.json` and its safetensors weights, strictly.

        Raises:
            CheckpointError: bad config, or a missing / unexpected / mis-shaped tensor; the
                message names the file and the field or tensor. Pickles are never read.
        """
        cfg = KolibriConfig.from_json(Path(path) / "config.json")
        tensors = load_tensors(path, cls.expected_shapes(cfg), dtype=dtype, device=device)
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict(tensors, strict=True, assign=True)
        return model.requires_grad_(False).eval()

    def save_pretrained(self, path: str | Path, max_shard_bytes: int | None = None) -> None:
        """Write config.json and weights (sharded with an index above `max_shard_bytes`)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        save_tensors(path, self.state_dict(), max_shard_bytes=max_shard_bytes)
        self.config.save(path)


__all__ = ["KolibriForCausalLM", "KolibriConfig", "CheckpointError"]
