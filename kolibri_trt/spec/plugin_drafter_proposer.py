"""The block drafter's GPU path as a proposer: `DrafterRunner` (static buffers, CUDA graphs)
and `PluginDrafterProposer` (the interface of `DrafterProposer`).

Per round (one `propose_batch`) the proposer hands the runner two batched steps:
1. commit: the context rows of every drafting stream's newly committed positions
   (kv_end .. p - 1, at most context_window back; what `DrafterProposer._extend_context`
   does per stream) -> one write into the ring (`DrafterPlugin.commit`);
2. round: `depth` passes for all drafting streams (`DrafterPlugin.propose`).
Both are padded to a bucket and replayed from a CUDA graph captured on first use (or by
`capture_all` at start-up), after one eager warm-up run that writes what the replay writes
again; on CPU, or with graphs off, the same padded inputs run eagerly. Buckets:
commit N rows -> N_b = next power of two >= 8, at most `max_commit` (larger commits run in
chunks); round S streams -> S_b = next power of two, and L_b ring rows attended = the
smallest of 256, 512, ... >= max(p) + depth*B, or R (all). Padding rows/streams use the
ring's trash slot. Host work per round: one gather of the taps rows (`torch.cat` into a
static buffer), one copy of the int64 indices, the replays, and one copy of the drafts back.

Taps are not fused at `observe`: the proposer keeps, per stream, the taps (device tensors)
of the positions it still needs (from kv_end, at most context_window + 1 back) and fuses
them inside the graphs. Streams map to ring slots, allocated at a stream's first observed
position and freed by `reset`; when every slot is taken the least recently used stream is
evicted (it gets no drafts until its prefill is observed again). Use counts rounds and
observations, so a preempted stream that has not come back goes before a running one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafter import DrafterTarget
from ..drafter.plugin_drafter import DrafterPlugin
from ..drafter.plugin_weights import DrafterRing

MIN_COMMIT = 8
L_BUCKETS = (256, 512, 1024, 2048, 4096, 8192)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class DrafterRunner:
    """Runs `DrafterPlugin.commit` / `propose` over padded static buffers, through CUDA graphs.

    num_slots: streams with drafter state at once (ring slots); depth: passes per round;
    use_graphs: capture CUDA graphs (needs a CUDA model); max_commit: the largest commit
    bucket (rows); None: next power of two of 16 per slot; length_buckets: the ring lengths
    a round may attend below R.
    """

    def __init__(self, model: DrafterPlugin, depth: int, num_slots: int,
                 use_graphs: bool = True, max_commit: int | None = None,
                 length_buckets: tuple[int, ...] = L_BUCKETS):
        if depth < 1:
            raise ValueError(f"depth: must be >= 1, got {depth}")
        if use_graphs and model.device.type != "cuda":
            raise ValueError(f"use_graphs: CUDA graphs need a CUDA model, got {model.device}")
        c, dev = model.config, model.device
        self.model, self.depth, self.use_graphs = model, depth, use_graphs
        self.length_buckets = tuple(sorted(length_buckets))
        self.ring = DrafterRing.allocate(c, num_slots, depth, dev)
        self.max_s = _pow2(num_slots)
        self.max_commit = max(MIN_COMMIT, _pow2(max_commit or 16 * self.max_s))
        taps = (c.num_taps, c.target_hidden_size)
        self.c_taps = torch.zeros(self.max_commit, *taps, dtype=torch.bfloat16, device=dev)
        self.c_idx = torch.zeros(3, self.max_commit, dtype=torch.long, device=dev)
        self.r_taps = torch.zeros(self.max_s, *taps, dtype=torch.bfloat16, device=dev)
        self.r_idx = torch.zeros(3, self.max_s, dtype=torch.long, device=dev)
        self.graphs: dict[tuple, tuple] = {}
        self.used: set[tuple] = set()     # bucket keys run so far (graphs or eager)
        self.last_key: tuple | None = None
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None

    @property
    def num_slots(self) -> int:
        return self.ring.trash

    # ---- buckets -------------------------------------------------------------------------
    def length_bucket(self, max_anchor: int) -> int:
        """Ring rows a round attends: every position it touches is < max_anchor + depth*B."""
        end, r = max_anchor + self.depth * self.model.config.block_size, self.ring.size
        for length in self.length_buckets:
            if end <= length < r:
                return length
        return r

    def round_buckets(self) -> list[tuple[int, int]]:
        r = self.ring.size
        lengths = [n for n in self.length_buckets if n < r] + [r]
        out, s_b = [], 1
        while s_b <= self.max_s:
            out += [(s_b, n) for n in lengths]
            s_b *= 2
        return out

    def commit_buckets(self) -> list[int]:
        out, n = [], MIN_COMMIT
        while n <= self.max_commit:
            out.append(n)
            n *= 2
        return out

    # ---- steps ---------------------------------------------------------------------------
    @torch.no_grad()
    def commit(self, taps: list[torch.Tensor], next_ids: list[int], slots: list[int],
               positions: list[int]) -> None:
        """Write context rows: taps pieces (bf16 [n_i, n_taps, Ht], rows in order) and one
        next token, slot and position per row."""
        n = len(next_ids)
        if n == 0:
            return
        if n > self.max_commit:
            flat = torch.cat(taps)
            for a in range(0, n, self.max_commit):
                b = min(n, a + self.max_commit)
                self.commit([flat[a:b]], next_ids[a:b], slots[a:b], positions[a:b])
            return
        n_b = max(MIN_COMMIT, _pow2(n))
        torch.cat(taps, out=self.c_taps[:n])
        pad = n_b - n
        idx = torch.tensor([list(next_ids) + [0] * pad, list(slots) + [self.ring.trash] * pad,
                            list(positions) + [-1] * pad], dtype=torch.long)
        self.c_idx[:, :n_b].copy_(idx)
        self._replay(("commit", n_b), lambda: self._commit_step(n_b))

    def _commit_step(self, n_b: int):
        self.model.commit(self.ring, self.c_taps[:n_b], self.c_idx[0, :n_b], self.c_idx[1, :n_b],
                          self.c_idx[2, :n_b])
        return None

    @torch.no_grad()
    def propose(self, taps: list[torch.Tensor], next_ids: list[int], slots: list[int],
                anchors: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One round for S streams (the anchors' taps pieces, one row each). Returns drafts
        int64 [S, depth*B] (target ids) and fp32 logits [S, depth*B, Vd], on the device
        (views of static outputs under graphs: valid until the next round)."""
        s = len(next_ids)
        if s > self.max_s:
            raise ValueError(f"{s} streams in one round, the runner has {self.max_s} slots")
        s_b, length = _pow2(s), self.length_bucket(max(anchors))
        torch.cat(taps, out=self.r_taps[:s])
        pad = s_b - s
        idx = torch.tensor([list(next_ids) + [0] * pad, list(slots) + [self.ring.trash] * pad,
                            list(anchors) + [0] * pad], dtype=torch.long)
        self.r_idx[:, :s_b].copy_(idx)
        drafts, logits = self._replay(("round", s_b, length), lambda: self._round_step(s_b, length))
        return drafts[:s], logits[:s]

    def _round_step(self, s_b: int, length: int):
        return self.model.propose(self.ring, self.r_taps[:s_b], self.r_idx[0, :s_b],
                                  self.r_idx[1, :s_b], self.r_idx[2, :s_b], self.depth, length)

    def _replay(self, key: tuple, fn):
        self.used.add(key)
        self.last_key = key
        if not self.use_graphs:
            return fn()
        if key not in self.graphs:
            self.graphs[key] = self._capture(fn)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _capture(self, fn):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()   # compiles kernels; writes what the replay writes again
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out

    @torch.no_grad()
    def capture_all(self) -> int:
        """Capture every commit and round bucket now (all-padding steps: only the trash slot
        is written). Returns the number of graphs captured. ValueError without use_graphs."""
        if not self.use_graphs:
            raise ValueError("use_graphs: capture_all needs CUDA graphs on")
        self.c_idx[0].zero_()
        self.c_idx[1].fill_(self.ring.trash)
        self.c_idx[2].fill_(-1)
        self.r_idx[0].zero_()
        self.r_idx[1].fill_(self.ring.trash)
        self.r_idx[2].zero_()
        count = 0
        for n_b in self.commit_buckets():
            if ("commit", n_b) not in self.graphs:
                self.graphs[("commit", n_b)] = self._capture(lambda n=n_b: self._commit_step(n))
                count += 1
        for s_b, length in self.round_buckets():
            if ("round", s_b, length) not in self.graphs:
                self.graphs[("round", s_b, length)] = self._capture(
                    lambda s=s_b, n=length: self._round_step(s, n))
                count += 1
        return count


