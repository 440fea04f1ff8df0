"""The block drafter as a proposer: per-stream fused states and the drafter's own context
KV cache, fed with the target's taps of committed positions only.

Every processed target position i exposes taps (residual stream after target_layer_ids);
once i is committed its fused state is kept, and once t_{i+1} is known its context row's
per-layer keys and values are cached (`shared/spec/block-drafter.md`: "an engine caches them
and adds one row per newly accepted position"). Rows of rejected drafts are never added.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafter import KolibriBlockDrafter


class StreamKeys(dict):
    """request id -> (temperature > 0, seed_key, base) of a sampled stream's coupled drafts
    (`Speculator.add`: the heads' `KeyedRows` tables); other streams pick greedily (GREEDY)."""

    GREEDY = (0.0, 0, 0)

    def set(self, request_id: str, keys: tuple[float, int, int] | None) -> None:
        """Keep `keys` for the stream, or forget it (None: greedy)."""
        if keys is None:
            self.pop(request_id, None)
        else:
            self[request_id] = keys

    def of(self, request_id: str) -> tuple[float, int, int]:
        return self.get(request_id, self.GREEDY)


@dataclass
class DrafterStream:
    """State of one stream. fused: [P, H] fused states of committed positions 0..P-1 (only
    the last context_window + 1 are kept; `offset` is the position of row 0); kv: per layer
    (k, v) [C, Hkv, D] of context rows for positions kv_end - C .. kv_end - 1."""

    fused: torch.Tensor
    offset: int = 0
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    kv_end: int = 0

    @property
    def num_positions(self) -> int:
        return self.offset + self.fused.shape[0]


class DrafterProposer:
    """Proposes depth * block_size drafts per stream from the stream's committed state."""

    def __init__(self, drafter: KolibriBlockDrafter, depth: int):
        if depth < 1:
            raise ValueError(f"depth: must be >= 1, got {depth}")
        self.drafter, self.depth = drafter, depth
        self.streams: dict[str, DrafterStream] = {}
        self.keys = StreamKeys()                 # `set_sampling`

    @property
    def num_drafts(self) -> int:
        return self.depth * self.drafter.config.block_size

    def set_sampling(self, request_id: str, keys: tuple[float, int, int] | None) -> None:
        """Coupled drafts for a sampled stream: keys = (temperature > 0, seed_key, base), as
        `PluginDrafterProposer.set_sampling`; None: greedy picks (and forgotten)."""
        self.keys.set(request_id, keys)

    def reset(self, request_id: str) -> None:
        """Forget a stream (finished, aborted, or preempted: its prefill is observed again)."""
        self.streams.pop(request_id, None)

    @torch.no_grad()
    def observe(self, request_id: str, start: int, taps: torch.Tensor) -> None:
        """Committed positions start .. start + n - 1 with their taps [n, n_taps, Ht]."""
        d = self.drafter
        fused = d.fuse_taps(taps.to(d.fc.weight.dtype))
        st = self.streams.get(request_id)
        if st is None:
            if start != 0:
                raise ValueError(f"{request_id}: first observed position is {start}, not 0")
            st = self.streams[request_id] = DrafterStream(
                fused, kv=[(fused.new_zeros(0, *s), fused.new_zeros(0, *s))
                           for s in self._kv_shapes()])
            return self._trim(st)
        if start != st.num_positions:
            raise ValueError(f"{request_id}: observed position {start}, expected "
                             f"{st.num_positions}")
        st.fused = torch.cat([st.fused, fused])
        self._trim(st)

    def _kv_shapes(self) -> list[tuple[int, int]]:
        c = self.drafter.config
        return [(c.num_key_value_heads, c.head_dim)] * c.num_hidden_layers

    def _trim(self, st: DrafterStream) -> None:
        keep = self.drafter.config.context_window + 1
        if st.fused.shape[0] > keep:
            drop = st.fused.shape[0] - keep
            st.fused, st.offset = st.fused[drop:], st.offset + drop

    @torch.no_grad()
    def propose_batch(self, items: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
        """Drafts for several streams in one batched drafter pass per depth step.

        items: (request_id, tokens = prompt + output; the newest token is the anchor's next
        token). Streams whose committed positions do not reach the anchor yet get none."""
        ready = []
        for rid, tokens in items:
            st = self.streams.get(rid)
            if st is not None and st.num_positions == len(tokens) - 1:
                p = st.num_positions - 1
                self._extend_context(st, tokens, p)
                ready.append((rid, st, p, tokens[p + 1]))
        if not ready:
            return {}
        fused = torch.stack([st.fused[-1] for _, st, _, _ in ready])
        nxt = torch.tensor([t for *_, t in ready], device=fused.device)
        keys = None
        if any(rid in self.keys for rid, *_ in ready):
            k = [self.keys.of(rid) for rid, *_ in ready]
            keys = (torch.tensor([t for t, _, _ in k], dtype=torch.float32),
                    torch.tensor([s for _, s, _ in k]), torch.tensor([b for *_, b in k]))
            keys = tuple(x.to(fused.device) for x in keys)
        drafts, _ = self.drafter.propose_cached(fused, nxt, [p for _, _, p, _ in ready],
                                                [st.kv for _, st, _, _ in ready], self.depth,
                                                keys)
        return {rid: row.tolist() for (rid, *_), row in zip(ready, drafts)}

    def _extend_context(self, st: DrafterStream, tokens: list[int], p: int) -> None:
        """Cache context rows for positions kv_end .. p - 1 (their next token is known)."""
        d, cw = self.drafter, self.drafter.config.context_window
        lo = max(st.kv_end, p - cw, st.offset)
        if lo < p:
            rows = st.fused[lo - st.offset:p - st.offset]
            nxt = torch.tensor(tokens[lo + 1:p + 1], device=rows.device)
            new = d.context_kv(d.context_rows(rows, nxt),
                               torch.arange(lo, p, device=rows.device))
            st.kv = [(torch.cat([k, nk])[-cw:], torch.cat([v, nv])[-cw:])
                     for (k, v), (nk, nv) in zip(st.kv, new)]
        st.kv_end = p
