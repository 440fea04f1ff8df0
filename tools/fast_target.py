"""A fast, batched forward pass of `KolibriForCausalLM` for training (and for the frozen
target while the drafter trains).

It reads the parameters of a reference `KolibriForCausalLM` (so `state_dict()` stays the
checkpoint) and computes the same function as `model(input_ids)` (`shared/spec/kolibri-1.md`):
attention through `scaled_dot_product_attention` (causal for the NoPE full layers, a band mask
for the sliding ones), and the MoE as two dense GEMMs over all experts at once, the routed
experts' activations weighted by their (renormalised top-k) routing weight and the shared
expert's by 1, which equals the reference's sparse sum because unrouted weights are exactly 0.
Norms, RoPE and the router run in fp32 as in the reference (`kolibri_trt.model.ops`). With
bf16 autocast the linears run in bf16; in fp32 it matches the reference within
`tests/test_training_tools.py`'s tolerance.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from kolibri_trt.model import ops

_MASKS: dict[tuple, torch.Tensor] = {}


def band_mask(t: int, window: int | None, device: torch.device) -> torch.Tensor:
    """bool [t, t], True where query i may see key j: j <= i and (no window or i - j < window)."""
    key = (t, window, str(device))
    if key not in _MASKS:
        i = torch.arange(t, device=device)
        m = i[None, :] <= i[:, None]
        if window is not None:
            m &= (i[:, None] - i[None, :]) < window
        _MASKS[key] = m
    return _MASKS[key]


def attention(attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One attention block. x: [B, T, H] (normed); cos/sin fp32 [T, D]. Returns [B, T, H]."""
    cfg = attn.cfg
    b, t, _ = x.shape
    nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = ops.rms_norm(F.linear(x, attn.q_proj.weight).view(b, t, nq, d),
                     attn.q_norm.weight, cfg.rms_norm_eps)
    k = ops.rms_norm(F.linear(x, attn.k_proj.weight).view(b, t, nkv, d),
                     attn.k_norm.weight, cfg.rms_norm_eps)
    v = F.linear(x, attn.v_proj.weight).view(b, t, nkv, d)
    if attn.sliding:
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))               # [B, heads, T, D]
    if nq != nkv:
        k, v = k.repeat_interleave(nq // nkv, dim=1), v.repeat_interleave(nq // nkv, dim=1)
    v = v.to(q.dtype)
    if attn.sliding and cfg.sliding_window < t:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=band_mask(t, cfg.sliding_window, x.device))
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(out.transpose(1, 2).reshape(b, t, nq * d), attn.o_proj.weight)


def moe(mlp, x: torch.Tensor) -> torch.Tensor:
    """Router (fp32, top-k, ties low) + routed and shared experts as two dense GEMMs.

    x: [N, H]. Weight layout: the gate and up rows of experts 0..E-1 then the shared expert
    ([E*I + Is, H] each), the down columns likewise ([H, E*I + Is]). Returns [N, H].
    """
    cfg = mlp.cfg
    n = x.shape[0]
    with torch.autocast(x.device.type, enabled=False):
        logits = F.linear(x.float(), mlp.gate.weight.float())
    weights, experts = ops.route_topk(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)
    dense = torch.zeros(n, cfg.num_experts, dtype=torch.float32, device=x.device)
    dense = dense.scatter(1, experts, weights)                      # [N, E]
    coef = dense.repeat_interleave(cfg.moe_intermediate_size, dim=1)  # [N, E*I]
    mods = list(mlp.experts)
    if mlp.shared_expert is not None:
        mods.append(mlp.shared_expert)
        coef = torch.cat([coef, coef.new_ones(n, cfg.shared_expert_intermediate_size)], 1)
    w_gate = torch.cat([m.gate_proj.weight for m in mods])
    w_up = torch.cat([m.up_proj.weight for m in mods])
    w_down = torch.cat([m.down_proj.weight for m in mods], dim=1)
    h = F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)
    return F.linear(h * coef.to(h.dtype), w_down)


def decoder_layer(layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """h: [B, T, H] residual stream in, out."""
    eps = layer.self_attn.cfg.rms_norm_eps
    h = h + attention(layer.self_attn, ops.rms_norm(h, layer.input_layernorm.weight, eps),
                      cos, sin)
    x = ops.rms_norm(h, layer.post_attention_layernorm.weight, eps)
    return h + moe(layer.mlp, x.reshape(-1, x.shape[-1])).view_as(h)


def residual_stream(model, input_ids: torch.Tensor, tap_layers: Sequence[int] = ()
                    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Final residual stream [B, T, H] and the taps (h after each layer in `tap_layers`)."""
    cfg = model.config
    t = input_ids.shape[1]
    cos, sin = ops.rope_cos_sin(torch.arange(t, device=input_ids.device), cfg.head_dim,
                                cfg.rope_theta)
    h = F.embedding(input_ids, model.model.embed_tokens.weight)
    if torch.is_autocast_enabled(h.device.type):
        h = h.to(torch.get_autocast_dtype(h.device.type))
    taps = {}
    for i, layer in enumerate(model.model.layers):
        h = decoder_layer(layer, h, cos, sin)
        if i in tap_layers:
            taps[i] = h
    return h, [taps[i] for i in tap_layers]


def logits(model, h: torch.Tensor) -> torch.Tensor:
    """lm_head(RMSNorm(h)): [..., V] in the compute dtype (fp32 without autocast)."""
    cfg = model.config
    return F.linear(ops.rms_norm(h, model.model.norm.weight, cfg.rms_norm_eps),
                    model.lm_head.weight)


def lm_loss(model, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats), fp32 scalar. input_ids, targets: int64 [B, T]."""
    h, _ = residual_stream(model, input_ids)
    out = logits(model, h)
    return F.cross_entropy(out.float().view(-1, out.shape[-1]), targets.reshape(-1))
