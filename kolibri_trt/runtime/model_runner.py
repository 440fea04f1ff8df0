"""One batched forward pass over the paged cache (the CPU path; plain torch).

The layers are the reference model's own modules (`model/reference.py`); only attention differs:
new keys and values go into the paged cache first, then every query row attends over its
visible cached keys with `ops.attend_one`, the same function and shapes the reference uses.
With a bf16 cache this reproduces the reference bit for bit; whatever the step mixes (prefill
chunks, decodes, verifications, other streams), a token's logits stay the same.
"""

from __future__ import annotations

import torch

from ..model import ops
from ..model.reference import Attention, KolibriForCausalLM
from .kv_cache import INT4_FULL, KVCache
from ..model.metadata import StepMetadata


class ModelRunner:
    """Runs `KolibriForCausalLM` weights over a `KVCache`.

    rotations: layer -> (M_q, M_k) fp32 [D, D] for full layers with an INT4 cache (the fold of
    `shared/spec/kv-cache.md`: q_used = M_q·rms(q), k_cached = M_k·rms(k)).
    """

    def __init__(self, model: KolibriForCausalLM, cache: KVCache,
                 rotations: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        self.model, self.cache, self.rotations = model, cache, rotations
        self.cfg = model.config
        for i in range(self.cfg.num_hidden_layers):
            if cache.format(i) in INT4_FULL and i not in rotations:
                raise ValueError(f"layer {i}: INT4 cache needs q/k rotation matrices")

    @torch.no_grad()
    def forward(self, meta: StepMetadata, tap_layers: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns fp32 logits [R, V] for meta.logits_rows, and taps [T, len(tap_layers), H]
        (the residual stream after those layers, model dtype) or None."""
        m = self.model.model
        h = m.embed_tokens(meta.input_ids)
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(m.layers):
            a = self._attention(i, layer.self_attn, layer.input_layernorm(h), meta)
            h = h + layer.self_attn.o_proj(a)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if i in tap_layers:
                taps[i] = h
        logits = self.model.lm_head(m.norm(h[meta.logits_rows])).float()
        if not tap_layers:
            return logits, None
        return logits, torch.stack([taps[t] for t in tap_layers], dim=1)

    def _attention(self, i: int, attn: Attention, x: torch.Tensor, meta: StepMetadata
                   ) -> torch.Tensor:
        cfg = self.cfg
        sliding = cfg.is_sliding(i)
        if self.cache.format(i) in INT4_FULL:
            q, k, v = self._folded_qkv(i, attn, x)
        else:
            q, k, v = attn.qkv(x, meta.positions)
        slots = meta.sliding_slots if sliding else meta.full_slots
        self.cache.write(i, k, v, slots)
        window = cfg.sliding_window if sliding else None
        tables = meta.sliding_block_tables if sliding else meta.full_block_tables
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        for s, (q_len, seq_len) in enumerate(zip(meta.q_lens, meta.seq_lens_host)):
            row0 = int(meta.cu_q_lens[s])
            positions = torch.arange(seq_len - q_len, seq_len)
            ranges = ops.causal_ranges(positions, 0, window)
            lo = ranges[0][0]
            k_all, v_all = self.cache.gather(i, self._slots(tables[s], lo, seq_len))
            for t, (a, b) in enumerate(ranges):
                out[row0 + t] = ops.attend_one(q[row0 + t], k_all[a - lo:b - lo],
                                               v_all[a - lo:b - lo])
        return out.to(x.dtype).reshape(x.shape[0], -1)

    def _folded_qkv(self, i: int, attn: Attention, x: torch.Tensor):
        """Full layer with INT4 cache: q = M_q·rms(q) (fp32), k = M_k·rms(k), v plain."""
        cfg = self.cfg
        m_q, m_k = self.rotations[i]
        q = attn.q_proj(x).view(-1, cfg.num_attention_heads, cfg.head_dim)
        k = attn.k_proj(x).view(-1, cfg.num_key_value_heads, cfg.head_dim)
        v = attn.v_proj(x).view(-1, cfg.num_key_value_heads, cfg.head_dim)
        eps = cfg.rms_norm_eps
        q = ops.linear(ops.rms_norm(q.float(), None, eps), m_q)
        k = ops.linear(ops.rms_norm(k.float(), None, eps), m_k)
        return q, k, v

    def _slots(self, table: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        bs = self.cache.geometry.block_size
        pos = torch.arange(lo, hi, device=table.device)
        return table[pos // bs].long() * bs + pos % bs
