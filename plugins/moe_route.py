"""MoE routing for small batches: router logits in fp32, softmax, top-k, renormalisation.

Maths (shared/spec/kolibri-1.md): logits = x · W_gateᵀ computed in fp32 (bf16 products are exact
in fp32; the tensor cores accumulate in fp32), p = softmax(logits), (w, e) = top-k(p) with ties
broken towards the LOWER expert index, w = w / Σw when norm_topk_prob.
Two kernels, one op: the logits GEMV spreads the router matrix over many programs (each reads
16 experts' rows once for up to 64 tokens); the per-token top-k kernel then runs on E floats.
SPLIT_H > 1 splits H over that many programs per expert tile (plugins/_split_k.py ranges),
and the top-k kernel sums the fp32 partials in the order s = 0, 1, ... before the softmax: a
function of (E, H) only, so batch invariant, but other logit bits than SPLIT_H = 1. On the
H200 at E = 256, H = 2560 (`bench/gemv_tune.py --kernels router`,
bench/results/h200-2026-11-30l/ko/router.log): SPLIT_H 1 -> 5 with BLOCK_H 256, M = 1
9.2 -> 6.2 µs, M = 64 14.9 -> 7.9 µs, the same expert ids on the sweep's inputs.
For chunks of at most PREFETCH_TOKENS tokens the top-k kernel also asks L2 for the chosen
experts' weights (plugins/_prefetch.py), one program per ~1 MB request; the ids and weights
are unchanged.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, cdiv, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import early_launch, pdl_enter, pdl_release
from ._row_tiles import dot_into, tile_acc
from ._rows import linear_rows
from ._split_k import k_range, num_splits, sum_splits
from ._prefetch import bulk_prefetch_here, chunk_span, chunking, prefetch_l2

ROWS = 16
MAX_TILES = 4
BLOCK_E = 16
BLOCK_H = 256
TUNE = dict(num_warps=4, num_stages=3)
SPLIT_H = 5      # H ranges per expert tile (module docstring)
# Warps of the top-k kernel (its softmax sum's order follows them). H200
# (bench/results/h200-2026-12-01c/nu/tune.log, router + top-k, SPLIT_H 5): 4 -> 1 warp M = 1
# 6.1 -> 5.0 µs, M = 64 7.8 -> 6.7 µs (one warp: shuffles only, no shared-memory rounds). The
# top-k run by the logits kernel's last program per token tile (a ticket counter) took 5.3 /
# 30.3 µs: at 64 tokens one program ran the top-k of all of them (removed).
TOPK_WARPS = 1
# Chunks of at most PREFETCH_TOKENS tokens (0: never) ask L2 for their experts' weights from the
# top-k kernel (plugins/_prefetch.py: one program per ~1 MB request, each redoing the token's
# top-k; program 0 stores it): PREFETCH 1 the gate/up weights (w13), 2 those and down (w2), 3
# down alone (read one launch later, beside gate/up's 27.5 MB at one token); the shared
# expert's too, from token 0's programs. The same ids and bits. Bytes asked for per token:
# gate/up 23.6 MB, down 11.8 MB (6 experts), the shared expert's 3.9 / 2.0 MB once: past 1
# token (modes 1, 2) or 2 tokens (mode 3) more than the ~50 MB L2 of an H100 / H200 holds.
# Off until timed on the GPU (bench/gpu_session.sh PART=pf).
PREFETCH_TOKENS = 0
PREFETCH = 2


@jit
def _router_logits_kernel(x_ptr, wr_ptr, lg_ptr, M, E, H, sx_m,
                          BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
                          MT: tl.constexpr, DOT_F32: tl.constexpr, SPLIT: tl.constexpr = 1,
                          PDL: tl.constexpr = 0):
    """Logits (SPLIT > 1: the partial of H range program_id(2), at lg + s·M·E) of one tile of
    BLOCK_E experts for up to MT·ROWS tokens."""
    pdl_enter(PDL)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    m0 = tl.program_id(1) * ROWS * MT
    rows = tl.arange(0, ROWS)
    acc0 = tl.zeros([ROWS, BLOCK_E], tl.float32)
    acc1 = tl.zeros([ROWS, BLOCK_E], tl.float32)
    acc2 = tl.zeros([ROWS, BLOCK_E], tl.float32)
    acc3 = tl.zeros([ROWS, BLOCK_E], tl.float32)
    h_lo, h_hi = k_range(H, tl.program_id(2), SPLIT, BLOCK_H)
    lg_ptr += tl.program_id(2).to(tl.int64) * M * E
    for h0 in range(h_lo, h_hi, BLOCK_H):
        hh = h0 + tl.arange(0, BLOCK_H)
        w = tl.load(wr_ptr + e[:, None].to(tl.int64) * H + hh[None, :],
                    mask=(e < E)[:, None] & (hh < H)[None, :], other=0.0)
        w_t = tl.trans(w.to(tl.float32) if DOT_F32 else w)
        for t in tl.static_range(MT):
            m = m0 + t * ROWS + rows
            xt = tl.load(x_ptr + m[:, None].to(tl.int64) * sx_m + hh[None, :],
                         mask=(m < M)[:, None] & (hh < H)[None, :], other=0.0)
            if DOT_F32:
                xt = xt.to(tl.float32)
            acc0, acc1, acc2, acc3 = dot_into(t, xt, w_t, acc0, acc1, acc2, acc3)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    for t in tl.static_range(MT):
        m = m0 + t * ROWS + rows
        out = tile_acc(t, acc0, acc1, acc2, acc3)
        tl.store(lg_ptr + m[:, None].to(tl.int64) * E + e[None, :], out,
                 mask=(m < M)[:, None] & (e < E)[None, :])


@jit
def _pick(w, v0, v1, v2, v3):
    """v_w of four int64 scalars (w in 0..3)."""
    return tl.where(w == 0, v0, tl.where(w == 1, v1, tl.where(w == 2, v2, v3)))


@jit
def _prefetch_item(q, m, sel_i, kk, E, a13, a2, as13, as2, b13, b2, bs13, bs2, p13, p2, ps13,
                   ps2, C13: tl.constexpr, C2: tl.constexpr, CS13: tl.constexpr,
                   CS2: tl.constexpr, TOPK: tl.constexpr):
    """(region base, region bytes, chunk, chunk bytes) int64 of request q of token m: q <
    TOPK·(C13 + C2) is chunk q % (C13 + C2) of slot q // (C13 + C2)'s expert (its w13 chunks,
    then its w2 chunks); then token 0 alone asks for the shared expert's CS13 + CS2. a*: base
    addresses of w13, w2, the shared w13 and w2; b*: bytes per expert; p*: bytes per chunk
    (`_prefetch.chunking`). Past the last request (or another token's shared one): bytes 0.
    An expert id past E - 1 (NaN logits) asks for expert E - 1's bytes, never past w13 / w2."""
    per_e: tl.constexpr = C13 + C2
    e = tl.minimum(tl.sum(tl.where(kk == q // per_e, sel_i, 0), 0), E - 1).to(tl.int64)
    c = q % per_e
    qs = q - TOPK * per_e
    sh = qs >= 0
    w = tl.where(sh, tl.where(qs < CS13, 2, 3), tl.where(c < C13, 0, 1))
    cw = tl.where(sh, tl.where(qs < CS13, qs, qs - CS13), tl.where(c < C13, c, c - C13))
    b = _pick(w, b13, b2, bs13, bs2)
    base = _pick(w, a13, a2, as13, as2) + tl.where(sh, 0, e) * b
    live = (qs < 0) | ((m == 0) & (qs < CS13 + CS2))
    return base, tl.where(live, b, 0), cw, _pick(w, p13, p2, ps13, ps2)


@jit
def _topk_kernel(lg_ptr, ids_ptr, w_ptr, log_ptr, M, E, a13, a2, as13, as2, b13, b2, bs13, bs2,
                 p13, p2, ps13, ps2, TOPK: tl.constexpr,
                 E_P: tl.constexpr, K_P: tl.constexpr, RENORM: tl.constexpr,
                 SPLIT: tl.constexpr = 1, PF: tl.constexpr = False, C13: tl.constexpr = 0,
                 C2: tl.constexpr = 0, CS13: tl.constexpr = 0, CS2: tl.constexpr = 0,
                 ASM: tl.constexpr = False, LOG: tl.constexpr = False,
                 PDL: tl.constexpr = 0):
    """Program (token m, request q): the token's top-k; q = 0 stores it. PF: request q of
    `_prefetch_item` asked of L2 (ASM: the instruction; else only its address maths). The
    prefetch arguments (a13 ... ps2, C13 ... CS2) are read only under PF; LOG (tests): the
    request's (address, bytes) int64 stored at log_ptr + 2·(m·num_programs(1) + q)."""
    pdl_enter(PDL)
    m = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_P)
    if SPLIT == 1:
        lg = tl.load(lg_ptr + m * E + e, mask=e < E, other=float("-inf"))
    else:       # the H ranges' partials, in order
        lg = tl.where(e < E, sum_splits(lg_ptr, m * E + e, e < E, M * E, SPLIT), float("-inf"))
    ex = tl.exp(lg - tl.max(lg, 0))
    p = ex / tl.sum(ex, 0)
    p = tl.where(e < E, p, -1.0)
    kk = tl.arange(0, K_P)
    sel_i = tl.zeros([K_P], tl.int32)
    sel_p = tl.zeros([K_P], tl.float32)
    total = 0.0
    for i in tl.static_range(TOPK):
        best = tl.max(p, 0)
        idx = tl.min(tl.where(p == best, e, E_P), 0)
        sel_i = tl.where(kk == i, idx, sel_i)
        sel_p = tl.where(kk == i, best, sel_p)
        total += best
        p = tl.where(e == idx, -2.0, p)
    if RENORM:
        sel_p = sel_p / total
    q = tl.program_id(1)
    if PF:
        base, nbytes, c, per = _prefetch_item(q, m, sel_i, kk, E, a13, a2, as13, as2, b13,
                                              b2, bs13, bs2, p13, p2, ps13, ps2, C13, C2, CS13,
                                              CS2, TOPK)
        addr, size = chunk_span(base, nbytes, c, per)
        prefetch_l2(addr, size, ASM)
        if LOG:
            at = 2 * (m * tl.num_programs(1) + q)
            tl.store(log_ptr + at, addr)
            tl.store(log_ptr + at + 1, size)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    if q == 0:
        tl.store(ids_ptr + m * TOPK + kk, sel_i, mask=kk < TOPK)
        tl.store(w_ptr + m * TOPK + kk, sel_p, mask=kk < TOPK)


def moe_route_ref(x, router_weight, top_k: int, renormalize: bool = True):
    """Torch reference: (ids int32 [M, k], weights fp32 [M, k]); stable ties (lower index)."""
    p = torch.softmax(linear_rows(x.float(), router_weight.float()), -1)
    order = torch.sort(-p, dim=-1, stable=True).indices[:, :top_k]
    w = torch.gather(p, 1, order)
    if renormalize:
        total = torch.zeros_like(w[:, 0])
        for i in range(top_k):  # same summation order as the kernel
            total = total + w[:, i]
        w = w / total[:, None]
    return order.to(torch.int32), w


@torch.library.custom_op(f"{NAMESPACE}::moe_route", mutates_args=())
def _moe_route_op(x: torch.Tensor, router_weight: torch.Tensor, top_k: int,
                  renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel_path(x, "moe_route") == "ref":
        return moe_route_ref(x, router_weight, top_k, renormalize)
    return launch_moe_route(x, router_weight, top_k, renormalize, False)


@_moe_route_op.register_fake
def _(x, router_weight, top_k, renormalize):
    M = x.shape[0]
    return (x.new_empty((M, top_k), dtype=torch.int32), x.new_empty((M, top_k), dtype=torch.float32))


def launch_moe_route(x, router_weight, top_k: int, renormalize: bool, interpret: bool = False,
                     prefetch=None, request_log: list | None = None):
    """The two routing kernels without argument checks or op dispatch, for `moe_forward`'s
    CUDA body (inside its own op, which checked x, router_weight and top_k as
    :func:`moe_route` does). Same arguments and results as :func:`moe_route`; prefetch: None,
    or the MoE's e4m3 weights (w13 [E, 2I, H], w2 [E, H, I], shared w13 [1, 2Is, H] or None,
    shared w2 [1, H, Is] or None) whose chosen experts the top-k kernel asks L2 for
    (PREFETCH_TOKENS, PREFETCH); request_log (tests): a list that gets the requests' (address,
    bytes) int64 [M, requests, 2] when the prefetch runs."""
    M, H = x.shape
    E = router_weight.shape[0]
    ids = torch.empty((M, top_k), dtype=torch.int32, device=x.device)
    wts = torch.empty((M, top_k), dtype=torch.float32, device=x.device)
    if M == 0:
        return ids, wts
    split = num_splits(H, SPLIT_H, BLOCK_H)
    logits = torch.empty((split, M, E), dtype=torch.float32, device=x.device)
    mt = min(MAX_TILES, cdiv(M, ROWS))
    launch(_router_logits_kernel, (cdiv(E, BLOCK_E), cdiv(M, ROWS * mt), split), x,
           router_weight, logits, M, E, H, x.stride(0), BLOCK_E=BLOCK_E, BLOCK_H=BLOCK_H,
           ROWS=ROWS, MT=mt, DOT_F32=interpret, SPLIT=split, interpret=interpret,
           pdl_early=early_launch("moe", M), **TUNE)
    pf = _prefetch_args(M, top_k, prefetch, interpret, x.device)
    log = ids
    if request_log is not None and pf[0] > 1:
        log = torch.zeros((M, pf[0], 2), dtype=torch.int64, device=x.device)
        request_log.append(log)
    launch(_topk_kernel, (M, pf[0]), logits, ids, wts, log, M, E, *pf[1], TOPK=top_k,
           E_P=max(16, next_pow2(E)), K_P=max(2, next_pow2(top_k)), RENORM=bool(renormalize),
           SPLIT=split, num_warps=TOPK_WARPS, interpret=interpret,
           pdl_early=early_launch("moe", M), LOG=log is not ids, **pf[2])
    return ids, wts


def _prefetch_args(M: int, top_k: int, weights, interpret: bool, device: torch.device):
    """(requests per token, the top-k kernel's 12 prefetch scalars, its constexprs) for a
    chunk of M tokens: PREFETCH's weights of `weights` = (w13, w2, shared w13, shared w2; the
    shared pair may be None) when 0 < M <= PREFETCH_TOKENS, else one program per token and
    zeros. Raises ValueError on a PREFETCH other than 1, 2 or 3."""
    keep = {1: (0, 2), 2: (0, 1, 2, 3), 3: (1, 3)}.get(PREFETCH)   # indices into weights
    if keep is None:
        raise ValueError(f"moe_route.PREFETCH: 1 (gate/up weights), 2 (gate/up and down) or 3 "
                         f"(down), got {PREFETCH!r}")
    if weights is None or M > PREFETCH_TOKENS:
        return 1, (0,) * 12, {}
    wanted = [w if i in keep else None for i, w in enumerate(weights)]
    addr, per_e, per, chunks = [], [], [], []
    for i, w in enumerate(wanted):
        size = 0 if w is None else w[0].numel() * w.element_size()   # one expert's bytes
        n, p = chunking(size)
        addr.append(0 if w is None else w.data_ptr())
        per_e.append(size)
        per.append(p)
        chunks.append(n)
    requests = top_k * (chunks[0] + chunks[1]) + chunks[2] + chunks[3]
    asm = not interpret and bulk_prefetch_here(device)
    consts = dict(PF=True, C13=chunks[0], C2=chunks[1], CS13=chunks[2], CS2=chunks[3], ASM=asm)
    return requests, tuple(addr + per_e + per), consts


def moe_route(x, router_weight, top_k: int, renormalize: bool = True, interpret: bool = False):
    """Route tokens to experts.

    Args:
        x: bf16 [M, H] (last dim stride 1); router_weight: bf16 [E, H] contiguous.
        top_k: experts per token (Kolibri-1: 6 of 256), 1 <= top_k <= E.
        renormalize: norm_topk_prob (Kolibri-1: True).
        interpret: run the Triton kernels in the interpreter on CPU tensors (tests only).
    Returns: (ids int32 [M, top_k] in descending probability, lower index first on ties;
        weights fp32 [M, top_k]).
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride or top_k;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kolibri-1.md (forward pass, router, tie rule).
    """
    check_tensor("x", x, torch.bfloat16, (None, None), contiguous=False)
    if x.stride(1) != 1:
        raise ValueError(f"x: last dim must have stride 1, strides {x.stride()}")
    check_tensor("router_weight", router_weight, torch.bfloat16, (None, x.shape[1]), x.device)
    if not 1 <= top_k <= router_weight.shape[0]:
        raise ValueError(f"top_k: {top_k} not in [1, {router_weight.shape[0]}]")
    if interpret:
        return launch_moe_route(x, router_weight, int(top_k), bool(renormalize), True)
    return torch.ops.kolibri_plugins.moe_route(x, router_weight, int(top_k), bool(renormalize))
