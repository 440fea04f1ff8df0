"""Kolibri-1 MoE block for small batches: routing + selected FP8 experts + shared expert.

    (w, e) = moe_route(x)                         fp32 router, top-k, ties -> lower index, renorm
    act[m, i]  = bf16(silu(x·gate_eᵀ)·(x·up_eᵀ))   e = e[m, i]; slot k = the shared expert
    out[m, i]  = act[m, i]·down_eᵀ                 fp32
    y[m] = Σ_i w[m, i]·out[m, i] + out[m, k]       summed in slot order (this file's kernel)
Source: shared/spec/kolibri-1.md (forward pass); weights per plugins/LAYOUTS.md (e4m3, one fp32
scale per expert). Launches: the route (2 kernels) once, then per chunk of
moe_experts.MAX_TOKENS tokens gate_up, down and combine (and, from moe_experts.ALIGN_TOKENS
tokens, moe_align's per-expert lists first). Reads only the selected experts, each once per
chunk.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, cdiv, check_tensor, jit, kernel_path, launch, tl
from ._common import early_launch, pdl_enter, pdl_release
from ._prefetch import ask_chunks, bulk_prefetch_here, chunking
from . import moe_experts
from .moe_align import launch_moe_align
from .moe_experts import launch_moe_experts
from .moe_route import launch_moe_route, moe_route_ref

BLOCK_H = 256
# Chunks of at most PREFETCH_NEXT_TOKENS tokens (0: never) ask L2 for `prefetch_next` (the
# model passes the next layer's QKV weight, 9.2 MB in Kolibri-1) from the combine kernel's
# programs, ~1 MB each, before their wait: the GEMV two launches on (after the norm) then
# reads it from L2 (plugins/_prefetch.py). No value changes. Off until timed (PART=pf).
PREFETCH_NEXT_TOKENS = 0


@jit
def _moe_combine_kernel(o_ptr, w_ptr, y_ptr, log_ptr, H, so_m, so_s, pf_addr, pf_bytes, pf_per,
                        TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_H: tl.constexpr,
                        PF_CHUNKS: tl.constexpr = 0, ASM: tl.constexpr = False,
                        LOG: tl.constexpr = False, PDL: tl.constexpr = 0):
    """Program (token m, column tile j): y = Σ_i w_i·out_i (+ the shared slot) in slot order.
    PF_CHUNKS > 0: token 0's programs first ask L2 for chunks j, j + num_programs(1), ... of
    the region at int64 address pf_addr (pf_bytes bytes, pf_per per chunk); static bytes, so
    before the wait, which only kernel arguments precede. LOG (tests), after the wait: each
    request's (address, bytes, times asked) int64 at log_ptr + 3·c."""
    if PF_CHUNKS > 0:   # token 0's programs, chunks j, j + num_programs(1), ...
        if tl.program_id(0) == 0:
            ask_chunks(pf_addr, pf_bytes, pf_per, tl.program_id(1), tl.num_programs(1), log_ptr,
                       PF_CHUNKS, ASM, False)
    pdl_enter(PDL)
    if LOG:             # the same call as logs (tests: tests/plugins/test_prefetch.py)
        if tl.program_id(0) == 0:
            ask_chunks(pf_addr, pf_bytes, pf_per, tl.program_id(1), tl.num_programs(1), log_ptr,
                       PF_CHUNKS, False, True)
    m = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    y = tl.zeros([BLOCK_H], tl.float32)
    for i in tl.static_range(TOPK):
        wi = tl.load(w_ptr + m * TOPK + i)
        y += wi * tl.load(o_ptr + m * so_m + i * so_s + h, mask=hm, other=0.0)
    if HAS_SHARED:
        y += tl.load(o_ptr + m * so_m + TOPK * so_s + h, mask=hm, other=0.0)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    tl.store(y_ptr + m * H + h, y.to(tl.bfloat16), mask=hm)


def _expert_ref(x, w13, s13, w2, s2):
    """One FP8 expert on fp32 rows x [n, H]: bf16 act, fp32 down. Returns fp32 [n, H]."""
    inter = w13.shape[0] // 2
    gu = x @ (w13.float() * s13).T
    act = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(torch.bfloat16)
    return act.float() @ (w2.float() * s2).T


