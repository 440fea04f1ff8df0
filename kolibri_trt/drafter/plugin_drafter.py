"""`DrafterPlugin`: the block drafter over the engine's stored tensors through `plugins/` (GPU).

The maths is `KolibriBlockDrafter.propose_cached` (`block_drafter.py`,
`shared/spec/block-drafter.md` §Forward pass and §Depth): `depth` passes of `block_size` (B)
rows for S streams, sequential output heads with the predecessor, argmax ties to the lower
draft-vocabulary index, provisional context rows between passes. What changes is where it
runs:

- body linears in the engine's "block_fp8" format go to `fp8_gemv` with their [N, K/64]
  scales (q/k/v fused into one QKV weight per layer, gate/up into one w13: block scales are
  per output row, so the fusion is exact); a K that is not a multiple of 64 (tiny test
  configs: ranks 16/32, intermediate 96) is padded with zero columns at load and the
  activation with zeros per call. The head slice in "nvfp4" goes to `nvfp4_gemv`. "bf16"
  groups (the exact-parity engine) run `ops.linear`, the reference's own product;
- RMSNorms of bf16 rows go to the `add_rms_norm` plugin (`plugins/add_rms_norm.py`, one
  kernel per norm, the residual add before the attention block's post norm and a sequential
  head's final norm fused into it; the maths of `ops.rms_norm`), with bf16 copies of the gains
  made once; the per-tap norms of `fuse_taps` (a gain per tap) stay `ops.rms_norm`. RoPE tables
  come from `ops.rope_tables` over inverse frequencies made once (= `ops.rope_cos_sin`); the
  embedding is the target's, bf16; activations bf16 (the dequantizing CPU reference runs fp32
  activations through fp32 weights);
- context K/V live in static device buffers (`DrafterRing`, `plugin_weights.py`): per
  stream slot a ring of R = context_window + depth * B rows per layer, bf16
  [slots + 1, R, Hkv, D], and the absolute position held by each ring row (int64
  [slots + 1, R], -1 = empty). A key is stored with its RoPE applied, at ring row
  `pos % R`, so ring order does not matter.
  Block row j of a stream with anchor p attends to the ring rows whose position lies in
  [p - context_window, p + j] (its context and the causal block, whose own K/V are written
  into the ring first): a masked dense attention over the first L ring rows (L a bucket
  bound >= every position in use, or R), mask built on the device from the positions.
  Provisional rows of pass r (positions p .. p+B-1) overwrite the block rows there and are
  masked out later by position. Row `slots` (the last) is a trash slot: padding rows and
  padding streams write there and nobody else reads it.

Every op has static shapes and no host sync, so `commit` and `propose` can be captured in a
CUDA graph (`spec/drafter_runner.py`: `DrafterRunner`); on CPU the kernels run their
torch references.

Ring capacity: writes of one round reach positions < p + depth*B, which land on ring rows
of positions < p - context_window (outside every later window), so no context row still
needed is ever overwritten; the next round's anchor is > p and its context rows p .. are
rewritten with real rows before it runs (`commit`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from kolibri_trt_plugins import add_rms_norm

from ..model import ops
from .config import DrafterConfig
from .plugin_weights import (ATTN_IMPLS, BODY_FORMATS, HEAD_FORMATS, DrafterLayerWeights,
                             DrafterRing, PluginHead, PluginLinear)
from .reference import DrafterTarget

class DrafterPlugin:
    """The block drafter as the kernels run it. Build with
    `runtime.plugin_loader.load_plugin_drafter` (an engine folder) or `DrafterPlugin.from_tensors`.

    config: the drafter's; embed: the target's embedding bf16 [V, H]; draft_vocab: int64 [Vd]
    target ids; tap_norms: [n_taps, Ht]; fuse, fc: PluginLinear; mask_embedding bf16 [H];
    layers; predecessor: (A, B, U) PluginLinear; norm: [H]; head: PluginHead. Norm gains are
    the stored bf16 values held in fp32; `__init__` keeps bf16 copies of the body and final
    gains for the plugin norm (exact) and the RoPE inverse frequencies (`ops.rope_inv_freq`).
    attn: "dense" (fp32 einsum + softmax over the ring, the default) or "sdpa"
    (`F.scaled_dot_product_attention` on bf16 with a boolean mask).
    """

    def __init__(self, config: DrafterConfig, embed: torch.Tensor, draft_vocab: torch.Tensor,
                 tap_norms: torch.Tensor, fuse: PluginLinear, fc: PluginLinear,
                 mask_embedding: torch.Tensor, layers: list[DrafterLayerWeights],
                 predecessor: tuple[PluginLinear, PluginLinear, PluginLinear],
                 norm: torch.Tensor, head: PluginHead, attn: str = "dense"):
        if attn not in ATTN_IMPLS:
            raise ValueError(f"attn: must be one of {list(ATTN_IMPLS)}, got {attn!r}")
        self.config, self.embed_tokens, self.draft_vocab = config, embed, draft_vocab
        self.tap_norms, self.fuse, self.fc = tap_norms, fuse, fc
        self.mask_embedding, self.layers = mask_embedding, list(layers)
        self.predecessor, self.norm, self.head, self.attn = predecessor, norm, head, attn
        self.device = embed.device
        # per layer (input, post, spine or None) gains, bf16 [H] contiguous: the plugin's layout
        self.gains = [(_bf16(w.input_norm), _bf16(w.post_norm),
                       None if w.spine is None else _bf16(w.spine[0])) for w in self.layers]
        self.norm_bf16 = _bf16(norm)
        self.rope_inv_freq = ops.rope_inv_freq(config.head_dim, config.rope_theta, self.device)

    # ---- building ------------------------------------------------------------------------
    @classmethod
    def from_tensors(cls, config: DrafterConfig, tensors: dict[str, torch.Tensor],
                     formats: dict[str, str], target: DrafterTarget, draft_vocab: torch.Tensor,
                     attn: str = "dense") -> "DrafterPlugin":
        """From the engine's drafter tensors by name (`engine_format.py`: `X.weight` +
        `X.weight_scale` for block_fp8, `lm_head.*` the head slice) on the model's device.
        formats: the manifest's {"body": ..., "head": ...}. Raises ValueError for a format this
        path does not run (names the group)."""
        c, t = config, tensors
        body, head_fmt = formats["body"], formats["head"]
        if body not in BODY_FORMATS:
            raise ValueError(f"weights.drafter.body is {body!r}; the drafter's kernel path runs "
                             f"{list(BODY_FORMATS)}")
        if head_fmt not in HEAD_FORMATS:
            raise ValueError(f"weights.drafter.head is {head_fmt!r}; the drafter's kernel path "
                             f"runs {list(HEAD_FORMATS)}")

        def lin(name: str) -> PluginLinear:
            return PluginLinear(body, t[name + ".weight"], t.get(name + ".weight_scale"))

        def bf(name: str) -> torch.Tensor:
            return t[name].to(torch.bfloat16).contiguous()

        def gain(name: str) -> torch.Tensor:   # norm gains: bf16 values held in fp32 (exact;
            return bf(name).float()            # spares `ops.rms_norm` a cast per call)

        hd = c.head_dim
        hq, hkv = c.num_attention_heads * hd, c.num_key_value_heads * hd
        layers = []
        for i in range(c.num_hidden_layers):
            pre = f"layers.{i}."
            qkv = PluginLinear.fused([lin(pre + f"self_attn.{p}_proj") for p in "qkv"])
            spine = None
            if i >= 1:
                spine = (gain(pre + "spine.norm.weight"), lin(pre + "spine.A"),
                         lin(pre + "spine.U"))
            layers.append(DrafterLayerWeights(
                input_norm=gain(pre + "input_layernorm.weight"),
                post_norm=gain(pre + "post_attention_layernorm.weight"),
                qkv=qkv, kv=qkv.rows(hq, hq + 2 * hkv), o_proj=lin(pre + "self_attn.o_proj"),
                w13=PluginLinear.fused([lin(pre + "mlp.gate_proj"), lin(pre + "mlp.up_proj")]),
                down=lin(pre + "mlp.down_proj"), spine=spine))
        if head_fmt == "nvfp4":
            head = PluginHead("nvfp4", t["lm_head.weight"], t["lm_head.weight_scale"],
                              t["lm_head.weight_scale_2"].float().reshape(()))
        else:
            head = PluginHead("bf16", t["lm_head.weight"])
        embed = target.embed_tokens
        if embed.dtype != torch.bfloat16:
            embed = embed.to(torch.bfloat16)
        taps = torch.stack([gain(f"tap_norms.{i}.weight") for i in range(c.num_taps)])
        return cls(c, embed, draft_vocab.to(embed.device), taps, lin("fuse"), lin("fc"),
                   bf("mask_embedding"), layers,
                   (lin("predecessor.A"), lin("predecessor.B"), lin("predecessor.U")),
                   gain("norm.weight"), head, attn=attn)

    # ---- pieces --------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_tokens)

    def fuse_taps(self, taps: torch.Tensor) -> torch.Tensor:
        """taps bf16 [N, n_taps, Ht] -> fused [N, H] (one norm per tap, then `fuse`)."""
        n = taps.shape[0]
        normed = ops.rms_norm(taps, self.tap_norms, self.config.rms_norm_eps)
        return self.fuse(normed.reshape(n, -1))

    def _norm(self, x: torch.Tensor, gain: torch.Tensor, residual: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The plugin norm of bf16 [T, H] rows (last-dim stride 1): (h, y) with h = x + residual
        (x itself without one) and y = `ops.rms_norm(h, gain, eps)`, bit for bit on CPU."""
        return add_rms_norm(x, residual, gain, self.config.rms_norm_eps)

    def _kv(self, i: int, rows: torch.Tensor, cos, sin):
        """Keys (RoPE) and values of rows bf16 [N, H] for layer i: [N, Hkv, D] each
        (`DrafterLayer.kv`)."""
        c = self.config
        n, hkv = rows.shape[0], c.num_key_value_heads
        kv = self.layers[i].kv(self._norm(rows, self.gains[i][0])[1])
        k = kv[:, :hkv * c.head_dim].view(n, hkv, c.head_dim)
        v = kv[:, hkv * c.head_dim:].view(n, hkv, c.head_dim)
        return ops.apply_rope(k, cos, sin), v

    def _write(self, ring: DrafterRing, layer: int, slots, rows, k, v) -> None:
        ring.k[layer][slots, rows] = k
        ring.v[layer][slots, rows] = v

    # ---- committing context rows ---------------------------------------------------------
    @torch.no_grad()
    def commit(self, ring: DrafterRing, taps: torch.Tensor, next_ids: torch.Tensor,
               slots: torch.Tensor, positions: torch.Tensor) -> None:
        """Write N context rows into the ring: row i is position positions[i] of the stream in
        ring slot slots[i], ctx = fc(cat(fuse(taps[i]), E[next_ids[i]])), every layer's K/V.

        taps bf16 [N, n_taps, Ht]; next_ids, slots, positions int64 [N] (device). Padding
        rows: slot = ring.trash, position -1."""
        ctx = self.fc(torch.cat([self.fuse_taps(taps), self.embed(next_ids)], -1))
        cos, sin = ops.rope_tables(positions, self.rope_inv_freq)
        rows = positions.remainder(ring.size)
        for i in range(len(self.layers)):
            k, v = self._kv(i, ctx, cos, sin)
            self._write(ring, i, slots, rows, k, v)
        ring.pos[slots, rows] = positions

    # ---- one round -----------------------------------------------------------------------
    @torch.no_grad()
    def propose(self, ring: DrafterRing, taps: torch.Tensor, next_ids: torch.Tensor,
                slots: torch.Tensor, anchors: torch.Tensor, depth: int, length: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """`depth` passes for S streams (`KolibriBlockDrafter.propose_cached`).

        taps bf16 [S, n_taps, Ht]: the anchors' taps; next_ids int64 [S]: t_{p+1}; slots int64
        [S]: ring slots; anchors int64 [S]: p. The ring must hold each stream's context rows
        p - C .. p - 1 (`commit`). length: ring rows attended (a bound > every position the
        round touches, or None: all R). Returns drafts int64 [S, depth*B] (target ids) and
        fp32 logits [S, depth*B, Vd]. Provisional rows stay in the ring (masked later)."""
        c = self.config
        s, b, h = taps.shape[0], c.block_size, c.hidden_size
        length = ring.size if length is None else length
        fused = self.fuse_taps(taps)
        mask = self.mask_embedding.expand(s, h)
        first = self.fc(torch.cat([torch.cat([fused, self.embed(next_ids)], -1),
                                   torch.cat([fused, mask], -1)]))
        anchor_ctx, mask_rows = first[:s], first[s:]
        j = torch.arange(b, device=anchors.device)
        row_slots = slots[:, None].expand(s, b).reshape(-1)
        drafts, logits = [], []
        for r in range(depth):
            pos = anchors[:, None] + j[None, :]                        # [S, B]
            flat = pos.reshape(-1)
            rows = flat.remainder(ring.size)
            ring.pos[row_slots, rows] = flat
            cos, sin = ops.rope_tables(flat, self.rope_inv_freq)
            visible = self._visible(ring, slots, anchors, pos, length)
            x = torch.cat([anchor_ctx[:, None], mask_rows[:, None].expand(s, b - 1, h)], 1)
            for i, w in enumerate(self.layers):
                x = self._layer(ring, i, w, x, cos, sin, row_slots, rows, slots, visible, length)
            states, d, lg = self._heads(x)
            drafts.append(d)
            logits.append(lg)
            if r == depth - 1:
                break
            # positions p .. p+B-1 become provisional context rows: (fused_p, t_{p+1}) =
            # anchor_ctx and (g_j, d_j) for j < B-1; the new anchor p+B has (g_{B-1}, d_{B-1})
            nxt = self.fc(torch.cat([torch.cat([states, self.embed(d)], -1).reshape(s * b, 2 * h),
                                     torch.cat([states[:, -1], mask], -1)]))
            new = nxt[:s * b].view(s, b, h)
            prov = torch.cat([anchor_ctx[:, None], new[:, :-1]], 1).reshape(s * b, h)
            for i in range(len(self.layers)):
                k, v = self._kv(i, prov, cos, sin)
                self._write(ring, i, row_slots, rows, k, v)
            anchor_ctx, mask_rows = new[:, -1], nxt[s * b:]
            anchors = anchors + b
        return torch.cat(drafts, 1), torch.cat(logits, 1)

    def _visible(self, ring: DrafterRing, slots, anchors, pos, length: int) -> torch.Tensor:
        """bool [S, B, L]: ring row l of stream s is visible to block row j iff its position
        lies in [p - context_window, p + j] (and is not empty)."""
        rp = ring.pos[:, :length].index_select(0, slots)[:, None, :]          # [S, 1, L]
        lo = (anchors - self.config.context_window)[:, None, None]
        return (rp >= 0) & (rp >= lo) & (rp <= pos[:, :, None])

    def _layer(self, ring: DrafterRing, i: int, w: DrafterLayerWeights, x: torch.Tensor,
               cos, sin, row_slots, rows, slots, visible, length: int) -> torch.Tensor:
        """One body layer over the block rows x bf16 [S, B, H] (`DrafterLayer.forward`).
        Norms: the plugin's; the o_proj residual add is fused into the post norm (the spine's
        add touches rows 1.. only and stays a torch add)."""
        c = self.config
        s, b, h = x.shape
        d, (input_norm, post_norm, spine_norm) = c.head_dim, self.gains[i]
        hq, hkv = c.num_attention_heads, c.num_key_value_heads
        if w.spine is not None and b > 1:
            _, a, u = w.spine
            prev = x[:, :-1].reshape(s * (b - 1), h)
            delta = u(F.silu(a(self._norm(prev, spine_norm)[1]))).view(s, b - 1, h)
            x = torch.cat([x[:, :1], x[:, 1:] + delta], 1)
        xf = x.reshape(s * b, h)
        qkv = w.qkv(self._norm(xf, input_norm)[1])
        qk = ops.apply_rope(qkv[:, :(hq + hkv) * d].view(s * b, hq + hkv, d), cos, sin)
        v = qkv[:, (hq + hkv) * d:].view(s * b, hkv, d)
        self._write(ring, i, row_slots, rows, qk[:, hq:], v)
        a = self._attend(qk[:, :hq].reshape(s, b, hq, d), ring.k[i], ring.v[i], slots, visible,
                         length)
        xf, normed = self._norm(xf, post_norm, w.o_proj(a))        # xf + o_proj(a), norm
        gu = w.w13(normed)
        inter = gu.shape[1] // 2
        xf = xf + w.down(F.silu(gu[:, :inter]) * gu[:, inter:])
        return xf.view(s, b, h)

    def _attend(self, q: torch.Tensor, ring_k: torch.Tensor, ring_v: torch.Tensor, slots,
                visible: torch.Tensor, length: int) -> torch.Tensor:
        """q bf16 [S, B, Hq, D] over the ring rows of each stream's slot -> bf16 [S*B, Hq*D].
        GQA: query head n reads KV head n // (Hq / Hkv); softmax scale 1/sqrt(D)."""
        s, b, hq, d = q.shape
        hkv = ring_k.shape[2]
        g = hq // hkv
        k = ring_k[:, :length].index_select(0, slots).transpose(1, 2)         # [S, Hkv, L, D]
        v = ring_v[:, :length].index_select(0, slots).transpose(1, 2)
        qg = q.reshape(s, b, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(s, hkv, g * b, d)
        vis = visible[:, None, None].expand(s, 1, g, b, length).reshape(s, 1, g * b, length)
        if self.attn == "sdpa":
            out = F.scaled_dot_product_attention(qg, k, v, attn_mask=vis)
        else:
            scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)) / math.sqrt(d)
            probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)
            out = torch.matmul(probs, v.float())
        out = out.view(s, hkv, g, b, d).permute(0, 3, 1, 2, 4).reshape(s * b, hq * d)
        return out.to(torch.bfloat16)

    def _heads(self, x: torch.Tensor):
        """Sequential heads (`KolibriBlockDrafter._heads`): returns states bf16 [S, B, H],
        drafts int64 [S, B] (target ids), fp32 logits [S, B, Vd]. The predecessor's residual
        add is fused into the final norm (plugin)."""
        a, bm, u = self.predecessor
        states, drafts, logits = [], [], []
        for j in range(x.shape[1]):
            xj = x[:, j]                                   # [S, H] view, row stride B*H
            res = None if j == 0 else u(F.silu(a(xj) + bm(self.embed(drafts[-1]))))
            g, normed = self._norm(xj, self.norm_bf16, res)   # g = xj + res (xj without)
            lj = self.head(normed)
            # argmax returns the first maximum: ties go to the lower draft-vocabulary index
            drafts.append(self.draft_vocab[torch.argmax(lj, dim=-1)])
            states.append(g)
            logits.append(lj)
        return torch.stack(states, 1), torch.stack(drafts, 1), torch.stack(logits, 1)


def _bf16(gain: torch.Tensor) -> torch.Tensor:
    """A norm gain (bf16 values held in fp32) as the plugin takes it: bf16 [H] contiguous;
    exact, so the norm's `weight.float()` sees the same values."""
    return gain.to(torch.bfloat16).contiguous()