@dataclass
class _Stream:
    """One stream's drafter state: its ring slot, the positions observed (0 .. num_positions
    - 1), kv_end (context rows of positions < kv_end are in the ring) and the taps still
    needed: pieces (start, bf16 [n, n_taps, Ht]) covering [pending_start, num_positions)."""

    slot: int
    num_positions: int = 0
    kv_end: int = 0
    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    last_used: int = 0


class PluginDrafterProposer:
    """Proposes depth * block_size drafts per stream through `DrafterRunner` (the interface
    of `DrafterProposer`: `propose_batch`, `observe`, `reset`, `num_drafts`, `drafter`).

    drafter: the `DrafterPlugin`; depth: passes per round; max_streams: ring slots (streams
    with drafter state at once; the engine's max_num_seqs); use_graphs: CUDA graphs (None:
    on a CUDA model); runner_options: `DrafterRunner`'s max_commit, length_buckets.
    """

    def __init__(self, drafter: DrafterPlugin, depth: int, max_streams: int,
                 use_graphs: bool | None = None, **runner_options):
        if depth < 1:
            raise ValueError(f"depth: must be >= 1, got {depth}")
        if max_streams < 1:
            raise ValueError(f"max_streams: must be >= 1, got {max_streams}")
        if use_graphs is None:
            use_graphs = drafter.device.type == "cuda"
        self.drafter, self.depth = drafter, depth
        self.runner = DrafterRunner(drafter, depth, max_streams, use_graphs, **runner_options)
        self.streams: dict[str, _Stream] = {}
        self.free = list(range(max_streams - 1, -1, -1))
        self.evicted: set[str] = set()
        self._clock = 0

    @classmethod
    def load(cls, engine_dir, manifest, target, device, depth: int | None, max_streams: int,
             use_graphs: bool | None = None, attn: str = "dense", **runner_options
             ) -> "PluginDrafterProposer":
        """From an engine folder (`runtime.plugin_loader.load_plugin_drafter`); depth None:
        the drafter's serving_defaults.depth."""
        from ..runtime.plugin_loader import load_plugin_drafter
        model = load_plugin_drafter(engine_dir, manifest, target, device, attn=attn)
        return cls(model, depth or model.config.serving_defaults.depth, max_streams, use_graphs,
                   **runner_options)

    @property
    def num_drafts(self) -> int:
        return self.depth * self.drafter.config.block_size

    def capture_all(self) -> int:
        return self.runner.capture_all()

    # ---- streams -------------------------------------------------------------------------
    def reset(self, request_id: str) -> None:
        """Forget a stream (finished, aborted, or preempted: its prefill is observed again)."""
        self.evicted.discard(request_id)
        st = self.streams.pop(request_id, None)
        if st is not None:
            self.free.append(st.slot)

    def _allocate(self, request_id: str) -> _Stream:
        if not self.free:
            victim = min(self.streams, key=lambda r: self.streams[r].last_used)
            self.reset(victim)
            self.evicted.add(victim)
        slot = self.free.pop()
        self.runner.ring.clear(slot)
        st = self.streams[request_id] = _Stream(slot, last_used=self._clock)
        return st

    @torch.no_grad()
    def observe(self, request_id: str, start: int, taps: torch.Tensor) -> None:
        """Committed positions start .. start + n - 1 with their taps [n, n_taps, Ht]."""
        st = self.streams.get(request_id)
        if st is None:
            if start != 0:
                if request_id in self.evicted:
                    return       # evicted: no drafts until its prefill is observed again
                raise ValueError(f"{request_id}: first observed position is {start}, not 0")
            st = self._allocate(request_id)
        elif start != st.num_positions:
            raise ValueError(f"{request_id}: observed position {start}, expected "
                             f"{st.num_positions}")
        st.last_used = self._clock
        n = int(taps.shape[0])
        if n == 0:
            return
        st.pending.append((start, taps.to(self.drafter.device, torch.bfloat16)))
        st.num_positions += n
        self._trim(st)

    def _trim(self, st: _Stream) -> None:
        """Drop taps no later round needs (before kv_end and before the last context_window
        + 1 positions); merge the pieces when there are many (each pins a step's taps)."""
        need = max(st.kv_end, st.num_positions - 1 - self.drafter.config.context_window)
        kept = []
        for start, t in st.pending:
            end = start + t.shape[0]
            if end <= need:
                continue
            if start < need:
                t, start = t[need - start:], need
            kept.append((start, t))
        if len(kept) > 8:
            kept = [(kept[0][0], torch.cat([t for _, t in kept]))]
        st.pending = kept

    def _rows(self, st: _Stream, lo: int, hi: int) -> list[torch.Tensor]:
        """The taps of positions lo .. hi - 1 as pieces (views)."""
        out = []
        for start, t in st.pending:
            a, b = max(lo, start), min(hi, start + t.shape[0])
            if a < b:
                out.append(t[a - start:b - start])
        if sum(x.shape[0] for x in out) != hi - lo:
            raise RuntimeError(f"drafter: taps of positions {lo}..{hi - 1} are gone")
        return out

    # ---- a round -------------------------------------------------------------------------
    @torch.no_grad()
    def propose_batch(self, items: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
        """Drafts for several streams in one round (`DrafterProposer.propose_batch`).

        items: (request_id, tokens = prompt + output; the newest token is the anchor's next
        token). Streams whose committed positions do not reach the anchor yet get none."""
        out = self.propose_tensors(items)
        if out is None:
            return {}
        ready, drafts, _ = out
        return dict(zip(ready, drafts.tolist()))

    @torch.no_grad()
    def propose_tensors(self, items: list[tuple[str, list[int]]]):
        """`propose_batch` returning (request ids, drafts int64 [S, depth*B], fp32 logits
        [S, depth*B, Vd]) on the device, or None when no stream is ready (tests)."""
        cw = self.drafter.config.context_window
        self._clock += 1
        ready, c_taps, c_next, c_slot, c_pos = [], [], [], [], []
        a_taps, a_next, a_slot, anchors = [], [], [], []
        for rid, tokens in items:
            st = self.streams.get(rid)
            if st is None or st.num_positions != len(tokens) - 1:
                continue
            p = st.num_positions - 1
            lo = max(st.kv_end, p - cw)
            if lo < p:
                c_taps += self._rows(st, lo, p)
                c_next += tokens[lo + 1:p + 1]
                c_slot += [st.slot] * (p - lo)
                c_pos += range(lo, p)
            a_taps += self._rows(st, p, p + 1)
            st.kv_end, st.last_used = p, self._clock
            a_next.append(tokens[p + 1])
            a_slot.append(st.slot)
            anchors.append(p)
            ready.append(rid)
        if not ready:
            return None
        self.runner.commit(c_taps, c_next, c_slot, c_pos)
        for rid in ready:
            self._trim(self.streams[rid])
        drafts, logits = self.runner.propose(a_taps, a_next, a_slot, anchors)
        return ready, drafts, logits


def install_plugin_drafter(engine, attn: str = "dense", capture: bool = True,
                           **runner_options) -> PluginDrafterProposer:
    """Swap an idle `LLMEngine`'s `DrafterProposer` for a `PluginDrafterProposer` of the same
    engine folder, depth and target embedding (tests and benches, until the engine builds it
    itself). Graphs when the engine runs CUDA graphs; capture=True captures them all now.
    Returns the new proposer. Raises ValueError if the engine has no drafter or work in flight.
    """
    spec = engine.speculator
    if spec.drafter is None:
        raise ValueError("speculative: the engine was built without the drafter")
    if engine.scheduler.has_work():
        raise ValueError("install_plugin_drafter needs an idle engine")
    old = spec.drafter
    if isinstance(old, PluginDrafterProposer):     # the engine built one already
        target = DrafterTarget(old.drafter.embed_tokens,
                               torch.empty(engine.config.vocab_size, 0, device="meta"),
                               engine.config.num_hidden_layers)
    else:
        target = old.drafter.target
    use_graphs = engine.device.type == "cuda" and not engine.args.enforce_eager
    new = PluginDrafterProposer.load(engine.manifest.path.parent, engine.manifest, target,
                                     engine.device, old.depth, engine.args.max_num_seqs,
                                     use_graphs, attn=attn, **runner_options)
    if use_graphs and capture:
        new.capture_all()
    spec.drafter = new
    return new
