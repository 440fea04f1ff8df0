"""The index columns of a chained drafter round, computed on the device in one launch.

A chained round (kolibri_trt's `spec/drafter_chain.py`) follows a verified step on the device:
per stream, its accepted drafts a are the leading drafts equal to the target's own token at
their row (greedy / position-keyed acceptance, shared/spec/speculative-decoding.md), its anchor
p = start + a, its next token the target's token at row row0 + a (the bonus token), and its
commit rows are positions start - 1 .. start - 1 + a, whose next tokens are the step's input ids
at rows row0 .. row0 + a. From these the round's and the commit's index columns are written
(the layout of kolibri_trt's `DrafterRunner`: rows next id, slot, position, history row, ring
row, RoPE row). In torch that is about 58 small ops, each a launch inside the round's CUDA graph;
here it is one program: every stream a lane, its drafts unrolled (width is small: 1 +
num_speculative_tokens). On the H200, one stream, the chained round's GPU time went from 0.314
to 0.233 ms with it (bench/results/h200-2026-11-30j/, `tl/` against `tc/`).
Remainders are floor remainders (Python's and torch's `%`) whatever the sign.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import pdl_enter, pdl_release

FIELDS = 5      # fields rows: first row in the step, drafts k, start position, ring slot, valid


@jit
def _fmod(x, m):
    """Floor remainder of int64 x by m > 0 (C's % truncates; the interpreter floors)."""
    r = x % m
    return tl.where(r < 0, r + m, r)


@jit
def _chain_index_kernel(f_ptr, f_stride, inp_ptr, own_ptr, last, off_ptr, r_ptr, r_stride,
                        c_ptr, c_stride, ring_size, hist_rows, trash,
                        S_B: tl.constexpr, W: tl.constexpr, W_P: tl.constexpr,
                        DEPTH: tl.constexpr, B: tl.constexpr, B_P: tl.constexpr,
                        N_B: tl.constexpr, N_P: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    s = tl.arange(0, S_B)
    row0 = tl.load(f_ptr + s)
    k = tl.load(f_ptr + f_stride + s)
    start = tl.load(f_ptr + 2 * f_stride + s)
    slot = tl.load(f_ptr + 3 * f_stride + s)
    valid = tl.load(f_ptr + 4 * f_stride + s) != 0
    a = tl.zeros([S_B], tl.int64)
    alive = tl.full([S_B], 1, tl.int1)
    for j in tl.static_range(W - 1):            # leading drafts equal to the target's own
        ri = tl.minimum(row0 + j, last - 1)
        alive = alive & (tl.load(inp_ptr + ri + 1) == tl.load(own_ptr + ri)) & (j < k)
        a += alive.to(tl.int64)
    p = start + a
    bonus = tl.load(own_ptr + tl.minimum(row0 + a, last))
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    tl.store(r_ptr + s, tl.where(valid, bonus, 0))
    tl.store(r_ptr + r_stride + s, tl.where(valid, slot, trash))
    tl.store(r_ptr + 3 * r_stride + s, tl.where(valid, slot * hist_rows + _fmod(p, hist_rows), 0))
    pv = tl.where(valid, p, 0)
    bb = tl.arange(0, B_P)
    bm = bb < B
    for d in tl.static_range(DEPTH):
        off = tl.load(off_ptr + d * B + bb, mask=bm, other=0)
        pos = pv[:, None] + off[None, :]                            # [S_B, B_P]
        col = d * S_B * B + s[:, None] * B + bb[None, :]
        m2 = (s[:, None] < S_B) & bm[None, :]
        tl.store(r_ptr + 4 * r_stride + col, pos, mask=m2)
        tl.store(r_ptr + 5 * r_stride + col, _fmod(pos, ring_size), mask=m2)
        tl.store(r_ptr + 2 * r_stride + d * S_B + s, pv + tl.load(off_ptr + d * B))
    j = tl.arange(0, W_P)
    jm = (s[:, None] < S_B) & (j[None, :] < W)
    q = start[:, None] - 1 + j[None, :]                             # [S_B, W_P] positions
    ok = valid[:, None] & (j[None, :] <= a[:, None])
    tok = tl.load(inp_ptr + tl.minimum(row0[:, None] + j[None, :], last), mask=jm, other=0)
    qv = tl.where(ok, q, -1)
    col = s[:, None] * W + j[None, :]
    tl.store(c_ptr + col, tl.where(ok, tok, 0), mask=jm)
    tl.store(c_ptr + c_stride + col, tl.where(ok, slot[:, None], trash), mask=jm)
    tl.store(c_ptr + 2 * c_stride + col, qv, mask=jm)
    tl.store(c_ptr + 3 * c_stride + col,
             tl.where(ok, slot[:, None] * hist_rows + _fmod(q, hist_rows), 0), mask=jm)
    tl.store(c_ptr + 4 * c_stride + col, _fmod(qv, ring_size), mask=jm)
    tl.store(c_ptr + 5 * c_stride + col, tl.maximum(qv, 0), mask=jm)
    pad = tl.arange(0, N_P)                      # the commit bucket's padding columns
    pm = (pad >= S_B * W) & (pad < N_B)
    zero = tl.zeros([N_P], tl.int64)
    tl.store(c_ptr + pad, zero, mask=pm)
    tl.store(c_ptr + c_stride + pad, zero + trash, mask=pm)
    tl.store(c_ptr + 2 * c_stride + pad, zero - 1, mask=pm)
    tl.store(c_ptr + 3 * c_stride + pad, zero, mask=pm)
    tl.store(c_ptr + 4 * c_stride + pad, zero + ring_size - 1, mask=pm)
    tl.store(c_ptr + 5 * c_stride + pad, zero, mask=pm)


def chain_index_ref(fields, inputs, own, offsets, r_idx, c_idx, s_b: int, n_b: int, width: int,
                    ring_size: int, history_rows: int, trash: int) -> None:
    """Plain-torch reference of `chain_index` (same arguments; writes r_idx and c_idx)."""
    depth = offsets.shape[0]
    f = fields[:, :s_b]
    row0, k, start, slot, valid = f[0], f[1], f[2], f[3], f[4] != 0
    t = own.shape[0]
    inp, last = inputs[:t], t - 1
    j = torch.arange(width, dtype=torch.long, device=fields.device)
    jd = j[:width - 1]
    ri = (row0[:, None] + jd).clamp(max=last - 1)
    match = (inp[ri + 1] == own[ri]) & (jd < k[:, None])
    a = match.long().cumprod(1).sum(1)
    p = start + a
    bonus = own[(row0 + a).clamp(max=last)]
    r_idx[0, :s_b] = torch.where(valid, bonus, 0)
    r_idx[1, :s_b] = torch.where(valid, slot, trash)
    r_idx[3, :s_b] = torch.where(valid, slot * history_rows + p % history_rows, 0)
    pos = torch.where(valid, p, 0)[None, :, None] + offsets[:, None, :]   # [depth, s_b, B]
    n = pos.numel()
    r_idx[4, :n] = pos.reshape(-1)
    r_idx[5, :n] = pos.reshape(-1) % ring_size
    r_idx[2, :depth * s_b] = pos[:, :, 0].reshape(-1)
    q = start[:, None] - 1 + j                                   # [s_b, width] positions
    ok = valid[:, None] & (j <= a[:, None])
    qv = torch.where(ok, q, -1)
    m = s_b * width
    c_idx[0, :m] = torch.where(ok, inp[(row0[:, None] + j).clamp(max=last)], 0).reshape(-1)
    c_idx[1, :m] = torch.where(ok, slot[:, None], trash).reshape(-1)
    c_idx[2, :m] = qv.reshape(-1)
    c_idx[3, :m] = torch.where(ok, slot[:, None] * history_rows + q % history_rows, 0
                               ).reshape(-1)
    c_idx[4, :m] = (qv % ring_size).reshape(-1)
    c_idx[5, :m] = qv.clamp(min=0).reshape(-1)
    if n_b > m:                                   # the bucket's padding columns
        for i, v in enumerate((0, trash, -1, 0, ring_size - 1, 0)):
            c_idx[i, m:n_b] = v


@torch.library.custom_op(f"{NAMESPACE}::chain_index", mutates_args=("r_idx", "c_idx"))
def _chain_index_op(fields: torch.Tensor, inputs: torch.Tensor, own: torch.Tensor,
                    offsets: torch.Tensor, r_idx: torch.Tensor, c_idx: torch.Tensor, s_b: int,
                    n_b: int, width: int, ring_size: int, history_rows: int,
                    trash: int) -> None:
    args = (fields, inputs, own, offsets, r_idx, c_idx, s_b, n_b, width, ring_size,
            history_rows, trash)
    if kernel_path(fields, "chain_index") == "ref":
        chain_index_ref(*args)
        return
    _launch(*args, interpret=False)


@_chain_index_op.register_fake
def _(fields, inputs, own, offsets, r_idx, c_idx, s_b, n_b, width, ring_size, history_rows,
      trash):
    return None


def _launch(fields, inputs, own, offsets, r_idx, c_idx, s_b, n_b, width, ring_size,
            history_rows, trash, interpret):
    depth, b = offsets.shape
    launch(_chain_index_kernel, (1,), fields, fields.stride(0), inputs, own, own.shape[0] - 1,
           offsets, r_idx, r_idx.stride(0), c_idx, c_idx.stride(0), ring_size, history_rows,
           trash, S_B=s_b, W=width, W_P=next_pow2(width), DEPTH=depth, B=b,
           B_P=next_pow2(b), N_B=n_b, N_P=next_pow2(n_b), num_warps=1, interpret=interpret)


def chain_index(fields, inputs, own, offsets, r_idx, c_idx, s_b: int, n_b: int, width: int,
                ring_size: int, history_rows: int, trash: int, interpret: bool = False) -> None:
    """Write a chained drafter round's index columns (module docstring) in place.

    Args:
        fields: int64 [5, >= s_b] contiguous; column s: stream s's first row in the step, its
            drafts k (< width), its start position (the newest committed token's), its ring
            slot, and valid (0: a padding stream).
        inputs: int64 [>= T] contiguous: the step's input ids (the committed token, then the
            drafts, per stream), as the target read them.
        own: int64 [T] contiguous: the target's own token per row (T >= 2; rows past the step
            are never taken for a valid stream).
        offsets: int64 [depth, B] contiguous, >= 0: pass r, block row j's offset from the
            anchor.
        r_idx: int64 [6, >= depth * s_b * B], row stride free, unit column stride: the round's
            columns (rows 0, 1, 3 [:s_b]: bonus token, slot, history row of the anchor; row 2
            [:depth * s_b]: pass anchors; rows 4, 5 [:depth * s_b * B]: positions and ring
            rows); padding streams get (0, trash, 0, 0, offsets, offsets % ring_size).
        c_idx: int64 [6, >= n_b], as r_idx: the commit's columns, stream s's rows at s * width
            + j (next id, slot, position, history row, ring row, RoPE row; rows past a + 1 and
            columns s_b * width .. n_b - 1 as padding: 0, trash, -1, 0, ring_size - 1, 0).
        s_b: streams (a power of two); n_b: commit columns (>= s_b * width); width: 1 + the
            most drafts per stream; ring_size, history_rows: the ring's rows R and the taps
            history's rows W per slot (> 0); trash: the ring's trash slot.
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride.
    Source: kolibri_trt spec/drafter_chain.py (the round that follows a verified step).
    """
    dev = fields.device
    check_tensor("fields", fields, torch.int64, (FIELDS, None), dev)
    check_tensor("own", own, torch.int64, (None,), dev)
    check_tensor("inputs", inputs, torch.int64, (None,), dev)
    check_tensor("offsets", offsets, torch.int64, (None, None), dev)
    depth, b = offsets.shape
    if s_b < 1 or s_b & (s_b - 1) or fields.shape[1] < s_b:
        raise ValueError(f"s_b: a power of two <= fields' {fields.shape[1]} columns, got {s_b}")
    if width < 1 or n_b < s_b * width:
        raise ValueError(f"n_b, width: need width >= 1 and n_b >= s_b * width, got {n_b}, "
                         f"{width}")
    if own.shape[0] < 2 or inputs.shape[0] < own.shape[0]:
        raise ValueError(f"own, inputs: need 2 <= T = own rows <= inputs rows, got "
                         f"{own.shape[0]}, {inputs.shape[0]}")
    for name, t, cols in (("r_idx", r_idx, depth * s_b * b), ("c_idx", c_idx, n_b)):
        check_tensor(name, t, torch.int64, (6, None), dev, contiguous=False)
        if t.shape[1] < cols or t.stride(1) != 1:
            raise ValueError(f"{name}: need [6, >= {cols}] with unit column stride, got "
                             f"{tuple(t.shape)} strides {t.stride()}")
    if min(ring_size, history_rows) < 1:
        raise ValueError(f"ring_size, history_rows: must be >= 1, got {ring_size}, "
                         f"{history_rows}")
    args = (fields, inputs, own, offsets, r_idx, c_idx, s_b, n_b, width, ring_size,
            history_rows, trash)
    if interpret:
        _launch(*args, interpret=True)
    else:
        torch.ops.kolibri_plugins.chain_index(*args)
