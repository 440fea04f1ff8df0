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
from . import moe_experts
from .moe_align import launch_moe_align
from .moe_experts import launch_moe_experts
from .add_rms_norm import add_rms_norm_ref, norm_config, rms_norm_row
from .moe_route import launch_moe_route, moe_route_ref

BLOCK_H = 256


@jit
def _moe_combine_kernel(o_ptr, w_ptr, y_ptr, r_ptr, g_ptr, h_ptr, H, so_m, so_s, sr_m, eps,
                        TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_H: tl.constexpr,
                        NORM: tl.constexpr = False, PDL: tl.constexpr = 0):
    """y[m] = bf16(Σ_i w[m, i]·out[m, i] + out[m, k]), slots in order; grid (M, H / BLOCK_H).
    NORM (BLOCK_H >= H, grid (M, 1)): then h[m] = bf16(r[m] + y[m]) and y[m] = RMSNorm(h[m])·g
    (add_rms_norm's maths; moe_forward_add_rms_norm)."""
    pdl_enter(PDL)
    m = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    y = tl.zeros([BLOCK_H], tl.float32)
    for i in tl.static_range(TOPK):
        # one fma per slot, whatever enable_fp_fusion (tl.fma does not broadcast: splat first)
        wi = tl.broadcast_to(tl.load(w_ptr + m * TOPK + i), (BLOCK_H,))
        y = tl.fma(wi, tl.load(o_ptr + m * so_m + i * so_s + h, mask=hm, other=0.0), y)
    if HAS_SHARED:
        y += tl.load(o_ptr + m * so_m + TOPK * so_s + h, mask=hm, other=0.0)
    if NORM:
        r = tl.load(r_ptr + m * sr_m + h, mask=hm, other=0.0).to(tl.float32)
        o = y.to(tl.bfloat16).to(tl.float32)
        tl.store(h_ptr + m * H + h, (r + o).to(tl.bfloat16), mask=hm)
        tl.debug_barrier()    # h written by every thread of the program before it is read back
        y = rms_norm_row(h_ptr, g_ptr, m, eps, H, BLOCK_H)
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


def _launch(x, router_weight, w13, w13_scale, w2, w2_scale, sw13, sw13_s, sw2, sw2_s, top_k,
            renormalize, interpret, norm=None):
    """y [M, H]; with norm = (residual, gain, eps): (h, y) of moe_forward_add_rms_norm."""
    M, H = x.shape
    inter = w13.shape[1] // 2
    inter_sh = sw13.shape[1] // 2 if sw13 is not None else 0
    y = torch.empty((M, H), dtype=torch.bfloat16, device=x.device)
    hs = None if norm is None else torch.empty((M, H), dtype=torch.bfloat16, device=x.device)
    if M == 0:
        return y if norm is None else (hs, y)
    # routed here, not through the moe_route op: this runs inside the moe_forward op already
    ids, wts = launch_moe_route(x, router_weight, top_k, renormalize, interpret)
    chunk = moe_experts.MAX_TOKENS   # read at each call (benchmarks and tests set it)
    r, g, eps = (x, x, 0.0) if norm is None else norm
    cfg = dict(BLOCK_H=BLOCK_H, num_warps=4) if norm is None else norm_config(H)
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
        block = cfg.get("BLOCK", cfg.get("BLOCK_H"))
        launch(_moe_combine_kernel, (n, cdiv(H, block)), out, wc, yc, r[c0:c1], g,
               yc if hs is None else hs[c0:c1], H, out.stride(0), out.stride(1), r.stride(0),
               float(eps), TOPK=top_k, HAS_SHARED=sw13 is not None, BLOCK_H=block,
               NORM=norm is not None, num_warps=cfg["num_warps"], interpret=interpret,
               enable_fp_fusion=norm is None, pdl_early=early_launch("moe", n))
    return y if norm is None else (hs, y)


@torch.library.custom_op(f"{NAMESPACE}::moe_forward", mutates_args=())
def _moe_forward_op(x: torch.Tensor, router_weight: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                    shared_w13: torch.Tensor | None, shared_w13_scale: torch.Tensor | None,
                    shared_w2: torch.Tensor | None, shared_w2_scale: torch.Tensor | None,
                    top_k: int, renormalize: bool) -> torch.Tensor:
    args = (x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
            shared_w2, shared_w2_scale, top_k, renormalize)
    if kernel_path(x, "moe_forward") == "ref":
        return moe_forward_ref(*args)
    return _launch(*args, False)


