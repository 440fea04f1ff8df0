"""`KolibriBlockDrafter`: plain-torch reference of the block drafter (`shared/spec/block-drafter.md`).

One pass drafts `block_size` (B) tokens: row 0 is the anchor's own context row (an EAGLE-3
chain head), rows 1..B-1 start from the learned mask row; a low-rank spine carries row j-1's
state into row j before layers 1..3, and a low-rank predecessor head feeds each row j >= 1 the
draft of the row before. The drafter borrows the target's embedding E and lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..model import ops
from ..model.reference import KolibriForCausalLM, Linear, RMSNorm
from .config import DrafterConfig


@dataclass(frozen=True)
class DrafterTarget:
    """What the drafter borrows from its target: the frozen embedding and output head.

    embed_tokens, lm_head: [vocab, hidden] tensors of the target (any float dtype);
    num_hidden_layers: the target's layer count (bounds `target_layer_ids`).
    """

    embed_tokens: torch.Tensor
    lm_head: torch.Tensor
    num_hidden_layers: int

    @classmethod
    def of(cls, target: "KolibriForCausalLM | DrafterTarget") -> "DrafterTarget":
        if isinstance(target, DrafterTarget):
            return target
        if isinstance(target, KolibriForCausalLM):
            return cls(target.model.embed_tokens.weight, target.lm_head.weight,
                       target.config.num_hidden_layers)
        raise TypeError(f"target must be a KolibriForCausalLM or DrafterTarget, got "
                        f"{type(target).__name__}")


def _linear(n_out: int, n_in: int) -> Linear:
    return Linear(n_in, n_out)


class LowRank(nn.Module):
    """U(silu(A(x))) with A [r, H] and U [H, r]; the spine adds an RMSNorm in front."""

    def __init__(self, hidden: int, rank: int, eps: float | None):
        super().__init__()
        if eps is not None:
            self.norm = RMSNorm(hidden, eps)
        self.A, self.U = _linear(rank, hidden), _linear(hidden, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "norm"):
            x = self.norm(x)
        return self.U(F.silu(self.A(x)))


class Predecessor(nn.Module):
    """g = x + U(silu(A(x) + B(E[d]))): tells row j the draft d of the row before."""

    def __init__(self, hidden: int, rank: int):
        super().__init__()
        self.A, self.B = _linear(rank, hidden), _linear(rank, hidden)
        self.U = _linear(hidden, rank)

    def forward(self, x: torch.Tensor, prev_embedding: torch.Tensor) -> torch.Tensor:
        return x + self.U(F.silu(self.A(x) + self.B(prev_embedding)))


class DrafterAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = _linear(cfg.num_attention_heads * d, h)
        self.k_proj = _linear(cfg.num_key_value_heads * d, h)
        self.v_proj = _linear(cfg.num_key_value_heads * d, h)
        self.o_proj = _linear(h, cfg.num_attention_heads * d)


class DrafterMLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = _linear(cfg.intermediate_size, cfg.hidden_size)
        self.up_proj = _linear(cfg.intermediate_size, cfg.hidden_size)
        self.down_proj = _linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    """One body layer: spine (l >= 1), attention over context rows + causal block, SwiGLU."""

    def __init__(self, cfg: DrafterConfig, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DrafterAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DrafterMLP(cfg)
        if index >= 1:
            self.spine = LowRank(cfg.hidden_size, cfg.spine_rank, cfg.rms_norm_eps)
        self.cfg = cfg

    def kv(self, rows: torch.Tensor, positions: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (RoPE at `positions`) and values of rows [N, H]: [N, Hkv, D] each. For context
        rows they depend on the row alone, which is what the drafter's KV cache stores."""
        cfg, attn = self.cfg, self.self_attn
        xn = self.input_layernorm(rows)
        k = attn.k_proj(xn).view(rows.shape[0], cfg.num_key_value_heads, cfg.head_dim)
        v = attn.v_proj(xn).view(rows.shape[0], cfg.num_key_value_heads, cfg.head_dim)
        cos, sin = ops.rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        return ops.apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
                row_pos: torch.Tensor) -> torch.Tensor:
        """x: block rows [S, B, H] of S streams; ctx_kv: per stream (k, v) [C_s, Hkv, D] of its
        context rows (`kv` of ctx_i at position i; context rows are not carried through
        layers); row_pos int64 [S, B]: RoPE positions of the rows. Returns new rows [S, B, H].
        Streams share the linears; each attends only to its own context and block."""
        if hasattr(self, "spine") and x.shape[1] > 1:
            delta = self.spine(x[:, :-1])       # every row reads the states before this layer
            x = torch.cat([x[:, :1], x[:, 1:] + delta], dim=1)  # row 0 untouched
        cfg, attn = self.cfg, self.self_attn
        s, b, h = x.shape
        pos = row_pos.reshape(-1)
        q = attn.q_proj(self.input_layernorm(x)).view(s * b, cfg.num_attention_heads, cfg.head_dim)
        cq, sq = ops.rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
        q = ops.apply_rope(q, cq, sq).view(s, b, cfg.num_attention_heads, cfg.head_dim)
        rk, rv = self.kv(x.reshape(s * b, h), pos)
        rk, rv = rk.view(s, b, *rk.shape[1:]), rv.view(s, b, *rv.shape[1:])
        out = []
        for i, (ck, cv) in enumerate(ctx_kv):
            k, v = torch.cat([ck, rk[i]])[None], torch.cat([cv, rv[i]])[None]
            ranges = [(0, ck.shape[0] + j + 1) for j in range(b)]  # context + rows 0..j
            out.append(ops.attention(q[i][None], k, v, ranges)[0].reshape(b, -1))
        x = x + attn.o_proj(torch.stack(out))
        return x + self.mlp(self.post_attention_layernorm(x))
