"""The MoE experts' swapped pass with K_BLOCKS > 1 (moe_experts.K_BLOCKS): each loop step takes
KB blocks of BLOCK_K columns as the batches of one 3-D dot, one accumulator per block, and
sums the KB accumulators after the loop. Triton lays a 3-D dot's warps along its batch
dimension only, so with num_warps == KB each warp takes one block of every step over all the
tile's rows, and no warp repeats another's decode or MMA (with fewer blocks than warps they
do: bench/results/h200-2026-12-02c/README.md). AOT sm_90, a 64-row x 8-token tile, per warp
and 1,024 K columns: 64 HMMA / 256 PRMT in the 2-D pass at 4 warps, 32 / 128 with 8 blocks
at 8 warps. The sum order differs from the 2-D pass (other bits); every chunk size must take
the same KB (batch invariance). Suggested first timing (AOT: 217 instructions per warp per
256 columns against the 2-D pass's 221 per 128, 60 KiB of shared memory at stages 4):
``--set moe_experts.K_BLOCKS=8 --set moe_experts.BLOCK_K=32``.
"""

from __future__ import annotations

from ._common import jit, tl
from ._e4m3_decode import e4m3_to_bf16


def check_k_blocks(k_blocks: int, swap_tokens: int, max_tokens: int) -> None:
    """ValueError naming moe_experts.K_BLOCKS unless it is 1, or 2 / 4 / 8 / 16 with every chunk
    swapped (swap_tokens >= max_tokens: the unswapped pass has no blocks, so other bits)."""
    if k_blocks != 1 and (k_blocks not in (2, 4, 8, 16) or swap_tokens < max_tokens):
        raise ValueError(f"moe_experts.K_BLOCKS: 1, or 2 / 4 / 8 / 16 with every chunk swapped "
                         f"(SWAP_TOKENS >= MAX_TOKENS {max_tokens}), got {k_blocks} with "
                         f"SWAP_TOKENS {swap_tokens}")


@jit
def swapped_pass_blocks(a_ptr, wb, arow, valid, n_out, k_in, k_lo, k_hi, GATED: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                        DOT_F32: tl.constexpr, DECODE: tl.constexpr, KB: tl.constexpr):
    """g, up [ROWS, BLOCK_N] fp32 as moe_experts' `_swapped_pass` (W·x^T, gate rows over up
    rows when GATED) over K range [k_lo, k_hi), in steps of KB blocks, block j of each step
    into accumulator j; the accumulators summed after the loop (tl.sum over the blocks)."""
    WR: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    STEP: tl.constexpr = BLOCK_K * KB
    rr = tl.arange(0, WR)
    col = tl.program_id(0) * BLOCK_N + rr % BLOCK_N
    wrow = (col + (rr >= BLOCK_N).to(tl.int32) * n_out).to(tl.int64)   # up rows follow gate's
    wmask_n = col < n_out
    acc = tl.zeros([KB, WR, ROWS], tl.float32)
    for k0 in range(k_lo, k_hi, STEP):
        kx = k0 + tl.arange(0, STEP)
        kin = kx < k_hi   # the step's last blocks may pass the end of the range
        w = tl.load(wb + wrow[:, None] * k_in + kx[None, :], mask=wmask_n[:, None] & kin[None, :],
                    other=0.0)
        w = w.to(tl.float32) if DOT_F32 else e4m3_to_bf16(w, DECODE)
        xt = tl.load(a_ptr + arow[None, :] + kx[:, None], mask=kin[:, None] & valid[None, :],
                     other=0.0)
        if DOT_F32:
            xt = xt.to(tl.float32)
        w3 = tl.permute(tl.reshape(w, (WR, KB, BLOCK_K)), (1, 0, 2))
        acc = tl.dot(w3, tl.reshape(xt, (KB, BLOCK_K, ROWS)), acc)
    acc = tl.sum(acc, 0)
    if GATED:
        g, up = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N, ROWS]), [1, 2, 0]))
    else:
        g = acc
        up = acc
    return tl.trans(g), tl.trans(up)