@_moe_forward_op.register_fake
def _(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale, shared_w2,
      shared_w2_scale, top_k, renormalize):
    return torch.empty_like(x)


def _check(x, router_weight, w13, w13_scale, w2, w2_scale, sw13, sw13_s, sw2, sw2_s, top_k):
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
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k: {top_k} not in [1, {E}]")


def moe_forward(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13=None,
                shared_w13_scale=None, shared_w2=None, shared_w2_scale=None, top_k: int = 6,
                renormalize: bool = True, interpret: bool = False) -> torch.Tensor:
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
    Returns: bf16 [M, H].
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kolibri-1.md (MoE forward, router, tie rule, norm_topk_prob).
    """
    _check(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
           shared_w2, shared_w2_scale, top_k)
    args = (x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
            shared_w2, shared_w2_scale, int(top_k), bool(renormalize))
    if interpret:
        return _launch(*args, True)
    return torch.ops.kolibri_plugins.moe_forward(*args)


def moe_forward_add_rms_norm_ref(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13,
                                 shared_w13_scale, shared_w2, shared_w2_scale, top_k, renormalize,
                                 residual, norm_weight, eps):
    """Torch reference of :func:`moe_forward_add_rms_norm`: add_rms_norm_ref(residual,
    moe_forward_ref(...), norm_weight, eps) -> (h, y)."""
    y = moe_forward_ref(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13,
                        shared_w13_scale, shared_w2, shared_w2_scale, top_k, renormalize)
    return add_rms_norm_ref(residual, y, norm_weight, eps)


@torch.library.custom_op(f"{NAMESPACE}::moe_forward_add_rms_norm", mutates_args=())
def _moe_norm_op(x: torch.Tensor, router_weight: torch.Tensor, w13: torch.Tensor,
                 w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 shared_w13: torch.Tensor | None, shared_w13_scale: torch.Tensor | None,
                 shared_w2: torch.Tensor | None, shared_w2_scale: torch.Tensor | None,
                 top_k: int, renormalize: bool, residual: torch.Tensor,
                 norm_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    args = (x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
            shared_w2, shared_w2_scale, top_k, renormalize)
    if kernel_path(x, "moe_forward_add_rms_norm") == "ref":
        return moe_forward_add_rms_norm_ref(*args, residual, norm_weight, eps)
    return _launch(*args, False, (residual, norm_weight, eps))


@_moe_norm_op.register_fake
def _(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale, shared_w2,
      shared_w2_scale, top_k, renormalize, residual, norm_weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


def moe_forward_add_rms_norm(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13=None,
                             shared_w13_scale=None, shared_w2=None, shared_w2_scale=None, *,
                             residual, norm_weight, eps: float = 1e-6, top_k: int = 6,
                             renormalize: bool = True, interpret: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm(residual, moe_forward(x, ...), norm_weight, eps)`` with the residual add
    and the norm in the MoE's combine kernel (one launch per decoder layer fewer; the same
    maths: the combine's sum rounded to bf16, then add_rms_norm's).

    Args: as :func:`moe_forward`, plus residual: bf16 [M, H] (last dim stride 1), the residual
        stream; norm_weight: bf16 [H], the next norm's gain; eps: its epsilon.
    Returns: (h, y): h = bf16(residual + moe_forward(x)), y = RMSNorm(h)·norm_weight, bf16
        [M, H] each, contiguous.
    Raises: ValueError naming the argument on a wrong shape/dtype/device/stride;
        RuntimeError for CUDA tensors without Triton.
    Source: shared/spec/kolibri-1.md (MoE forward; §Forward pass, RMSNorm).
    """
    _check(x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
           shared_w2, shared_w2_scale, top_k)
    check_tensor("residual", residual, torch.bfloat16, tuple(x.shape), x.device,
                 contiguous=False)
    if residual.stride(1) != 1:
        raise ValueError(f"residual: last dim must have stride 1, strides {residual.stride()}")
    check_tensor("norm_weight", norm_weight, torch.bfloat16, (x.shape[1],), x.device)
    args = (x, router_weight, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
            shared_w2, shared_w2_scale, int(top_k), bool(renormalize))
    if interpret:
        return _launch(*args, True, (residual, norm_weight, float(eps)))
    return torch.ops.kolibri_plugins.moe_forward_add_rms_norm(*args, residual, norm_weight,
                                                              float(eps))
