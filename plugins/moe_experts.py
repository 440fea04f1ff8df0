"""Grouped FP8 expert GEMM for small batches: reads only the selected experts, each once.

One launch covers the routed experts and the shared one. Program (n-tile, u): the first SH
units are the shared expert (slot k), one per SHARED_TOKENS tokens of the chunk; each later
unit r is the (token, slot) pair r of ``ids`` [M, k], which runs only if its expert id appears
for the first time at r (row-major), or, in chunks of BY_EXPERT_TOKENS tokens or more, expert
r, which runs only if some token picked it. A routed unit serves every token that picked its
expert (found by scanning ids, or read from per-expert lists: ALIGN_TOKENS, moe_align.py): one
pass over the expert's weight tile per row tile of its tokens (8 with SWAP, else 16; almost
always one).
- GATED (gate_up): w [E, 2N, K] (rows 0..N-1 gate_proj, N..2N-1 up_proj), input x [M, K];
  writes act[m, slot, :N] = bf16(silu(s_e·x·gateᵀ) · (s_e·x·upᵀ)).
- not GATED (down): w [E, N, K], input act[m, slot, :K]; writes out[m, slot, :N] = fp32 s_e·act·wᵀ.
Weights e4m3 with one fp32 scale per expert (shared/spec/kolibri-1.md, plugins/LAYOUTS.md).
Batch invariance: fixed K order per output (both operand orders give the same bits); a token's
rows never mix with other tokens'.

Split-K (``split_k_for``; default 1 = the single-pass kernel): program (n-tile, u, s) walks K range
s (plugins/_split_k.py) and stores unscaled fp32 partials [S, G, M, k+1, Np] (G = 2: gate, up;
G = 1: down); ``moe_split_combine.py`` sums them in the order s = 0..S-1 and applies the
expert scale (and silu(gate)·up), writing the same act / out rows. S is a function of the layer
shape only.
"""

from __future__ import annotations

import torch

from ._common import cdiv, jit, launch, next_pow2, tl
from ._common import early_launch, pdl_enter, pdl_release
from ._split_k import k_range, num_splits
from ._e4m3_decode import check_decode
from .moe_split_combine import launch_split_combine
from ._moe_rows import _expert_count, _rows, _scan_rows
from ._k_blocks import check_k_blocks
from ._moe_passes import _fixup_tile, _plain_pass, _store_tile, _swapped_pass