def moe_forward_ref(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13=None,
                    shared_w13_scale=None, shared_w2=None, shared_w2_scale=None, top_k=6,
                    renormalize=True):
    """Torch reference of :func:`moe_forward` (same arguments); bf16 [M, H]."""
    ids, wts = moe_route_ref(x, router_weight, top_k, renormalize)
    xf = x.float()
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for m in range(x.shape[0]):
        for i in range(top_k):
            e = int(ids[m, i])
            y[m] += wts[m, i] * _expert_ref(xf[m:m + 1], w13[e], w13_scale[e], w2[e], w2_scale[e])[0]
        if shared_w13 is not None:
            y[m] += _expert_ref(xf[m:m + 1], shared_w13[0], shared_w13_scale[0], shared_w2[0],
                                shared_w2_scale[0])[0]
    return y.to(torch.bfloat16)


def _next_args(x, prefetch_next, interpret: bool, request_log):
    """(log buffer, (pf_addr, pf_bytes, pf_per), constexprs) of the combine kernel for the
    M = x.shape[0] tokens of one moe_forward call: a request per ~1 MB of `prefetch_next` when
    M <= PREFETCH_NEXT_TOKENS (the log an int64 [chunks, 3] appended to request_log when that is
    a list), else none. Raises ValueError for a prefetch_next on another device than x."""
    if prefetch_next is None or x.shape[0] > PREFETCH_NEXT_TOKENS:
        return None, (0, 0, 16), {}
    if prefetch_next.device != x.device:
        raise ValueError(f"prefetch_next: on {prefetch_next.device}, expected {x.device}")
    nbytes = prefetch_next.numel() * prefetch_next.element_size()
    chunks, per = chunking(nbytes)
    asm = not interpret and bulk_prefetch_here(prefetch_next.device)
    log = None
    if request_log is not None:
        log = torch.zeros((chunks, 3), dtype=torch.int64, device=prefetch_next.device)
        request_log.append(log)
    return log, (prefetch_next.data_ptr(), nbytes, per), dict(PF_CHUNKS=chunks, ASM=asm,
                                                              LOG=log is not None)


def _launch(x, router_weight, w13, w13_scale, w2, w2_scale, sw13, sw13_s, sw2, sw2_s, top_k,
            renormalize, interpret, prefetch_next=None, request_log=None):
    """moe_forward's kernels (arguments as moe_forward's); request_log (tests): see
    `_next_args`."""
    M, H = x.shape
    inter = w13.shape[1] // 2
    inter_sh = sw13.shape[1] // 2 if sw13 is not None else 0
    y = torch.empty((M, H), dtype=torch.bfloat16, device=x.device)
    if M == 0:
        return y
    # routed here, not through the moe_route op: this runs inside the moe_forward op already
    ids, wts = launch_moe_route(x, router_weight, top_k, renormalize, interpret,
                                (w13, w2, sw13, sw2))
    chunk = moe_experts.MAX_TOKENS   # read at each call (benchmarks and tests set it)
    for c0 in range(0, M, chunk):
        c1 = min(M, c0 + chunk)
        n = c1 - c0   # one chunk (decode, verification) takes the tensors, no views
        xc, idc, wc, yc = ((x, ids, wts, y) if n == M else
                           (x[c0:c1], ids[c0:c1], wts[c0:c1], y[c0:c1]))
        act = torch.empty((n, top_k + 1, max(inter, inter_sh)), dtype=torch.bfloat16,
                          device=x.device)
        out = torch.empty((n, top_k + 1, H), dtype=torch.float32, device=x.device)
        rows = (launch_moe_align(idc, w13.shape[0], interpret)
                if n >= moe_experts.ALIGN_TOKENS else None)
        launch_moe_experts(xc, idc, w13, w13_scale, sw13, sw13_s, act, inter, inter_sh, H, H,
                           True, 0, interpret, rows)
        launch_moe_experts(act, idc, w2, w2_scale, sw2, sw2_s, out, H, H, inter, inter_sh, False,
                           act.stride(1), interpret, rows)
        log, pf, pf_meta = _next_args(x, prefetch_next if c1 == M else None, interpret,
                                      request_log)   # after the last chunk only
        launch(_moe_combine_kernel, (n, cdiv(H, BLOCK_H)), out, wc, yc,
               yc if log is None else log, H, out.stride(0), out.stride(1), *pf, TOPK=top_k,
               HAS_SHARED=sw13 is not None, BLOCK_H=BLOCK_H, num_warps=4, interpret=interpret,
               pdl_early=early_launch("moe", n), **pf_meta)
    return y


