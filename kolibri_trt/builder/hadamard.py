"""The KV-cache plan's fixed matrices (`shared/spec/kv-cache.md`, seed 002).

Full-attention (NoPE) layers with a rotated INT4 cache keep, per layer,
    M_q = R · diag(g_q ⊙ g_k)      applied to rms(q)   ("q_rotation")
    M_k = R                        applied to rms(k)   ("k_rotation")
with R = H · diag(s) / sqrt(D): H the D×D Sylvester Hadamard matrix, s a random ±1 per column
drawn from the engine's seed. R is orthogonal, so (M_q rms(q)) · (M_k rms(k)) =
(g_q ⊙ rms(q)) · (g_k ⊙ rms(k)): the attention scores are unchanged while the cached keys are
rotated and carry no gain. The softmax scale is not folded. The same R serves every layer.
"""

from __future__ import annotations

import math

import torch

from .errors import BuildError

HADAMARD_DIM = 128


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def sylvester_hadamard(dim: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix H_dim (entries ±1, H H^T = dim I) as fp32 [dim, dim]:
    H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]], so H[i, j] = (-1)^popcount(i & j).

    Raises:
        BuildError: dim is not a power of two.
    """
    if not is_power_of_two(dim):
        raise BuildError(f"the Hadamard rotation needs a power-of-two head_dim, got {dim}")
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotation_signs(seed: int, dim: int = HADAMARD_DIM) -> torch.Tensor:
    """The random column signs s: fp32 [dim] of ±1, `torch.randint(0, 2, (dim,))` from a CPU
    `torch.Generator` seeded with `seed`, mapped 0 -> -1, 1 -> +1."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    bits = torch.randint(0, 2, (dim,), generator=gen)
    return bits.to(torch.float32) * 2 - 1


def hadamard_rotation(seed: int, dim: int = HADAMARD_DIM) -> torch.Tensor:
    """R = H · diag(s) / sqrt(dim): fp32 [dim, dim], orthogonal (R R^T = I to fp32 rounding).

    Every entry is ±fl32(1/sqrt(dim)); column j carries sign s_j (`rotation_signs`).
    Source: `shared/spec/kv-cache.md` §Full-attention layers.

    Raises:
        BuildError: dim is not a power of two.
    """
    h = sylvester_hadamard(dim)
    return h * rotation_signs(seed, dim)[None, :] * torch.tensor(1.0 / math.sqrt(dim))


def fold_qk_gains(g_q: torch.Tensor, g_k: torch.Tensor, rotation: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(M_q, M_k) for one full-attention layer, fp32 [D, D] each.

    g_q, g_k: the layer's q_norm / k_norm gains [D] (any float dtype, used as fp32);
    rotation: R [D, D] (hadamard-int4), or None for the unrotated "int4" comparison, where
    M_q = diag(g_q ⊙ g_k) and M_k = I. M_q[i, j] = R[i, j] · (g_q[j] · g_k[j]).
    """
    gain = g_q.float() * g_k.float()
    d = gain.shape[0]
    base = torch.eye(d) if rotation is None else rotation.float()
    return base * gain[None, :], base.clone()