ROWS = 16
# Tokens per launch (callers chunk larger batches): each chunk reads its experts once, so a
# verification pass of 80 tokens in chunks of 64 read ~280 experts per layer instead of ~216
# (16 streams at 8k, 4 -> 5 tokens per stream 20.5 -> 28.2 ms, h200-2026-12-01d/nx/fullsize.log).
# H200, moe_forward µs at M = 80 / 128 / 192 / 256 (the same bits; bench/moe_chunks.py,
# bench/results/h200-2026-12-01e/oe/chunks.log): chunks of 64 481.3 / 697.2 / 1021.5 / 1370.0,
# of 128 388.0 / 440.9 / 782.7 / 897.7, of 256 388.7 / 441.5 / 501.6 / 560.1.
MAX_TOKENS = 256
SHARED_TOKENS = 64       # the shared expert's tokens per unit past that many (SH units)
# Chunks of at least BY_EXPERT_TOKENS tokens give each expert one unit (E units) instead of
# each (token, slot) pair (M·k units, most of them idle past E / k tokens): at M=64 336.7 ->
# 324.2 µs, at 128 456.0 -> 440.9 (oe/chunks.log). With row lists (ALIGN_TOKENS) from 16
# tokens instead of 33 (h200-2026-12-02a/oi/chunks.log): M=16 134.8 -> 137.7 µs, 24 181.5 ->
# 177.9, 32 225.2 -> 220.7: from 24.
BY_EXPERT_TOKENS = 24
# Chunks of at least ALIGN_TOKENS tokens (>= BY_EXPERT_TOKENS) read each expert's rows from
# lists made once per chunk (plugins/moe_align.py: one more launch) instead of every program
# scanning the chunk's ids (at 256 tokens the down projection's 5,200 programs scan 1,536 ids
# each for 6 K steps of work, Nsight Compute h200-2026-12-01e/nr/). The same rows in the same
# order: the same bits. H200, moe_forward µs at M = 48 / 64 / 80 / 128 / 192 / 256, scanning ->
# lists (bench/moe_chunks.py, bench/results/h200-2026-12-02a/oh/chunks.log): 279.1 / 321.7 /
# 384.1 / 434.7 / 498.7 / 560.4 -> 275.6 / 318.7 / 345.0 / 389.0 / 427.7 / 478.7; at 256
# tokens the down projection 245.7 -> 152.8 µs (Nsight Compute, -12-01e/nr/ -> -12-02a/oh/).
ALIGN_TOKENS = 24
# K step: 128 against 256 (H200, bench/results/h200-2026-11-30h/zp/): same bits, half the shared
# memory, faster at every M then (M=64 728.5 -> 641.0 µs)
BLOCK_K = 128
BLOCK_N_GATED, BLOCK_N_DOWN = 32, 128  # one width at every M (TILES_BY_TOKENS False: sweeps)
# Output columns per program by tokens in the chunk (TILES_BY_TOKENS): (up to M tokens, width)
# per pass, from the H200 sweep of 2026-11-30 (bench/results/h200-2026-11-30c/d_moe_tiles.log):
# gate_up 64 wins at M=64 (807 vs 852 µs, down 128) and loses at M=1 and 16; down 64 wins at
# M=1 (50.1 vs 53.4 µs). The N tile only groups output columns: no output's K order changes
# (16-row mma tiles), so the bits do not depend on it (gpu_check moe: batch invariance
# M=1,3,16 vs 64).
TILES_BY_TOKENS = True
TILE_N = {True: ((32, 32), (1 << 30, 64)), False: ((4, 64), (1 << 30, 128))}  # gated?
TUNE = dict(num_warps=4, num_stages=3)  # launch config (bench/plugins.py sweeps it)
DECODE = 3   # e4m3 -> bf16 on the GPU: 1 Triton's conversion, 3 bit placement (_e4m3_decode)
# Chunks of at most SWAP_TOKENS tokens (0: none) compute out^T = W·x^T: the weight tile is the
# MMA's A operand (gate and up rows stacked in one [2·BLOCK_N, BLOCK_K] tile) and the tokens its
# N, in ROWS_SWAP-token tiles (the MMA's smallest N), instead of x·W^T in 16-token tiles: no
# operand moves, half the HMMAs, the same bits. H200, µs, 16-row form -> swapped (stages of
# the TUNE_SWAP* below; plugins/NOTES.md, bench/results/h200-2026-12-01b/nm/ and -01c/nq/):
# M=1 30.4 -> 25.2, M=4 56.8 -> 50.4, M=16 147.2 -> 137.9, M=64 406.6 -> 384.6.
SWAP_TOKENS = 1 << 30    # every chunk
ROWS_SWAP = 8
TUNE_SWAP = dict(num_warps=4, num_stages=4)        # launch config, chunks of 1-2 tokens
TUNE_SWAP_WIDE = dict(num_warps=4, num_stages=3)   # chunks of 3-8 tokens
TUNE_SWAP_MANY = dict(num_warps=4, num_stages=4)   # chunks of 9-32 tokens
# chunks of 33 to SWAP_TOKENS tokens: with TILE_LOOP at M=64 stages 4 / 5 / 6 338.4 / 333.0 /
# 332.5 µs, at M=16 136.3 / 137.8 / 143.4 (bench/results/h200-2026-12-01d/nx/pipeline.log)
TUNE_SWAP_MOST = dict(num_warps=4, num_stages=5)
# Row tiles after the first as a runtime loop (one copy of the pass; the bits are the same):
# AOT sm_90 at 64 tokens (8 tiles of 8) 7984 -> 2160 instructions, 202 -> 188 registers; H200
# (bench/results/h200-2026-12-01d/nw/pipeline.log), µs: M=64 382.0 -> 340.6, M=1/4/16 alike.
TILE_LOOP = True
SPLIT_K_GATED, SPLIT_K_DOWN = 1, 1    # K splits per pass (split_k_for; bench/plugins.py sweeps)
# Blocks per K step of the swapped pass, a warp each (plugins/_k_blocks.py); 1: one
K_BLOCKS = 1   # accumulator. Others: other bits, need every chunk swapped; untimed (NOTES)
# With split-K, chunks of at most FIXUP_TOKENS tokens sum the K ranges in the launch (the last
# program of each tile, by a counter: _moe_passes._fixup_tile) instead of moe_split_combine's
# launch; the same bits. 0: always the combine launch. One shared unit at most (<= SHARED_TOKENS).
FIXUP_TOKENS = 16
MAX_FIXUP_TILES = 1 << 14   # counters per device: n-tiles x units x row tiles of one launch
_COUNTERS: dict = {}


