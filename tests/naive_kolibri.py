"""A second, deliberately naive reading of `shared/spec/kolibri-1.md` and `block-drafter.md`.

Per position, per head loops in float64 straight from the tensors of a state dict; no code
shared with `kolibri_trt`. Tests compare the reference models with it.
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean() + eps) * (1 if w is None else w)


def rope(x, pos, theta):
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        ang = pos * theta ** (-2.0 * i / d)
        c, s = math.cos(ang), math.sin(ang)
        out[i] = x[i] * c - x[i + d // 2] * s
        out[i + d // 2] = x[i + d // 2] * c + x[i] * s
    return out


def silu(x):
    return x / (1 + torch.exp(-x))


def naive_target_logits(sd: dict, cfg, ids: list[int]) -> torch.Tensor:
    """Logits [T, V] float64 for one sequence, with the tap residuals [T, L, H] as well."""
    W = {k: v.to(F64) for k, v in sd.items()}
    T, D = len(ids), cfg.head_dim
    nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    h = [W["model.embed_tokens.weight"][t].clone() for t in ids]
    all_h = []
    for L in range(cfg.num_hidden_layers):
        p = f"model.layers.{L}."
        sliding = cfg.layer_types[L] == "sliding_attention"
        qs, ks, vs = [], [], []
        for i in range(T):
            x = rms(h[i], W[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = (W[p + "self_attn.q_proj.weight"] @ x).view(nq, D)
            k = (W[p + "self_attn.k_proj.weight"] @ x).view(nkv, D)
            v = (W[p + "self_attn.v_proj.weight"] @ x).view(nkv, D)
            q = torch.stack([rms(q[n], W[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps) for n in range(nq)])
            k = torch.stack([rms(k[n], W[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps) for n in range(nkv)])
            if sliding:
                q = torch.stack([rope(q[n], i, cfg.rope_theta) for n in range(nq)])
                k = torch.stack([rope(k[n], i, cfg.rope_theta) for n in range(nkv)])
            qs.append(q), ks.append(k), vs.append(v)
        new_h = []
        for i in range(T):
            heads = []
            for n in range(nq):
                g = n // (nq // nkv)
                js = [j for j in range(i + 1) if not sliding or i - cfg.sliding_window < j]
                sc = torch.stack([qs[i][n] @ ks[j][g] / math.sqrt(D) for j in js])
                pr = torch.softmax(sc, 0)
                heads.append(sum(pr[a] * vs[j][g] for a, j in enumerate(js)))
            hi = h[i] + W[p + "self_attn.o_proj.weight"] @ torch.cat(heads)
            x = rms(hi, W[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            hi = hi + _moe(W, p, cfg, x)
            new_h.append(hi)
        h = new_h
        all_h.append(torch.stack(h))
    logits = torch.stack([W["lm_head.weight"] @ rms(x, W["model.norm.weight"], cfg.rms_norm_eps) for x in h])
    return logits, torch.stack(all_h, dim=1)


def _expert(W, pre, x):
    return W[pre + "down_proj.weight"] @ (silu(W[pre + "gate_proj.weight"] @ x) * (W[pre + "up_proj.weight"] @ x))


def _moe(W, p, cfg, x):
    probs = torch.softmax(W[p + "mlp.gate.weight"] @ x, 0)
    chosen = []
    for _ in range(cfg.num_experts_per_tok):  # repeated max, lowest index first among ties
        best = max((e for e in range(cfg.num_experts) if e not in chosen), key=lambda e: (probs[e], -e))
        chosen.append(best)
    w = torch.stack([probs[e] for e in chosen])
    if cfg.norm_topk_prob:
        w = w / w.sum()
    y = sum(w[a] * _expert(W, f"{p}mlp.experts.{e}.", x) for a, e in enumerate(chosen))
    if cfg.shared_expert_intermediate_size:
        y = y + _expert(W, p + "mlp.shared_expert.", x)
    return y


def naive_drafter(sd: dict, cfg, embed, head, vocab, taps, nxt):
    """One drafter pass per the spec, float64. taps [P, n, H]; nxt [P]. Returns (drafts, logits)."""
    W = {k: v.to(F64) for k, v in sd.items()}
    E, Hd = embed.to(F64), head.to(F64)
    eps, D, B = cfg.rms_norm_eps, cfg.head_dim, cfg.block_size
    P = taps.shape[0]
    p = P - 1
    fused = [W["fuse.weight"] @ torch.cat([rms(taps[i, t].to(F64), W[f"tap_norms.{t}.weight"], eps)
                                           for t in range(taps.shape[1])]) for i in range(P)]
    ctx = [W["fc.weight"] @ torch.cat([fused[i], E[int(nxt[i])]]) for i in range(P)]
    rows = [ctx[p]] + [W["fc.weight"] @ torch.cat([fused[p], W["mask_embedding"]]) for _ in range(B - 1)]
    cpos = list(range(max(0, p - cfg.context_window), p))
    for l in range(cfg.num_hidden_layers):
        pre = f"layers.{l}."
        if l >= 1:
            old = [r.clone() for r in rows]
            for j in range(1, B):
                z = rms(old[j - 1], W[pre + "spine.norm.weight"], eps)
                rows[j] = rows[j] + W[pre + "spine.U.weight"] @ silu(W[pre + "spine.A.weight"] @ z)
        nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads

        def kv(x, pos):
            xn = rms(x, W[pre + "input_layernorm.weight"], eps)
            k = (W[pre + "self_attn.k_proj.weight"] @ xn).view(nkv, D)
            v = (W[pre + "self_attn.v_proj.weight"] @ xn).view(nkv, D)
            return torch.stack([rope(k[n], pos, cfg.rope_theta) for n in range(nkv)]), v
        keys = [kv(ctx[i], i) for i in cpos] + [kv(rows[j], p + j) for j in range(B)]
        new_rows = []
        for j in range(B):
            xn = rms(rows[j], W[pre + "input_layernorm.weight"], eps)
            q = (W[pre + "self_attn.q_proj.weight"] @ xn).view(nh, D)
            visible = keys[: len(cpos) + j + 1]
            heads = []
            for n in range(nh):
                qn = rope(q[n], p + j, cfg.rope_theta)
                g = n // (nh // nkv)
                pr = torch.softmax(torch.stack([qn @ k[g] / math.sqrt(D) for k, _ in visible]), 0)
                heads.append(sum(pr[a] * v[g] for a, (_, v) in enumerate(visible)))
            x = rows[j] + W[pre + "self_attn.o_proj.weight"] @ torch.cat(heads)
            xm = rms(x, W[pre + "post_attention_layernorm.weight"], eps)
            x = x + W[pre + "mlp.down_proj.weight"] @ (silu(W[pre + "mlp.gate_proj.weight"] @ xm) * (W[pre + "mlp.up_proj.weight"] @ xm))
            new_rows.append(x)
        rows = new_rows
    drafts, logits = [], []
    for j in range(B):
        g = rows[j]
        if j >= 1:
            e = E[drafts[-1]]
            g = g + W["predecessor.U.weight"] @ silu(W["predecessor.A.weight"] @ g + W["predecessor.B.weight"] @ e)
        lj = Hd[vocab] @ rms(g, W["norm.weight"], eps)
        logits.append(lj)
        drafts.append(int(vocab[int(torch.argmax(lj))]))
    return drafts, torch.stack(logits)
