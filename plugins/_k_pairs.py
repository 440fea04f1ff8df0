"""K steps in pairs of blocks (fp8_gemv.K_PAIRS, moe_experts.K_PAIRS): the GEMV kernels' K
loop takes PAIRS blocks of BLOCK_K per step as the batches of one 3-D dot, one accumulator
each, and sums the batches after the loop. Triton gives each batch its own warps, so a tile
whose MMA needs one warp (the swapped small-batch forms) runs on two without repeating the
MMA or the decode; for two blocks the final sum is one fp32 add, whose order cannot matter,
and every form of a kernel (swapped or not, any tile) keeps that order: its bits stay a
function of the shape only. Measured: bench/ksplit_probe.py (h200-2026-12-02c/ks/).
"""

from __future__ import annotations

from ._common import jit, tl


@jit
def pair_operands(a, b, PAIRS: tl.constexpr):
    """a [R, PAIRS·BK], b [PAIRS·BK, C] -> ([PAIRS, R, BK], [PAIRS, BK, C]): the batched dot of
    the two gives, in batch p, the product over the K step's p-th block of BK columns alone
    (each batch its own MMA chain and accumulator; Triton gives the batches to different warps).
    Summed at the end (`tl.sum(acc, 0)`: for two blocks one fp32 add, whose order cannot
    matter), this is the K loop's reduction order in every form of a kernel."""
    R: tl.constexpr = a.shape[0]
    BK: tl.constexpr = a.shape[1] // PAIRS
    C: tl.constexpr = b.shape[1]
    return (tl.permute(tl.reshape(a, (R, PAIRS, BK)), (1, 0, 2)),
            tl.reshape(b, (PAIRS, BK, C)))
