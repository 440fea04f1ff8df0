"""The block drafter's forward pass for every anchor of a window at once (training and
teacher-forced evaluation), on the parameters of a reference `KolibriBlockDrafter`.

For a window of T positions with target taps and next tokens, anchor p (0 <= p < T) gets the
B block rows of `KolibriBlockDrafter.block_pass` (`shared/spec/block-drafter.md`): row 0 is
ctx_p, rows 1.. are fc(cat(fused_p, mask_embedding)); row j sits at RoPE position p + j and
attends to the context rows ctx_i, max(0, p - context_window) <= i < p, and to block rows
0..j of its own anchor. Context keys/values are computed once per layer for all positions;
the scores of a query are [its context scores | its block scores] under one softmax.
Row j >= 1 gets the predecessor token `pred[p + j]` (training: the target's argmax at p + j),
or, with `pred=None`, the drafter's own previous draft (serving semantics).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kolibri_trt.model import ops
from kolibri_trt_plugins.vocab_argmax import KeyedRows, vocab_argmax_ref

NEG_INF = float("-inf")


def _ctx_mask(t: int, block: int, window: int, device) -> torch.Tensor:
    """bool [t*block, t]: query row (p, j) sees context key i iff p - window <= i < p."""
    p = torch.arange(t, device=device).repeat_interleave(block)[:, None]
    i = torch.arange(t, device=device)[None, :]
    return (i < p) & (i >= p - window)


def _rope(x: torch.Tensor, positions: torch.Tensor, cfg) -> torch.Tensor:
    """RoPE of x [..., N, heads, D] at int64 positions [N]."""
    cos, sin = ops.rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    return ops.apply_rope(x, cos, sin)


def _layer(layer, x: torch.Tensor, ctx: torch.Tensor, ctx_mask: torch.Tensor) -> torch.Tensor:
    """One body layer for all anchors. x: block rows [Bt, T, B, H]; ctx: [Bt, T, H]."""
    cfg, attn = layer.cfg, layer.self_attn
    bt, t, blk, h = x.shape
    nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if hasattr(layer, "spine") and blk > 1:
        x = torch.cat([x[:, :, :1], x[:, :, 1:] + layer.spine(x[:, :, :-1])], dim=2)
    eps = cfg.rms_norm_eps
    pos = torch.arange(t, device=x.device)
    cn = ops.rms_norm(ctx, layer.input_layernorm.weight, eps)
    ck = _rope(F.linear(cn, attn.k_proj.weight).view(bt, t, nkv, d), pos, cfg)
    cv = F.linear(cn, attn.v_proj.weight).view(bt, t, nkv, d)
    xn = ops.rms_norm(x, layer.input_layernorm.weight, eps).reshape(bt, t * blk, h)
    row_pos = (pos[:, None] + torch.arange(blk, device=x.device)[None, :]).reshape(-1)
    q = _rope(F.linear(xn, attn.q_proj.weight).view(bt, t * blk, nq, d), row_pos, cfg)
    bk = _rope(F.linear(xn, attn.k_proj.weight).view(bt, t * blk, nkv, d), row_pos, cfg)
    bv = F.linear(xn, attn.v_proj.weight).view(bt, t * blk, nkv, d)
    g, dt = nq // nkv, x.dtype          # products in the compute dtype, softmax in fp32
    q = q.to(dt).permute(0, 2, 1, 3)                                        # [Bt, nq, T*B, D]
    ck, cv = (z.to(dt).permute(0, 2, 1, 3).repeat_interleave(g, 1) for z in (ck, cv))
    bk, bv = (z.to(dt).view(bt, t, blk, nkv, d).permute(0, 3, 1, 2, 4).repeat_interleave(g, 1)
              for z in (bk, bv))                                            # [Bt, nq, T, B, D]
    scale = 1.0 / math.sqrt(d)
    s_ctx = (q @ ck.transpose(-1, -2)).float().mul_(scale).masked_fill_(~ctx_mask, NEG_INF)
    qb = q.view(bt, nq, t, blk, d)
    s_blk = (qb @ bk.transpose(-1, -2)).float().mul_(scale)                 # [Bt, nq, T, B, B]
    causal = torch.ones(blk, blk, dtype=torch.bool, device=x.device).tril()
    s_blk = s_blk.masked_fill_(~causal, NEG_INF)
    s = torch.cat([s_ctx.view(bt, nq, t, blk, t), s_blk], dim=-1)
    probs = torch.softmax(s, dim=-1).to(dt)
    out = (probs[..., :t].reshape(bt, nq, t * blk, t) @ cv).view(bt, nq, t, blk, d) \
        + probs[..., t:] @ bv
    out = out.permute(0, 2, 3, 1, 4).reshape(bt, t, blk, nq * d)
    x = x + F.linear(out, attn.o_proj.weight)
    return x + layer.mlp(ops.rms_norm(x, layer.post_attention_layernorm.weight, eps))


def block_states(drafter, taps: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    """Body output of every anchor's block rows.

    taps: [Bt, T, n_taps, Ht] raw residual stream after target_layer_ids; next_ids: int64
    [Bt, T] (t_{i+1} for each position i). Returns x [Bt, T, B, H] (before the heads).
    """
    c = drafter.config
    bt, t = next_ids.shape
    normed = [ops.rms_norm(taps[:, :, i], n.weight, c.rms_norm_eps)
              for i, n in enumerate(drafter.tap_norms)]
    fused = F.linear(torch.cat(normed, dim=-1), drafter.fuse.weight)          # [Bt, T, H]
    emb = F.embedding(next_ids, drafter.target.embed_tokens).to(fused.dtype)
    ctx = F.linear(torch.cat([fused, emb], dim=-1), drafter.fc.weight)
    mask = drafter.mask_embedding.to(fused.dtype).expand(bt, t, -1)
    mask_rows = F.linear(torch.cat([fused, mask], dim=-1), drafter.fc.weight)
    x = torch.stack([ctx] + [mask_rows] * (c.block_size - 1), dim=2)
    cmask = _ctx_mask(t, c.block_size, c.context_window, taps.device)
    for layer in drafter.layers:
        x = _layer(layer, x, ctx, cmask)
    return x


def head_weight(drafter) -> torch.Tensor:
    """[Vd, H]: the stored head slice, else the target's lm_head rows of draft_vocab."""
    if drafter.head_slice is not None:
        return drafter.head_slice
    return drafter.target.lm_head[drafter.draft_vocab]


