"""A K step as KB blocks on KB warps (fp8_gemv.K_BLOCKS, moe_experts.K_BLOCKS): the step's
BLOCK_K columns split into KB blocks that are the batches of one 3-D dot, one accumulator per
block, the accumulators summed after the loop. Triton lays a 3-D dot's warps along its batch
dimension only, so the kernel must run with num_warps == KB: then each warp takes one block of
every step over all the tile's rows and no warp repeats another's decode or MMA (with fewer
blocks than warps they do, bench/results/h200-2026-12-02c/README.md). One-warp tiles gain the
warps: QKV at one row 7.04 -> 5.62 µs with 4 blocks of 64 on 4 warps, 5.24 with 2 of 256
(bench/ksplit_probe.py, ks/). The MoE's swapped pass, AOT sm_90, a 64-row x 8-token tile, per
warp and 256 K columns: 442 instructions with one accumulator at 4 warps, 217 with 8 blocks of
32 on 8 warps. The sum order differs from one accumulator's (other bits), so every form of a
kernel takes the same KB (batch invariance).
"""

from __future__ import annotations

from ._common import jit, tl

K_BLOCK_COUNTS = (1, 2, 4, 8)   # KB values the kernels take (1: the 2-D form)


def check_k_blocks(owner: str, k_blocks, block_k: int, every_form: bool = True) -> None:
    """ValueError naming `owner`'s K_BLOCKS unless it is one of K_BLOCK_COUNTS with blocks of
    at least 16 columns (the MMA's K), and, above 1, every form of the kernel takes the blocks
    (every_form; the MoE's unswapped pass has none: other bits)."""
    if k_blocks not in K_BLOCK_COUNTS or block_k % (16 * k_blocks):
        raise ValueError(f"{owner}.K_BLOCKS: one of {K_BLOCK_COUNTS} dividing BLOCK_K "
                         f"({block_k}) into blocks of >= 16 columns, got {k_blocks!r}")
    if k_blocks > 1 and not every_form:
        raise ValueError(f"{owner}.K_BLOCKS {k_blocks}: every form must take the blocks (for "
                         "moe_experts every chunk swapped, SWAP_TOKENS >= MAX_TOKENS)")


@jit
def k_blocks(a, b, KB: tl.constexpr):
    """a [R, KB·BK], b [KB·BK, C] -> ([KB, R, BK], [KB, BK, C]): batch j of the dot of the two
    is the product over the step's j-th block of BK columns alone."""
    R: tl.constexpr = a.shape[0]
    BK: tl.constexpr = a.shape[1] // KB
    C: tl.constexpr = b.shape[1]
    return tl.permute(tl.reshape(a, (R, KB, BK)), (1, 0, 2)), tl.reshape(b, (KB, BK, C))
