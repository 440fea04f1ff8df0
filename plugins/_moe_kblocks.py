"""The MoE experts' swapped pass with K_BLOCKS > 1 (moe_experts.K_BLOCKS): each loop step of
BLOCK_K columns as KB blocks, the batches of one 3-D dot on KB warps (`_k_blocks`), one
accumulator per block, summed after the loop. AOT sm_90, a 64-row x 8-token tile (one token),
per warp and 256 K columns: 442 instructions in the 2-D pass at 4 warps, 217 with 8 blocks of
32 on 8 warps (60 KiB of shared memory at stages 4). Other bits than the 2-D pass: every chunk
size must take the same KB (batch invariance), so every chunk must be swapped.
"""

from __future__ import annotations

from ._common import jit, tl
from ._e4m3_decode import e4m3_to_bf16
from ._k_blocks import check_k_blocks, k_blocks


def check_moe_k_blocks(k_blocks_: int, block_k: int, swap_tokens: int, max_tokens: int) -> None:
    """ValueError naming moe_experts.K_BLOCKS unless `_k_blocks.check_k_blocks` accepts it and,
    above 1, every chunk is swapped (swap_tokens >= max_tokens: the unswapped pass has no
    blocks, so other bits)."""
    check_k_blocks("moe_experts", k_blocks_, block_k)
    if k_blocks_ > 1 and swap_tokens < max_tokens:
        raise ValueError(f"moe_experts.K_BLOCKS {k_blocks_} needs every chunk swapped "
                         f"(SWAP_TOKENS {swap_tokens} < MAX_TOKENS {max_tokens})")


@jit
def swapped_pass_blocks(a_ptr, wb, arow, valid, n_out, k_in, k_lo, k_hi, GATED: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                        DOT_F32: tl.constexpr, DECODE: tl.constexpr, KB: tl.constexpr):
    """g, up [ROWS, BLOCK_N] fp32 as moe_experts' `_swapped_pass` (W·x^T, gate rows over up
    rows when GATED) over K range [k_lo, k_hi), block j of each step into accumulator j."""
    WR: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    rr = tl.arange(0, WR)
    col = tl.program_id(0) * BLOCK_N + rr % BLOCK_N
    wrow = (col + (rr >= BLOCK_N).to(tl.int32) * n_out).to(tl.int64)   # up rows follow gate's
    wmask_n = col < n_out
    acc = tl.zeros([KB, WR, ROWS], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kx = k0 + tl.arange(0, BLOCK_K)
        kin = kx < k_in
        w = tl.load(wb + wrow[:, None] * k_in + kx[None, :], mask=wmask_n[:, None] & kin[None, :],
                    other=0.0)
        w = w.to(tl.float32) if DOT_F32 else e4m3_to_bf16(w, DECODE)
        xt = tl.load(a_ptr + arow[None, :] + kx[:, None], mask=kin[:, None] & valid[None, :],
                     other=0.0)
        if DOT_F32:
            xt = xt.to(tl.float32)
        w3, x3 = k_blocks(w, xt, KB)
        acc = tl.dot(w3, x3, acc)
    acc = tl.sum(acc, 0)
    if GATED:
        g, up = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N, ROWS]), [1, 2, 0]))
    else:
        g = acc
        up = acc
    return tl.trans(g), tl.trans(up)