def block_logits(drafter, x: torch.Tensor, pred: torch.Tensor | None,
                 keyed: tuple[float, int, int] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Heads of every row. x: [Bt, T, B, H]; pred: int64 [Bt, T] target ids (row j of anchor p
    reads pred[p + j], clamped to the window), or None for the drafter's own drafts; keyed:
    None (greedy drafts), or (temperature > 0, seed_key, base) of a sampled sequence (Bt = 1,
    anchor p = position p): the drafts the engine's coupled picks make
    (kolibri_trt_plugins.vocab_argmax.KeyedRows: row j's output position is p + j - base).

    Returns (logits [Bt, T, B, Vd] in the compute dtype, drafts int64 [Bt, T, B] target ids).
    """
    c, t = drafter.config, x.shape[1]
    head = head_weight(drafter)
    outs, drafts = [], []
    for j in range(c.block_size):
        if j == 0:
            g = x[:, :, 0]
        else:
            prev = drafts[-1] if pred is None else \
                pred[:, torch.clamp(torch.arange(t, device=x.device) + j, max=t - 1)]
            e = F.embedding(prev, drafter.target.embed_tokens).to(x.dtype)
            g = drafter.predecessor(x[:, :, j], e)
        lj = F.linear(ops.rms_norm(g, drafter.norm.weight, c.rms_norm_eps), head.to(g.dtype))
        outs.append(lj)
        if keyed is None:
            drafts.append(drafter.draft_vocab[torch.argmax(lj.float(), dim=-1)])
        else:
            rows = KeyedRows(torch.zeros(t, dtype=torch.long, device=x.device),
                             torch.arange(t, device=x.device) + j,
                             torch.tensor([keyed[0]], dtype=torch.float32, device=x.device),
                             torch.tensor([keyed[1]], device=x.device),
                             torch.tensor([keyed[2]], device=x.device))
            drafts.append(vocab_argmax_ref(lj[0].float(), drafter.draft_vocab, rows)[None])
    return torch.stack(outs, dim=2), torch.stack(drafts, dim=2)
