"""`DrafterPlugin`: the block drafter over the engine's stored tensors through `plugins/` (GPU).

The maths is `KolibriBlockDrafter.propose_cached` (`block_drafter.py`,
`shared/spec/block-drafter.md` §Forward pass and §Depth): `depth` passes of `block_size` (B)
rows for S streams, sequential output heads with the predecessor, argmax ties to the lower
draft-vocabulary index, provisional context rows between passes. What changes is where it
runs:

- body linears in the engine's "block_fp8" format go to `fp8_gemv` with their [N, K/64]
  scales (q/k/v fused into one QKV weight per layer, gate/up interleaved into one w13: block
  scales are per output row, so the fusion is exact); a K that is not a multiple of 64 (tiny
  test configs: ranks 16/32, intermediate 96) is padded with zero columns at load and the
  activation with zeros per call. The head slice in "nvfp4" goes to `nvfp4_gemv`. "bf16"
  groups (the exact-parity engine) run `ops.linear`, the reference's own product;
- the glue around a linear is fused into its kernel call (`PluginLinear.__call__`,
  `PluginHead.scores`): the RMSNorms before qkv, the K/V of a commit, w13, the spine's A, the
  taps (one per tap: a segmented norm before `fuse`) and the head (the final norm) are the
  GEMVs' prologue; the residual adds after o_proj, down and U (the heads' g = x_j + res) and
  of the predecessor's B term, SwiGLU on w13 and silu on the spine's and predecessor's A are
  their epilogue; the embedding rows of the drafts are gathered by B's loads; the pick is
  one `vocab_argmax` (greedy, or with `keyed` coupled to the target's sampler). The maths of `ops.rms_norm` (bf16 gains made once). RoPE is
  a rotation table made once (`plugin_glue.rope_table`, the values of `ops.rope_cos_sin`)
  applied in two elementwise ops (`apply_rope_rotation`, bit for bit `ops.apply_rope`) or
  by the `rope_ring_write` plugin; the embedding is the target's, bf16; activations bf16
  (the dequantizing CPU reference runs fp32 activations through fp32 weights);
- the torch glue between the kernels is written for few launches (`plugin_glue.py`;
  `bench/count_drafter_ops.py` counts them): q and k are rotated in place in the QKV
  product, so keys and values reach the ring in one write per layer (a commit: one per
  layer too), the drafts and logits are written into the round's outputs by the heads (no
  stacking; without logits the argmax reads the head's own output), constants (the RoPE
  table for every position the runner can reach, `rope_table`: a step gathers its rows) are
  made once, and what depends only on positions (ring rows, each pass's anchors and
  positions: `RoundIndex`) comes computed from the host (`DrafterRunner`);
- context K/V live in static device buffers (`DrafterRing`, `plugin_weights.py`): per
  stream slot a ring of R = context_window + depth * B rows per layer, bf16
  [layers, 2 (K, V), slots + 1, R, Hkv, D], and the absolute position held by each ring row
  (int64 [slots + 1, R], -1 = empty). A key is stored with its RoPE applied, at ring row
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

import torch
import torch.nn.functional as F
from kolibri_trt_plugins import ring_attention as ring_attention_kernel
from kolibri_trt_plugins import rope_ring_write, vocab_argmax

from ..model import ops
from .config import DrafterConfig
from .plugin_glue import (RoundIndex, RoundMask, apply_rope_rotation, ring_attention,
                          rope_table, visible_rows)
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
    gains (and of the tap gains) for the plugin norm (exact) and the RoPE inverse frequencies
    (half of `ops.rope_inv_freq`); `rope_table` makes the RoPE table once.
    attn: "dense" (fp32 matmul + softmax over the ring, the default), "sdpa"
    (`F.scaled_dot_product_attention` on bf16 with a boolean mask) or "kernel" (the
    `ring_attention` plugin: one Triton kernel per layer reading the ring in place, visibility
    from the ring's positions; on CPU its torch reference, the dense maths; RoPE on q and k
    plus the K/V ring write then go to the `rope_ring_write` plugin, one launch per layer,
    the same bits as `apply_rope_rotation` + index_put).
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
        # True: the heads pick with `KeyedRows` from the ring's per-slot tables (a sampled
        # stream's drafts coupled to the target's sampler, plugins/vocab_argmax.py); set before
        # any graph is captured (the engine's draft_sampling "coupled")
        self.keyed = False
        # per layer (input, post, spine or None) gains, bf16 [H] contiguous: the plugin's layout
        self.gains = [(_bf16(w.input_norm), _bf16(w.post_norm),
                       None if w.spine is None else _bf16(w.spine[0])) for w in self.layers]
        self.norm_bf16 = _bf16(norm)
        self.tap_gain_cat = _bf16(tap_norms.reshape(-1))    # [n_taps * Ht]: tap t's gain at t
        # made once: the first half of `ops.rope_inv_freq` (it repeats it), block offsets 0..B-1
        self.rope_inv_half = ops.rope_inv_freq(config.head_dim, config.rope_theta,
                                               self.device)[:config.head_dim // 2].contiguous()
        self._rope: torch.Tensor | None = None   # `rope_table`; block offsets: the host's now

    def rope_table(self, positions: int) -> torch.Tensor:
        """The RoPE rotation tables of positions 0 .. P-1, P >= positions: fp32 [P, 2, 2, D/2]
        on the device (`plugin_glue.rope_table`), 8 * head_dim bytes per position (1 KiB at
        D = 128: 4 MiB for 4096 positions). Made once; a call for more positions than it holds
        makes a larger one (whoever got the earlier one keeps it: CUDA graphs read it)."""
        if self._rope is None or self._rope.shape[0] < positions:
            self._rope = rope_table(positions, self.rope_inv_half)
        return self._rope

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
                w13=PluginLinear.interleaved(lin(pre + "mlp.gate_proj"), lin(pre + "mlp.up_proj")),
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

    def fuse_taps(self, taps: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """taps bf16 [N, n_taps, Ht] -> fused [N, H]: one norm per tap (its own gain; a row of
        `ops.rms_norm` bit for bit on CPU), the taps side by side, then `fuse`: one `fp8_gemv`
        launch (its norm prologue over n_taps segments). rows (int64 [N]): taps is a table
        (the taps history) and row i is taps[rows[i]], gathered by the GEMV's loads."""
        n, k, ht = taps.shape
        return self.fuse(taps.reshape(n, k * ht), norm=self.tap_gain_cat,
                         eps=self.config.rms_norm_eps, norm_segments=k, x_rows=rows)

    def _write_context(self, ring: DrafterRing, rows_x: torch.Tensor, rope: torch.Tensor,
                       slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Context rows rows_x bf16 [N, H] into every layer's ring (`DrafterLayer.kv`) at
        (slots, rows) (int64, any shape of N elements): keys rotated in place in the K/V
        product (rope: `rope_rotation` of their positions), then keys and values in one write."""
        c = self.config
        n, hkv, d = rows_x.shape[0], c.num_key_value_heads, c.head_dim
        for i, w in enumerate(self.layers):
            kv = w.kv(rows_x, norm=self.gains[i][0], eps=c.rms_norm_eps)    # [N, 2 Hkv D]
            if self.attn == "kernel":          # the same bits in one launch (no q heads)
                rope_ring_write(kv, rope, ring.kv[i], slots, rows, 0)
                continue
            k = kv[:, :hkv * d].view(n, hkv, d)
            apply_rope_rotation(k, rope, out=k)
            kv = kv.view(n, 2, hkv, d).permute(1, 0, 2, 3)                 # [2, N, Hkv, D]
            ring.kv[i][:, slots, rows] = kv.view(2, *slots.shape, hkv, d)

    # ---- committing context rows ---------------------------------------------------------
    @torch.no_grad()
    def commit(self, ring: DrafterRing, taps: torch.Tensor, next_ids: torch.Tensor,
               slots: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
               rope: torch.Tensor, taps_rows: torch.Tensor | None = None) -> None:
        """Write N context rows into the ring: row i is position positions[i] of the stream in
        ring slot slots[i], ctx = fc(cat(fuse(taps[i]), E[next_ids[i]])), every layer's K/V.

        taps bf16 [N, n_taps, Ht]; next_ids, slots, positions, rows int64 [N] (device): rows
        = positions % R, the ring rows; rope fp32 [N, 2, 2, D/2]: the positions' rotation
        tables (rows of `rope_table`); rows and table rows come from the host
        (`DrafterRunner`). Padding rows: slot = ring.trash, position -1 (any row, any table).
        taps_rows (int64 [N]): taps is the taps history and row i's taps are taps[taps_rows[i]]
        (`fuse_taps`: no gather of its own)."""
        ctx = self.fc(torch.cat([self.fuse_taps(taps, taps_rows), self.embed(next_ids)], -1))
        self._write_context(ring, ctx, rope, slots, rows)
        ring.pos[slots, rows] = positions

    # ---- one round -----------------------------------------------------------------------
    @torch.no_grad()
    def propose(self, ring: DrafterRing, taps: torch.Tensor, next_ids: torch.Tensor,
                slots: torch.Tensor, index: RoundIndex, length: int | None = None,
                logits: bool = True, taps_rows: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`depth` passes for S streams (`KolibriBlockDrafter.propose_cached`).

        taps bf16 [S, n_taps, Ht]: the anchors' taps; next_ids int64 [S]: t_{p+1}; slots int64
        [S]: ring slots; index: per pass the anchors (p at pass 0), positions, ring rows and
        RoPE tables (`RoundIndex`, from the host; depth = its first dim). The ring must hold
        each stream's context rows p - C .. p - 1 (`commit`). length: ring rows attended (a
        bound > every position the round touches, or None: all R). Returns drafts int64
        [S, depth*B] (target ids) and fp32 logits [S, depth*B, Vd], written in place by the
        passes; logits=False: None, the argmax reads the head's own output (no fp32 copy; the
        same drafts). Provisional rows stay in the ring (masked later). taps_rows (int64 [S]):
        taps is the taps history, stream s's taps are taps[taps_rows[s]] (`fuse_taps`)."""
        c = self.config
        s, b, h = next_ids.shape[0], c.block_size, c.hidden_size
        depth = index.pos.shape[0]
        length = ring.size if length is None else length
        fused = self.fuse_taps(taps, taps_rows)
        mask = self.mask_embedding.expand(s, h)
        tail = torch.stack([self.embed(next_ids), mask])                       # [2, S, H]
        first = self.fc(torch.cat([fused.expand(2, s, h), tail], -1).view(2 * s, 2 * h))
        anchor_ctx, mask_rows = first[:s], first[s:]
        drafts = torch.empty(s, depth * b, dtype=torch.long, device=taps.device)
        out = torch.empty(s, depth * b, c.draft_vocab_size, dtype=torch.float32,
                          device=taps.device) if logits else None
        slots2 = slots[:, None].expand(s, b)
        # every pass's positions in one write: a later pass's rows hold positions above every
        # earlier block row (invisible to it), as the out-of-window ones they replace were
        ring.pos[slots[None, :, None].expand(depth, s, b), index.rows] = index.pos
        for r in range(depth):
            pos, rows, rope, anchors = index.pos[r], index.rows[r], index.rope[r], index.anchors[r]
            visible = None if self.attn == "kernel" else visible_rows(
                ring.pos, slots, anchors, pos, c.context_window, length)
            seen = RoundMask(visible, ring.pos, anchors, pos)
            x = torch.cat([anchor_ctx[:, None], mask_rows[:, None].expand(s, b - 1, h)], 1)
            for i, w in enumerate(self.layers):
                x = self._layer(ring, i, w, x, rope, slots2, rows, slots, seen, length)
            cols = slice(r * b, (r + 1) * b)
            keyed = [ring.keyed(slots, pos[:, j]) for j in range(b)] if self.keyed else None
            states = self._heads(x, drafts[:, cols], None if out is None else out[:, cols],
                                 r < depth - 1, keyed)
            if r == depth - 1:
                break
            anchor_ctx, mask_rows = self._provisional(ring, states, drafts[:, cols], anchor_ctx,
                                                      mask, rope, slots2, rows)
        return drafts, out

    def _provisional(self, ring: DrafterRing, states, drafts, anchor_ctx, mask, rope, slots2,
                     rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions p .. p+B-1 of a pass become provisional context rows: (fused_p, t_{p+1})
        = anchor_ctx and (g_j, d_j) for j < B-1 (states bf16 [S, B, H], the pass's drafts
        [S, B]), written into the ring. Returns the next pass's anchor rows (the new anchor
        p+B has (g_{B-1}, d_{B-1})) and mask rows, each [S, H]."""
        s, b, h = states.shape
        nxt = self.fc(torch.cat([
            torch.cat([states, self.embed(drafts)], -1).reshape(s * b, 2 * h),
            torch.cat([states[:, -1], mask], -1)]))
        new = nxt[:s * b].view(s, b, h)
        prov = torch.cat([anchor_ctx[:, None], new[:, :-1]], 1).reshape(s * b, h)
        self._write_context(ring, prov, rope, slots2, rows)
        return new[:, -1], nxt[s * b:]

    def _layer(self, ring: DrafterRing, i: int, w: DrafterLayerWeights, x: torch.Tensor,
               rope, slots2, rows, slots, seen: RoundMask, length: int) -> torch.Tensor:
        """One body layer over the block rows x bf16 [S, B, H] (`DrafterLayer.forward`; x is
        this pass's own tensor: the spine adds into rows 1.. in place). Norms: the plugin's;
        the o_proj residual add is fused into the post norm."""
        c = self.config
        s, b, h = x.shape
        d, (input_norm, post_norm, spine_norm) = c.head_dim, self.gains[i]
        hq, hkv = c.num_attention_heads, c.num_key_value_heads
        eps = c.rms_norm_eps
        if w.spine is not None and b > 1:
            _, a, u = w.spine
            prev = x[:, :-1].reshape(s * (b - 1), h)
            delta = u(a(prev, norm=spine_norm, eps=eps, act="silu"))
            x[:, 1:].add_(delta.view(s, b - 1, h))
        xf = x.view(s * b, h)
        qkv = w.qkv(xf, norm=input_norm, eps=eps)                    # [S*B, (Hq + 2 Hkv) D]
        if self.attn == "kernel":      # q rotated in place, K (rotated) and V into the ring
            rope_ring_write(qkv, rope, ring.kv[i], slots2, rows, hq)
        else:
            qk = qkv[:, :(hq + hkv) * d].view(s * b, hq + hkv, d)
            apply_rope_rotation(qk, rope, out=qk)                     # in place: q, k rotated
            ring.kv[i][:, slots2, rows] = qkv[:, hq * d:].view(s, b, 2, hkv, d).permute(
                2, 0, 1, 3, 4)
        a = self._attend(qkv[:, :hq * d].view(s, b, hq, d), ring.kv[i], slots, seen, length)
        xf = w.o_proj(a, residual=xf)                               # xf + o_proj(a)
        xf = w.down(w.w13(xf, norm=post_norm, eps=eps, act="swiglu"), residual=xf)
        return xf.view(s, b, h)

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, slots, mask: RoundMask,
                length: int) -> torch.Tensor:
        """q bf16 [S, B, Hq, D] over the ring rows of each stream's slot -> bf16 [S*B, Hq*D];
        kv: the layer's ring [2, slots + 1, R, Hkv, D] (`plugin_glue.ring_attention`, or the
        `ring_attention` plugin for attn "kernel": one launch)."""
        if self.attn == "kernel":
            return ring_attention_kernel(q, kv, mask.ring_pos, slots, mask.anchors, mask.pos,
                                         self.config.context_window, length)
        return ring_attention(q, kv, slots, mask.visible, length, self.attn)

    def _heads(self, x: torch.Tensor, drafts: torch.Tensor, logits: torch.Tensor | None,
               keep_states: bool, keyed: list | None = None) -> torch.Tensor | None:
        """Sequential heads (`KolibriBlockDrafter._heads`) over x bf16 [S, B, H]: drafts int64
        [S, B] (target ids) and fp32 logits [S, B, Vd] written into the given views (logits
        None: the argmax reads `PluginHead.scores`, bf16 for NVFP4: the values the fp32 copy
        holds exactly, so the same index); returns the states bf16 [S, B, H] if keep_states.
        The predecessor's residual add is U's epilogue, the final norm the head's prologue.
        keyed: per row j the `KeyedRows` of its pick (sampled streams' coupled drafts), or None
        (greedy)."""
        a, bm, u = self.predecessor
        eps = self.config.rms_norm_eps
        states = []
        for j in range(x.shape[1]):
            xj = x[:, j]                                   # [S, H] view, row stride B*H
            g = xj if j == 0 else u(a(xj, act="silu", residual=bm(      # B·E[d_{j-1}] gathered
                self.embed_tokens, x_rows=drafts[:, j - 1])), residual=xj)   # g = xj + res
            if logits is None:           # the final norm in the head's own launch
                scores = self.head.scores(g, self.norm_bf16, eps)
            else:
                self.head.into(g, logits[:, j], self.norm_bf16, eps)
                scores = logits[:, j]
            # the first maximum: ties go to the lower draft-vocabulary index (one launch)
            vocab_argmax(scores, self.draft_vocab, out=drafts[:, j],
                         keyed=None if keyed is None else keyed[j])
            states.append(g)
        return torch.stack(states, 1) if keep_states else None


def _bf16(gain: torch.Tensor) -> torch.Tensor:
    """A norm gain (bf16 values held in fp32) as the plugin takes it: bf16 [H] contiguous;
    exact, so the norm's `weight.float()` sees the same values."""
    return gain.to(torch.bfloat16).contiguous()
