"""Reference maths shared by the target and the drafter (plain torch, no cache).

Sources: `shared/spec/kolibri-1.md` §Forward pass and `shared/spec/block-drafter.md`.
Precision policy of the reference: norms, RoPE, attention scores/softmax and router run in
fp32 and cast back to the model dtype; linears run in the model dtype (as Hugging Face does).
"""

from __future__ import annotations

import math

import torch
from kolibri_trt_plugins._rows import linear_rows


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
    return rope_tables(positions, rope_inv_freq(head_dim, theta, positions.device))


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | str | None = None
                  ) -> torch.Tensor:
    """float64 [head_dim]: the inverse frequencies of `rope_cos_sin` for every table column,
    inv_freq_i for columns i and i + head_dim/2 (rotate-half uses each frequency twice).
    Depends only on the config: callers that build tables every step make it once."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    inv_freq = theta ** (-i / head_dim)
    return torch.cat([inv_freq, inv_freq])


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_cos_sin` from `rope_inv_freq`'s float64 [D]: positions int64 [T] (same device)
    -> fp32 (cos, sin) [T, D]. Angles in float64 (integer positions convert exactly); cos and
    sin are evaluated in float64 and rounded to fp32 as they are stored (three elementwise ops
    per step: the product, cos, sin)."""
    angles = positions[:, None] * inv_freq          # [T, 1] x [D] -> float64 [T, D]
    cos = torch.empty(angles.shape, dtype=torch.float32, device=angles.device)
    sin = torch.empty(angles.shape, dtype=torch.float32, device=angles.device)
    return torch.cos(angles, out=cos), torch.sin(angles, out=sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: [..., T, heads, D]; cos/sin fp32 [T, D]. Returns x.dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return (xf * c + rotated * s).to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              key_ranges: list[tuple[int, int]]) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over each query's visible keys, GQA, fp32, cast to q.dtype.

    q: [B, Tq, Hq, D]; k, v: [B, Tk, Hkv, D] with Hq % Hkv == 0 (query head n reads KV head
    n // (Hq // Hkv)); key_ranges: Tq pairs (lo, hi), query t sees keys lo <= j < hi
    (non-empty). Returns [B, Tq, Hq, D].

    Row-invariant by construction: each query row is computed alone, with shapes fixed by
    its own key range, so its result never depends on which other queries share the call.
    The runtime's paged path calls `attend_one` with the same shapes: that is what makes
    cached, chunked and speculative decoding reproduce the reference bit for bit.
    """
    b, tq, hq, d = q.shape
    kf, vf = k.float(), v.float()
    out = torch.empty(b, tq, hq, d, dtype=torch.float32, device=q.device)
    for t, (lo, hi) in enumerate(key_ranges):
        for i in range(b):
            out[i, t] = attend_one(q[i, t], kf[i, lo:hi], vf[i, lo:hi])
    return out.to(q.dtype)


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query token over its n visible keys: q [Hq, D]; k, v fp32 [n, Hkv, D] -> fp32 [Hq, D]."""
    hq, d = q.shape
    hkv = k.shape[1]
    qg = q.float().reshape(hkv, hq // hkv, d)                      # [Hkv, group, D]
    scores = torch.bmm(qg, k.permute(1, 2, 0)) / math.sqrt(d)       # [Hkv, group, n]
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v.permute(1, 0, 2)).reshape(hq, d)


def causal_ranges(q_pos: torch.Tensor, k_start: int, window: int | None) -> list[tuple[int, int]]:
    """Key index ranges for queries at positions q_pos over keys at k_start, k_start+1, ...

    Key j (position k_start + j) is visible to the query at position i iff it is not in the
    future and, with a window, i - window < position: with window = 513 a query sees itself
    and the 512 positions before it (`kolibri-1.md`).
    """
    out = []
    for i in q_pos.tolist():
        lo = 0 if window is None else max(0, i - window + 1 - k_start)
        out.append((lo, i + 1 - k_start))
    return out


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T, row-invariant: a row's result does not depend on how many rows share the call
    (`kolibri_trt_plugins._rows.linear_rows`: blocks of 8 rows; measured on CPU).
    x: [..., K]; w: [N, K] (same dtype). `tests/test_model_reference.py` checks the property."""
    return linear_rows(x, w)


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
