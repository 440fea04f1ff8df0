"""Split-K contract of the FP8 GEMM kernels (fp8_gemv, moe_experts): how K is cut into S
contiguous ranges, and the fixed-order sum of the S fp32 partials.

With S splits of a reduction of length K walked in BLOCK_K steps, range s is
``[s·C, min(K, (s+1)·C))`` with ``C = ceil(ceil(K / BLOCK_K) / S) · BLOCK_K``: boundaries are
multiples of BLOCK_K (so of the 64-wide FP8 scale blocks too), and each range keeps the
unsplit kernel's step order. :func:`num_splits` drops the ranges that would be empty
(``num_splits(K, S)`` gives the same C as S). Partials are summed s = 0, 1, ..., S-1 per element,
so the result depends on (K, S) only: deterministic, and batch-invariant whenever S is chosen
from the layer shape (never from the row count).
"""

from __future__ import annotations

from ._common import cdiv, jit, tl


def k_chunk(k: int, split: int, block_k: int) -> int:
    """Length C of each K range (the last one may be shorter)."""
    return cdiv(cdiv(k, block_k), max(1, split)) * block_k


def num_splits(k: int, split: int, block_k: int) -> int:
    """Non-empty ranges when ``split`` are asked for: 1 <= result <= split."""
    if k <= 0 or split <= 1:
        return 1
    return cdiv(k, k_chunk(k, split, block_k))


def k_ranges(k: int, split: int, block_k: int) -> list[tuple[int, int]]:
    """The K ranges :func:`k_range` gives programs s = 0..split-1 (host-side mirror, for tests)."""
    c = k_chunk(k, split, block_k)
    return [(s * c, min(k, (s + 1) * c)) for s in range(split)]


@jit
def k_range(k, s, SPLIT: tl.constexpr, BLOCK_K: tl.constexpr):
    """[lo, hi) of split s of K (empty when lo >= hi: the program then stores zeros)."""
    chunk = tl.cdiv(tl.cdiv(k, BLOCK_K), SPLIT) * BLOCK_K
    lo = s * chunk
    return lo, tl.minimum(k, lo + chunk)


@jit
def sum_splits(p_ptr, offs, mask, stride_s, SPLIT: tl.constexpr, CG: tl.constexpr = False):
    """Σ_s p[s·stride_s + offs] in fp32, s = 0..SPLIT-1 in that order. CG: read past L1
    (partials other programs of the same launch wrote)."""
    cm: tl.constexpr = ".cg" if CG else ""
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0, cache_modifier=cm)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + s * stride_s + offs, mask=mask, other=0.0, cache_modifier=cm)
    return acc