@torch.library.custom_op(f"{NAMESPACE}::moe_forward", mutates_args=())
def _moe_forward_op(x: torch.Tensor, router_weight: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                    shared_w13: torch.Tensor | None, shared_w13_scale: torch.Tensor | None,
                    shared_w2: torch.Tensor | None, shared_w2_scale: torch.Tensor | None,
                    top_k: int, renormalize: bool,
                    prefetch_next: torch.Tensor | None = None) -> torch.Tensor:
    args = (x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
            shared_w2, shared_w2_scale, top_k, renormalize)
    if kernel_path(x, "moe_forward") == "ref":
        return moe_forward_ref(*args)
    return _launch(*args, False, prefetch_next)


@_moe_forward_op.register_fake
def _(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale, shared_w2,
      shared_w2_scale, top_k, renormalize, prefetch_next=None):
    return torch.empty_like(x)


def _check(x, router_weight, w13, w13_scale, w2, w2_scale, sw13, sw13_s, sw2, sw2_s):
    check_tensor("x", x, torch.bfloat16, (None, None))
    M, H = x.shape
    dev = x.device
    check_tensor("router_weight", router_weight, torch.bfloat16, (None, H), dev)
    E = router_weight.shape[0]
    check_tensor("w13", w13, torch.float8_e4m3fn, (E, None, H), dev)
    if w13.shape[1] % 2:
        raise ValueError(f"w13: {w13.shape[1]} rows is not 2·I")
    inter = w13.shape[1] // 2
    check_tensor("w13_scale", w13_scale, torch.float32, (E,), dev)
    check_tensor("w2", w2, torch.float8_e4m3fn, (E, H, inter), dev)
    check_tensor("w2_scale", w2_scale, torch.float32, (E,), dev)
    given = [t is not None for t in (sw13, sw13_s, sw2, sw2_s)]
    if any(given) and not all(given):
        raise ValueError("shared_w13, shared_w13_scale, shared_w2, shared_w2_scale: pass all or none")
    if all(given):
        check_tensor("shared_w13", sw13, torch.float8_e4m3fn, (1, None, H), dev)
        if sw13.shape[1] % 2:
            raise ValueError(f"shared_w13: {sw13.shape[1]} rows is not 2·Is")
        check_tensor("shared_w13_scale", sw13_s, torch.float32, (1,), dev)
        check_tensor("shared_w2", sw2, torch.float8_e4m3fn, (1, H, sw13.shape[1] // 2), dev)
        check_tensor("shared_w2_scale", sw2_s, torch.float32, (1,), dev)


def moe_forward(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13=None,
                shared_w13_scale=None, shared_w2=None, shared_w2_scale=None, top_k: int = 6,
                renormalize: bool = True, interpret: bool = False,
                prefetch_next: torch.Tensor | None = None) -> torch.Tensor:
    """Kolibri-1 MoE MLP output for small batches (the residual add is the caller's).

    Args:
        x: bf16 [M, H] contiguous (post_attention_layernorm output).
        router_weight: bf16 [E, H].
        w13: float8_e4m3fn [E, 2I, H] (rows 0..I-1 gate_proj, I..2I-1 up_proj); w13_scale fp32 [E].
        w2: float8_e4m3fn [E, H, I]; w2_scale fp32 [E].
        shared_w13 [1, 2Is, H], shared_w13_scale [1], shared_w2 [1, H, Is], shared_w2_scale [1]:
            the shared expert, same format (all four or none).
        top_k, renormalize: num_experts_per_tok, norm_topk_prob.
        interpret: run the Triton kernels in the interpreter on CPU tensors (tests only).
        prefetch_next: None, or a contiguous tensor on x's device (the next layer's QKV
            weight) that the combine kernel asks L2 for when M <= PREFETCH_NEXT_TOKENS; no
            value changes.
    Returns: bf16 [M, H].
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kolibri-1.md (MoE forward, router, tie rule, norm_topk_prob).
    """
    _check(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
           shared_w2, shared_w2_scale)
    if not 1 <= top_k <= router_weight.shape[0]:
        raise ValueError(f"top_k: {top_k} not in [1, {router_weight.shape[0]}]")
    if prefetch_next is not None:
        check_tensor("prefetch_next", prefetch_next, None, None, x.device)
    args = (x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
            shared_w2, shared_w2_scale, int(top_k), bool(renormalize))
    if interpret:
        return _launch(*args, True, prefetch_next)
    return torch.ops.kolibri_plugins.moe_forward(*args, prefetch_next)