def _counters(device: torch.device) -> torch.Tensor:
    """int32 [MAX_FIXUP_TILES] zeros on `device` for FIXUP, kept zero by each tile's last
    program (one launch at a time per device: the graphs' stream order).
    Raises RuntimeError when first asked for inside a CUDA graph capture (run once eagerly)."""
    key = str(device)
    if key not in _COUNTERS:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("moe_experts: split-K counters first needed inside a CUDA graph "
                               "capture; run the MoE once eagerly before capturing")
        _COUNTERS[key] = torch.zeros(MAX_FIXUP_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[key]


@jit
def _unit_tile(a_ptr, ids_ptr, wb, scale, o_ptr, y_ptr, cnt_ptr, sy_s, e, r, is_shared, n, nmask,
               n_out, k_in, t,
               M, sa_m, sa_s, so_s, sp_s, sp_g, TOPK: tl.constexpr, GATED: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
               M_P: tl.constexpr, K_P: tl.constexpr, DOT_F32: tl.constexpr,
               SPLIT: tl.constexpr, DECODE: tl.constexpr, ONE: tl.constexpr,
               SWAP: tl.constexpr, ALIGNED: tl.constexpr, KB: tl.constexpr, FIXUP: tl.constexpr):
    """Row tile t (a compile-time constant) of one expert on this program's n-tile. Tile 0
    always has rows; a later tile first counts the expert's tokens and scans for its rows only
    when it has some (an expert rarely has more than 16 tokens: at 64 tokens most programs
    skipped three row scans)."""
    if t == 0:
        tok, tslot, valid, count = _rows(ids_ptr, e, r, M, t, is_shared, TOPK, M_P, K_P, ROWS,
                                         ONE, ALIGNED)
        _tile_pass(a_ptr, ids_ptr, wb, scale, o_ptr, y_ptr, cnt_ptr, sy_s, e, is_shared, n, nmask,
                   n_out, k_in, t,
                   M, sa_m, sa_s, so_s, sp_s, sp_g, tok, tslot, valid, TOPK, GATED, BLOCK_N,
                   BLOCK_K, ROWS, M_P, K_P, DOT_F32, SPLIT, DECODE, SWAP, ALIGNED, KB, FIXUP)
    else:
        if _expert_count(ids_ptr, e, M, is_shared, TOPK, M_P, K_P, ALIGNED) > t * ROWS:
            tok, tslot, valid, count = _rows(ids_ptr, e, r, M, t, is_shared, TOPK, M_P, K_P,
                                             ROWS, ONE, ALIGNED)
            _tile_pass(a_ptr, ids_ptr, wb, scale, o_ptr, y_ptr, cnt_ptr, sy_s, e, is_shared, n,
                       nmask, n_out, k_in,
                       t, M, sa_m, sa_s, so_s, sp_s, sp_g, tok, tslot, valid, TOPK, GATED,
                       BLOCK_N, BLOCK_K, ROWS, M_P, K_P, DOT_F32, SPLIT, DECODE, SWAP, ALIGNED,
                       KB, FIXUP)


@jit
def _tile_pass(a_ptr, ids_ptr, wb, scale, o_ptr, y_ptr, cnt_ptr, sy_s, e, is_shared, n, nmask,
               n_out, k_in, t,
               M, sa_m, sa_s, so_s, sp_s, sp_g, tok, tslot, valid, TOPK: tl.constexpr,
               GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               ROWS: tl.constexpr, M_P: tl.constexpr, K_P: tl.constexpr,
               DOT_F32: tl.constexpr, SPLIT: tl.constexpr, DECODE: tl.constexpr,
               SWAP: tl.constexpr, ALIGNED: tl.constexpr, KB: tl.constexpr, FIXUP: tl.constexpr):
    """One pass over the expert's weight tile for the rows (tok, tslot, valid) of tile t.
    The K loop holds no branch, so Triton pipelines its loads (cp.async; a branch inside kept
    it from doing so: plugins/NOTES_HISTORY.md, 2026-11-30g). A second row tile re-reads the
    weights (mostly from L2): only experts with more than ROWS tokens."""
    arow = tok.to(tl.int64) * sa_m + tslot.to(tl.int64) * sa_s
    if SPLIT == 1:
        k_lo = 0
        k_hi = k_in
    else:
        k_lo, k_hi = k_range(k_in, tl.program_id(2), SPLIT, BLOCK_K)
    if SWAP:
        g, up = _swapped_pass(a_ptr, wb, arow, valid, n_out, k_in, k_lo, k_hi, GATED, BLOCK_N,
                              BLOCK_K, ROWS, DOT_F32, DECODE, KB)
    else:
        g, up = _plain_pass(a_ptr, wb, arow, valid, n, nmask, n_out, k_in, k_lo, k_hi, GATED,
                            BLOCK_N, BLOCK_K, ROWS, DOT_F32, DECODE)
    if M_P > ROWS:  # several row tiles: the rows again (kept live across the loop they cost
        #             registers: AOT sm_90 at 64 tokens 224 -> 249); one tile: kept (126 -> 96)
        tok, tslot, valid, count = _scan_rows(ids_ptr, e, M, t, is_shared, TOPK, M_P, K_P,
                                              ROWS, ALIGNED)
    _store_tile(o_ptr, tok, tslot, valid, g, up, scale, n, nmask, so_s, sp_s, sp_g, TOPK,
                GATED, SPLIT)
    if FIXUP:   # split-K summed here (counter per (n-tile, unit, row tile); one shared unit)
        tile = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.cdiv(M, ROWS) + t
        _fixup_tile(o_ptr, y_ptr, cnt_ptr, tile, tok, tslot, valid, scale, n, nmask, so_s, sp_s,
                    sp_g, sy_s, TOPK, GATED, SPLIT)


@jit
def _unit(a_ptr, ids_ptr, w_ptr, ws_ptr, shw_ptr, shs_ptr, o_ptr, y_ptr, cnt_ptr, sy_s, e, r,
          is_shared,
          M, N, K, N_SH, K_SH, sa_m, sa_s, so_s, sp_s, sp_g,
          TOPK: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          ROWS: tl.constexpr, MT: tl.constexpr, M_P: tl.constexpr, K_P: tl.constexpr,
          DOT_F32: tl.constexpr, SPLIT: tl.constexpr, DECODE: tl.constexpr,
          ONE: tl.constexpr, SWAP: tl.constexpr, LOOP: tl.constexpr, ALIGNED: tl.constexpr,
          KB: tl.constexpr, FIXUP: tl.constexpr):
    """One expert (e, or the shared one) on n-tile program_id(0) (K range program_id(2)):
    every token that picked it, one pass over the expert's weight tile per row tile. LOOP
    (TILE_LOOP): the row tiles after the first as a runtime loop over the expert's tiles (one
    copy of the pass) instead of MT unrolled copies."""
    n_out = tl.where(is_shared, N_SH, N)
    k_in = tl.where(is_shared, K_SH, K)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if tl.program_id(0) * BLOCK_N < n_out:
        rows_w = 2 * n_out if GATED else n_out
        if is_shared:
            wb = shw_ptr
            scale = tl.load(shs_ptr)
        else:
            wb = w_ptr + e.to(tl.int64) * rows_w * k_in
            scale = tl.load(ws_ptr + e)
        nmask = n < n_out
        if LOOP and MT > 2:
            _unit_tile(a_ptr, ids_ptr, wb, scale, o_ptr, y_ptr, cnt_ptr, sy_s, e, r, is_shared, n,
                       nmask, n_out, k_in, 0,
                       M, sa_m, sa_s, so_s, sp_s, sp_g, TOPK, GATED, BLOCK_N, BLOCK_K, ROWS,
                       M_P, K_P, DOT_F32, SPLIT, DECODE, ONE, SWAP, ALIGNED, KB, FIXUP)
            tiles = tl.cdiv(_expert_count(ids_ptr, e, M, is_shared, TOPK, M_P, K_P, ALIGNED),
                            ROWS)
            for t in range(1, tiles):
                tok, tslot, valid, count = _rows(ids_ptr, e, r, M, t, is_shared, TOPK, M_P, K_P,
                                                 ROWS, ONE, ALIGNED)
                _tile_pass(a_ptr, ids_ptr, wb, scale, o_ptr, y_ptr, cnt_ptr, sy_s, e, is_shared,
                           n, nmask, n_out, k_in,
                           t, M, sa_m, sa_s, so_s, sp_s, sp_g, tok, tslot, valid, TOPK, GATED,
                           BLOCK_N, BLOCK_K, ROWS, M_P, K_P, DOT_F32, SPLIT, DECODE, SWAP,
                           ALIGNED, KB, FIXUP)
        else:
            for t in tl.static_range(MT):
                _unit_tile(a_ptr, ids_ptr, wb, scale, o_ptr, y_ptr, cnt_ptr, sy_s, e, r,
                           is_shared, n, nmask, n_out,
                           k_in, t, M, sa_m, sa_s, so_s, sp_s, sp_g, TOPK, GATED, BLOCK_N,
                           BLOCK_K, ROWS, M_P, K_P, DOT_F32, SPLIT, DECODE, ONE, SWAP, ALIGNED,
                           KB, FIXUP)


@jit
def _moe_expert_kernel(a_ptr, ids_ptr, w_ptr, ws_ptr, shw_ptr, shs_ptr, o_ptr, y_ptr, cnt_ptr,
                       M, N, K, N_SH, K_SH, sa_m, sa_s, so_s, sp_s, sp_g, sy_s,
                       TOPK: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, ROWS: tl.constexpr, MT: tl.constexpr,
                       M_P: tl.constexpr, K_P: tl.constexpr, U_P: tl.constexpr,
                       DOT_F32: tl.constexpr, SPLIT: tl.constexpr = 1,
                       DECODE: tl.constexpr = 1, ONE: tl.constexpr = False,
                       SHARED: tl.constexpr = True, SWAP: tl.constexpr = False,
                       LOOP: tl.constexpr = False, SH: tl.constexpr = 1,
                       SH_TOKENS: tl.constexpr = 64, BY_EXPERT: tl.constexpr = False,
                       ALIGNED: tl.constexpr = False, KB: tl.constexpr = 1,
                       FIXUP: tl.constexpr = False,
                       PDL: tl.constexpr = 0):
    """Program (n-tile, u[, K range]). SHARED: units 0..SH-1 are the shared expert, unit j
    for tokens [j·SH_TOKENS, (j+1)·SH_TOKENS) (SH > 1 past SH_TOKENS tokens),
    and unit u >= SH the routed unit r = u - SH (else r = u): the shared expert's programs,
    which pass over the weights once per row tile, are the first the GPU starts (the grid's
    program_id(0) runs fastest). Routed unit r is the (token, slot) pair r of ids, run only if
    its expert first appears at r; BY_EXPERT: expert r, run only if some token picked it.
    SPLIT > 1: o_ptr is the fp32 partial buffer (split stride sp_s, up at +sp_g, slot stride
    so_s); program_id(2) is the K range. ONE: M == 1 (no duplicate units). ALIGNED (with
    BY_EXPERT): ids_ptr is the chunk's per-expert row lists (plugins/moe_align.py), not ids."""
    pdl_enter(PDL)
    u = tl.program_id(1)
    is_shared = (u < SH) & SHARED
    r = u - SH if SHARED else u
    if SH > 1:   # shared unit u: its token group as a chunk of its own (rows, outputs, count)
        sh0 = tl.where(is_shared, u * SH_TOKENS, 0)
        a_ptr += sh0.to(tl.int64) * sa_m
        o_ptr += sh0.to(tl.int64) * (TOPK + 1) * so_s
        M = tl.where(is_shared, tl.minimum(M - sh0, SH_TOKENS), M)
    uu = tl.arange(0, U_P)
    if ALIGNED:
        e = tl.where(is_shared, -1, r)
        first = _expert_count(ids_ptr, e, M, False, TOPK, M_P, K_P, True) > 0
    elif BY_EXPERT:
        e = tl.where(is_shared, -1, r)
        picks = tl.load(ids_ptr + uu, mask=uu < M * TOPK, other=-1)
        first = tl.sum((picks == e).to(tl.int32), 0) > 0
    elif ONE:
        e = tl.load(ids_ptr + r, mask=(r >= 0) & (r < M * TOPK), other=-1)
        first = True
    else:
        e = tl.load(ids_ptr + r, mask=(r >= 0) & (r < M * TOPK), other=-1)
        prev = tl.load(ids_ptr + uu, mask=uu < tl.minimum(r, M * TOPK), other=-1)
        first = tl.sum((prev == e).to(tl.int32), 0) == 0
    if first | is_shared:
        _unit(a_ptr, ids_ptr, w_ptr, ws_ptr, shw_ptr, shs_ptr, o_ptr, y_ptr, cnt_ptr, sy_s, e, r,
              is_shared, M, N, K,
              N_SH, K_SH, sa_m, sa_s, so_s, sp_s, sp_g, TOPK, GATED, BLOCK_N, BLOCK_K, ROWS,
              MT, M_P, K_P, DOT_F32, SPLIT, DECODE, ONE, SWAP, LOOP, ALIGNED, KB, FIXUP)
    pdl_release(PDL)      # at the end: no earlier point in this kernel (PDL 2)


def block_n_for(n: int, gated: bool, m: int = MAX_TOKENS) -> int:
    """Output columns per program for a chunk of m tokens (TILE_N; the global widths when
    TILES_BY_TOKENS is off): the N tiling only groups output columns, so it may follow the
    batch without changing bits."""
    if not TILES_BY_TOKENS:
        return BLOCK_N_GATED if gated else BLOCK_N_DOWN
    return next(w for most, w in TILE_N[gated] if m <= most)


def split_k_for(n: int, k: int, gated: bool) -> int:
    """K splits asked for (a function of the layer shape only: batch invariance); the launch
    drops empty ranges (_split_k.num_splits)."""
    return SPLIT_K_GATED if gated else SPLIT_K_DOWN


def _tune(tokens: int, swap: bool) -> dict:
    """Launch config (warps, stages) of a chunk of `tokens` tokens; no effect on the bits."""
    if not swap:
        return TUNE
    if tokens <= 8:
        tune = TUNE_SWAP if tokens <= 2 else TUNE_SWAP_WIDE
    else:
        tune = TUNE_SWAP_MANY if tokens <= 32 else TUNE_SWAP_MOST
    return tune if K_BLOCKS == 1 else dict(tune, num_warps=K_BLOCKS)   # a warp per K block


def launch_moe_experts(a, ids, w, ws, shw, shs, out, n, n_sh, k, k_sh, gated: bool, sa_s: int,
                       interpret: bool = False, expert_rows=None) -> None:
    """Launch the grouped expert kernel for one chunk of <= MAX_TOKENS tokens (see module
    docstring).

    a: bf16 input rows (x [M, K] with sa_s = 0, or act [M, k+1, K] with sa_s = its slot stride);
    ids: int32 [M, k]; w: e4m3 [E, 2n|n, K]; ws: fp32 [E]; shw: e4m3 [1, 2n_sh|n_sh, K] or None;
    shs: fp32 [1]; out: bf16 act [M, k+1, >= n] (gated) or fp32 [M, k+1, >= n] (down).
    expert_rows: None, or the chunk's per-expert row lists int32 [E, M + 1]
    (plugins/moe_align.py) read instead of scanning ids: only for chunks of BY_EXPERT_TOKENS
    tokens or more.
    With split_k_for(...) > 1: the expert kernel over (n-tiles, units, S), then the combine
    (up to FIXUP_TOKENS tokens: summed in the launch, the same bits).
    Raises: ValueError on more than MAX_TOKENS tokens, or rows for a chunk whose units are
    (token, slot) pairs.
    """
    M, topk = ids.shape
    if M > MAX_TOKENS:
        raise ValueError(f"ids: {M} tokens in one launch, at most {MAX_TOKENS}")
    by_expert = M >= BY_EXPERT_TOKENS and M > 1
    if expert_rows is not None and not by_expert:
        raise ValueError(f"expert_rows: per-expert lists need units by expert ({M} tokens < "
                         f"BY_EXPERT_TOKENS {BY_EXPERT_TOKENS}; ALIGN_TOKENS {ALIGN_TOKENS})")
    sh = cdiv(M, SHARED_TOKENS) if shw is not None else 0
    units = (w.shape[0] if by_expert else M * topk) + sh
    bn = block_n_for(n, gated, M)
    n_sh_eff, k_sh_eff = (n_sh, k_sh) if shw is not None else (0, 0)
    grid = (cdiv(max(n, n_sh_eff), bn), units)
    split = num_splits(max(k, k_sh_eff), split_k_for(n, k, gated), BLOCK_K)
    check_decode("moe_experts", DECODE)
    swap = M <= SWAP_TOKENS
    check_k_blocks("moe_experts", K_BLOCKS, BLOCK_K, SWAP_TOKENS >= MAX_TOKENS)
    rows = ROWS_SWAP if swap else ROWS
    mt = cdiv(M, rows)
    if TILE_LOOP and mt > 2:   # the same code for every mt > 2 (a runtime loop): one compile,
        mt = 3                 # not one per row-tile count (M = 1-256: 83 -> 33 kernel variants)
    meta = dict(TOPK=topk, GATED=gated, BLOCK_N=bn, BLOCK_K=BLOCK_K, ROWS=rows, MT=mt,
                M_P=max(rows, next_pow2(M)), K_P=max(2, next_pow2(topk)),
                U_P=max(16, next_pow2(M * topk)), DOT_F32=interpret,
                DECODE=1 if interpret else DECODE, ONE=M == 1, SHARED=shw is not None,
                SWAP=swap, LOOP=TILE_LOOP, SH=max(sh, 1), SH_TOKENS=SHARED_TOKENS,
                BY_EXPERT=by_expert, ALIGNED=expert_rows is not None, KB=K_BLOCKS,
                interpret=interpret, **_tune(M, swap))
    shw, shs = (shw, shs) if shw is not None else (w, ws)  # placeholders: never read
    lookup = ids if expert_rows is None else expert_rows
    if split == 1:
        launch(_moe_expert_kernel, grid, a, lookup, w, ws, shw, shs, out, out, out, M, n, k,
               n_sh, k_sh, a.stride(0), sa_s, out.stride(1), 0, 0, 0,
               pdl_early=early_launch("moe", M), **meta)
        return
    width = max(n, n_sh_eff)
    part = torch.empty((split, 2 if gated else 1, M, topk + 1, width), dtype=torch.float32,
                       device=out.device)
    fixup = M <= min(FIXUP_TOKENS, SHARED_TOKENS)
    tiles = grid[0] * grid[1] * cdiv(M, rows)
    if fixup and tiles > MAX_FIXUP_TILES:
        raise ValueError(f"moe_experts: {tiles} tiles for the split-K counters, at most "
                         f"{MAX_FIXUP_TILES} (MAX_FIXUP_TILES)")
    cnt = _counters(out.device) if fixup else part
    launch(_moe_expert_kernel, grid + (split,), a, lookup, w, ws, shw, shs, part, out, cnt, M, n,
           k, n_sh, k_sh, a.stride(0), sa_s, part.stride(3), part.stride(0), part.stride(1),
           out.stride(1), SPLIT=split, FIXUP=fixup, pdl_early=early_launch("moe", M), **meta)
    if not fixup:
        launch_split_combine(part, ids, ws, shs, out, n, n_sh_eff, gated, split, interpret)
