"""Which rows (token, slot) of a MoE chunk one expert serves, tile by tile: the grouped expert
GEMM's row lookups (plugins/moe_experts.py). Either a scan of the chunk's ids [M, k] in each
program, or (ALIGNED) a read of the expert's list made once per chunk by plugins/moe_align.py.
Both give the rows in token order, so the same row tiles.
"""

from __future__ import annotations

from ._common import jit, tl


@jit
def _tile_rows(ids_ptr, e, M, t, is_shared, TOPK: tl.constexpr, M_P: tl.constexpr,
               K_P: tl.constexpr, ROWS: tl.constexpr):
    """Token index, slot and validity of the ROWS rows of tile t of expert e."""
    mm = tl.arange(0, M_P)
    kk = tl.arange(0, K_P)
    ids = tl.load(ids_ptr + mm[:, None] * TOPK + kk[None, :],
                  mask=(mm < M)[:, None] & (kk < TOPK)[None, :], other=-1)
    match = ids == e
    has = tl.sum(match.to(tl.int32), 1) > 0
    slot = tl.sum(tl.where(match, kk[None, :], 0), 1)
    pos = tl.cumsum(has.to(tl.int32), 0) - 1
    jj = t * ROWS + tl.arange(0, ROWS)
    sel = has[None, :] & (pos[None, :] == jj[:, None])
    tok = tl.sum(tl.where(sel, mm[None, :], 0), 1)
    tslot = tl.sum(tl.where(sel, slot[None, :], 0), 1)
    valid = tl.sum(sel.to(tl.int32), 1) > 0
    tok = tl.where(is_shared, jj, tok)
    tslot = tl.where(is_shared, TOPK, tslot)
    valid = tl.where(is_shared, jj < M, valid)
    count = tl.where(is_shared, M, tl.sum(has.to(tl.int32), 0))
    return tok, tslot, valid, count


@jit
def _aligned_rows(rows_ptr, e, M, t, is_shared, TOPK: tl.constexpr, ROWS: tl.constexpr):
    """`_tile_rows` from expert e's list (plugins/moe_align.py: rows_ptr [E, M + 1])."""
    jj = t * ROWS + tl.arange(0, ROWS)
    base = rows_ptr + tl.maximum(e, 0).to(tl.int64) * (M + 1)
    cnt = tl.where(is_shared, 0, tl.load(base))
    packed = tl.load(base + 1 + jj, mask=jj < cnt, other=0)
    tok = tl.where(is_shared, jj, packed // (TOPK + 1))
    tslot = tl.where(is_shared, TOPK, packed % (TOPK + 1))
    valid = tl.where(is_shared, jj < M, jj < cnt)
    return tok, tslot, valid, tl.where(is_shared, M, cnt)


@jit
def _scan_rows(ids_ptr, e, M, t, is_shared, TOPK: tl.constexpr, M_P: tl.constexpr,
               K_P: tl.constexpr, ROWS: tl.constexpr, ALIGNED: tl.constexpr):
    """`_tile_rows`, or `_aligned_rows` when ids_ptr is the chunk's row lists (ALIGNED)."""
    if ALIGNED:
        return _aligned_rows(ids_ptr, e, M, t, is_shared, TOPK, ROWS)
    return _tile_rows(ids_ptr, e, M, t, is_shared, TOPK, M_P, K_P, ROWS)


@jit
def _rows(ids_ptr, e, r, M, t, is_shared, TOPK: tl.constexpr, M_P: tl.constexpr,
          K_P: tl.constexpr, ROWS: tl.constexpr, ONE: tl.constexpr, ALIGNED: tl.constexpr):
    """`_scan_rows`; ONE (a chunk of one token): routed unit r is slot r of token 0 and its
    expert appears once (top-k picks distinct experts), so row 0 of tile 0 is the only row:
    no scan."""
    if ONE:
        jj = t * ROWS + tl.arange(0, ROWS)
        slot = tl.where(is_shared, TOPK, r)
        return tl.zeros([ROWS], tl.int32), tl.zeros([ROWS], tl.int32) + slot, jj == 0, 1
    return _scan_rows(ids_ptr, e, M, t, is_shared, TOPK, M_P, K_P, ROWS, ALIGNED)


@jit
def _expert_count(ids_ptr, e, M, is_shared, TOPK: tl.constexpr, M_P: tl.constexpr,
                  K_P: tl.constexpr, ALIGNED: tl.constexpr):
    """Tokens of the chunk that picked expert e (M for the shared expert)."""
    if ALIGNED:
        cnt = tl.load(ids_ptr + tl.maximum(e, 0).to(tl.int64) * (M + 1))
        return tl.where(is_shared, M, cnt)
    mm = tl.arange(0, M_P)
    kk = tl.arange(0, K_P)
    ids = tl.load(ids_ptr + mm[:, None] * TOPK + kk[None, :],
                  mask=(mm < M)[:, None] & (kk < TOPK)[None, :], other=-1)
    has = tl.sum((ids == e).to(tl.int32), 1) > 0
    return tl.where(is_shared, M, tl.sum(has.to(tl.int32), 0))
