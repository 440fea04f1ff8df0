"""Reference maths shared by the target and the drafter (plain torch, no cache).

Sources: `shared/spec/kolibri-1.md` §Forward pass and `shared/spec/block-drafter.md`.
Precision policy of the reference: norms, RoPE, attention scores/softmax and router run in
fp32 and cast back to the model dtype; linears run in the model dtype (as Hugging Face does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """`rms(x) * w` over the last dim, computed in fp32, cast back to x.dtype.

    x: [..., N] any float dtype; weight: [N] or None (plain `rms`, no gain).
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for rotate-half (NeoX) RoPE over the full head_dim.

    inv_freq_i = theta^(-2i/head_dim), i = 0 .. head_dim/2 - 1 (`kolibri-1.md`).
    positions: int64 [T] (0 = first token of the sequence). Returns fp32 [T, head_dim] each;
    angles are formed in float64 so long positions keep their precision.
    """
    i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device)
    inv_freq = theta ** (-i / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: [..., T, heads, D]; cos/sin fp32 [T, D]. Returns x.dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return (xf * c + rotated * s).to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor
              ) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) v with GQA, in fp32, cast back to q.dtype.

    q: [B, Tq, Hq, D]; k, v: [B, Tk, Hkv, D] with Hq % Hkv == 0 (query head n reads KV head
    n // (Hq // Hkv)); allowed: bool [Tq, Tk], True where the query may see the key (every
    query row must allow at least one key). Returns [B, Tq, Hq, D].
    """
    group = q.shape[2] // k.shape[2]
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, vf).to(q.dtype)


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """bool [Tq, Tk]: key j visible to query i iff j <= i and (window is None or i - window < j).

    With window = 513 a query sees itself and the 512 positions before it (`kolibri-1.md`).
    """
    i, j = q_pos[:, None], k_pos[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    return allowed


def swiglu(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor
           ) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)); weights [I, H], [I, H], [H, I]; runs in x.dtype."""
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def route_topk(router_logits: torch.Tensor, k: int, normalize: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing with ties towards the lower expert index (`kolibri-1.md`).

    router_logits: fp32 [T, E]. Returns (weights fp32 [T, k], experts int64 [T, k]); weights
    are softmax probabilities of the chosen experts, renormalised to sum to 1 if `normalize`.
    A stable descending sort keeps equal probabilities in index order, so ties go low.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, experts = sorted_p[:, :k], order[:, :k]
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts
