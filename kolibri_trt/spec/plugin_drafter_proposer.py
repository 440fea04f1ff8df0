"""The block drafter's GPU path as a proposer: `PluginDrafterProposer` (the interface of
`DrafterProposer`) over `DrafterRunner` (static buffers, CUDA graphs: `drafter_runner.py`).

Per round (one `propose_batch`) the proposer hands the runner one step (`DrafterRunner.step`):
1. commit: the context rows of every drafting stream's newly committed positions
   (kv_end .. p - 1, at most context_window back; what `DrafterProposer._extend_context`
   does per stream) -> one write into the ring (`DrafterPlugin.commit`);
2. round: `depth` passes for all drafting streams (`DrafterPlugin.propose`).
The taps of every observed position sit in the runner's taps history (`DrafterRunner.history`,
one block of rows per ring slot), written by the target's passes themselves (the engine's
`PluginRunner.use_taps_sink`: rows from `taps_dst`) or by `observe` from a taps tensor; a round
names rows of it. Host work per round: one pass over the ready streams (constant per stream
but for the ints of its commit rows: next ids, slots, positions, history rows), one index
upload, one graph replay (commit and round merged; two after a long commit), and, when the
host wants the drafts (`collect`, `propose_batch`), one copy of them back, the round's only
sync. Drafts left on the device (`deferred`) need no copy of their own: the engine reads them
with the verification's tokens (`discard` then ends the round).

Streams map to ring slots, allocated at a stream's first position (`taps_dst` or `observe`
from position 0) and freed by `reset`; when every slot is taken the least recently used
stream is evicted (it gets no drafts until its prefill is observed again). Use counts rounds
and observations, so a preempted stream that has not come back goes before a running one.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..drafter import DrafterTarget
from ..drafter.plugin_drafter import DrafterPlugin
from .drafter_chain import ChainedRound
from .deferred_drafts import DeferredDrafts
from .drafter_proposer import StreamKeys
from .drafter_runner import L_BUCKETS, MIN_COMMIT, DrafterRunner  # noqa: F401  (re-exported)

# Rounds on a CUDA stream of their own (True) or on the caller's current stream (False, the
# default). A round is launched after a step's host sync, when the target's stream is idle,
# and the next target pass needs its drafts, so its own stream overlaps nothing; it cost host
# time: each of the round's two graph replays 27-33 µs on its own stream against 5 µs on the
# current one, the target's next replay 12 against 6 µs (H200, bench/launch_costs.py:
# bench/results/h200-2026-11-30d/m_launch_costs.log). Benches flip it (--drafter-stream).
OWN_STREAM = False


@dataclass
class _Stream:
    """One stream's drafter state: its ring slot, the positions observed (0 .. num_positions
    - 1; their taps are in the runner's history) and kv_end (context rows of positions <
    kv_end are in the ring)."""

    slot: int
    num_positions: int = 0
    kv_end: int = 0
    last_used: int = 0


class PluginDrafterProposer:
    """Proposes depth * block_size drafts per stream through `DrafterRunner` (the interface
    of `DrafterProposer`: `propose_batch`, `observe`, `reset`, `num_drafts`, `drafter`).

    drafter: the `DrafterPlugin`; depth: passes per round; max_streams: ring slots (streams
    with drafter state at once; the engine's max_num_seqs); use_graphs: CUDA graphs (None:
    on a CUDA model); keyed: the heads pick with the ring's per-slot tables
    (`DrafterPlugin.keyed`, set before any graph is captured: coupled drafts, `set_sampling`);
    runner_options: `DrafterRunner`'s max_commit, length_buckets, max_model_len (the
    engine's: the RoPE table covers its positions).
    """

    def __init__(self, drafter: DrafterPlugin, depth: int, max_streams: int,
                 use_graphs: bool | None = None, keyed: bool = False, **runner_options):
        if depth < 1:
            raise ValueError(f"depth: must be >= 1, got {depth}")
        if max_streams < 1:
            raise ValueError(f"max_streams: must be >= 1, got {max_streams}")
        if use_graphs is None:
            use_graphs = drafter.device.type == "cuda"
        self.drafter, self.depth = drafter, depth
        drafter.keyed = keyed
        self.runner = DrafterRunner(drafter, depth, max_streams, use_graphs, **runner_options)
        self.streams: dict[str, _Stream] = {}
        # CUDA and OWN_STREAM: the rounds' own stream (else the caller's current stream)
        self.stream = torch.cuda.Stream(drafter.device) \
            if drafter.device.type == "cuda" and OWN_STREAM else None
        self._inflight: tuple[list[str | None], torch.Tensor] | None = None
        self.chained: ChainedRound | None = None     # `enable_chain`
        # the last chained round: its streams in row order, its drafts, the streams observed
        # since (their anchors now known on the host: kv_end set), its streams as a set
        self._chain: tuple[list[str], torch.Tensor, set[str], set[str]] | None = None
        self.rounds_chained = 0                      # launches served by a chained round
        self._views: dict[torch.Size, tuple[torch.Tensor, torch.Tensor]] = {}   # `deferred`
        self.keys = StreamKeys()                     # `set_sampling`
        self.free = list(range(max_streams - 1, -1, -1))
        self.evicted: set[str] = set()
        self._clock = 0

    @classmethod
    def load(cls, engine_dir, manifest, target, device, depth: int | None, max_streams: int,
             use_graphs: bool | None = None, attn: str = "dense", **runner_options
             ) -> "PluginDrafterProposer":
        """From an engine folder (`runtime.plugin_loader.load_plugin_drafter`); depth None:
        the drafter's serving_defaults.depth; runner_options: `keyed` and the runner's."""
        from ..runtime.plugin_loader import load_plugin_drafter
        model = load_plugin_drafter(engine_dir, manifest, target, device, attn=attn)
        return cls(model, depth or model.config.serving_defaults.depth, max_streams, use_graphs,
                   **runner_options)

    @property
    def num_drafts(self) -> int:
        return self.depth * self.drafter.config.block_size

    def capture_all(self) -> int:
        """Capture the runner's graphs and, with `enable_chain`, the chain graphs."""
        count = self.runner.capture_all()
        return count + (self.chained.capture_all() if self.chained is not None else 0)

    # ---- streams -------------------------------------------------------------------------
    def reset(self, request_id: str) -> None:
        """Forget a stream (finished, aborted, or preempted: its prefill is observed again)."""
        self.evicted.discard(request_id)
        st = self.streams.pop(request_id, None)
        if st is not None:
            self.free.append(st.slot)

    def set_sampling(self, request_id: str, keys: tuple[float, int, int] | None) -> None:
        """How the stream's heads pick (with `DrafterPlugin.keyed`): keys = (temperature > 0,
        seed_key, base) of its coupled drafts (`DrafterRing.set_keys`), or None: greedy (and
        forgotten). Kept across `reset` (a preempted stream keeps its sampling)."""
        self.keys.set(request_id, keys)
        if request_id in self.streams:
            with self._on_stream():
                self.runner.ring.set_keys(self.streams[request_id].slot, *self.keys.of(request_id))

    def _allocate(self, request_id: str) -> _Stream:
        if not self.free:
            victim = min(self.streams, key=lambda r: self.streams[r].last_used)
            self.reset(victim)
            self.evicted.add(victim)
        slot = self.free.pop()
        with self._on_stream():                # after any round still writing the ring
            self.runner.ring.clear(slot)
            self.runner.ring.set_keys(slot, *self.keys.of(request_id))
        st = self.streams[request_id] = _Stream(slot, last_used=self._clock)
        return st

    def taps_dst(self, request_id: str, start: int, n: int) -> list[int]:
        """History rows (`DrafterRunner.history`) where a target pass writes the taps of the
        stream's positions start .. start + n - 1, -1 for rows not kept (`history_dst`), before
        `observe(request_id, start, n=...)` counts them. From position 0 the stream (re)starts:
        a slot is allocated (a stream seen before is reset first: a preemption recomputes);
        a stream without a slot (evicted) gets -1 everywhere."""
        if start == 0:
            self.reset(request_id)
            st = self._allocate(request_id)
        else:
            st = self.streams.get(request_id)
        return self.runner.history_dst(None if st is None else st.slot, start, n)

    @torch.no_grad()
    def observe(self, request_id: str, start: int, taps: torch.Tensor | None = None,
                n: int | None = None) -> None:
        """Committed positions start .. start + n - 1: with taps [n, n_taps, Ht] (written into
        the history here), or without (n given: the target's pass wrote them, `taps_dst`).
        Raises ValueError for a position out of order or a stream first seen past 0."""
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
        if taps is not None:
            n = int(taps.shape[0])
            if n:
                with self._on_stream():
                    self.runner.write_history(st.slot, start, taps.to(
                        self.drafter.device, torch.bfloat16))
        st.num_positions += n
        if self._chain is not None and request_id in self._chain[3] \
                and request_id not in self._chain[2]:
            st.kv_end = st.num_positions - 1     # the chained round's anchor: start + accepted
            self._chain[2].add(request_id)

    # ---- a round -------------------------------------------------------------------------
    @torch.no_grad()
    def propose_batch(self, items: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
        """Drafts for several streams in one round (`DrafterProposer.propose_batch`).

        items: (request_id, tokens = prompt + output; the newest token is the anchor's next
        token). Streams whose committed positions do not reach the anchor yet get none. The
        round computes no logits (`DrafterRunner.step`). `launch` then `collect`."""
        self.launch(items)
        return self.collect()

    @torch.no_grad()
    def launch(self, items: list[tuple[str, list[int]]]) -> None:
        """Start the round of `items` (`propose_batch`'s) without waiting for it: on CUDA it
        runs on the current stream, or with OWN_STREAM on the proposer's own (after what the
        current stream has enqueued, e.g. the target pass whose taps it reads), so it overlaps
        the host's next work; `collect` returns its drafts. A round launched and never
        collected is superseded: its commit rows stay (the stream's state advanced), its
        drafts go unread. When every stream of `items` was in the last chained round (`chain`)
        and observed since, that round is the launch: nothing is enqueued."""
        chain, self._chain = self._chain, None
        if chain is not None and items and all(rid in chain[2] for rid, _ in items):
            self._clock += 1
            for rid, _ in items:
                self.streams[rid].last_used = self._clock
            keep = {rid for rid, _ in items}
            self._inflight = ([r if r in keep else None for r in chain[0]], chain[1])
            self.rounds_chained += 1
            return
        batch = self._collect(items)
        if batch is None:
            self._inflight = None
            return
        ready, commit, rnd = batch
        with self._on_stream():
            drafts, _ = self.runner.step(commit, rnd)
        self._inflight = (ready, drafts)

    def enable_chain(self, max_drafts: int, max_tokens: int,
                     inputs: torch.Tensor | None = None) -> None:
        """Allow `chain` (max_drafts: drafts of one stream per step; max_tokens: token rows of
        one step, the target runner's; inputs: where the target's graphs keep the step's
        input ids, read in place: `ChainedRound.use_inputs`)."""
        self.chained = ChainedRound(self.runner, max_drafts, max_tokens)
        if inputs is not None:
            self.chained.use_inputs(inputs)

    @torch.no_grad()
    def chain(self, items: list[tuple[str, int, int, int]], own: torch.Tensor,
              inputs: torch.Tensor) -> None:
        """Enqueue the round that follows the step being verified (`drafter_chain.py`), for the
        streams of items = (request id, first row in the step, start position, drafts) whose
        last round was anchored at start - 1 (others are left to `launch`); own int64 [T]:
        the target's own token per row, inputs: the step's input ids (device). Its drafts
        serve the next `launch` of these streams once `observe` has seen them. Needs
        `enable_chain`. A step whose input ids are not where the chain graphs read them
        (`ChainedRound.reads`: an eager step) chains nothing. Raises ValueError as
        `ChainedRound.launch`."""
        self._chain = None
        if not self.chained.reads(inputs):
            return
        rows, ids = [], []
        for rid, row0, start, k in items:
            st = self.streams.get(rid)
            if st is not None and st.num_positions == start and st.kv_end == start - 1:
                ids.append(rid)
                rows.append((row0, k, start, st.slot))
        if not ids:
            return
        with self._on_stream():
            drafts = self.chained.launch(rows, own, inputs)
        self._chain = (ids, drafts, set(), set(ids))

    def drop_chain(self) -> None:
        """Forget the last chained round (no `launch` took it)."""
        self._chain = None

    @property
    def has_chain(self) -> bool:
        """Whether a chained round waits for a `launch` to take it (or `drop_chain`)."""
        return self._chain is not None

    def deferred(self) -> DeferredDrafts | None:
        """The last `launch`'s drafts on the device without waiting for them (None when it had
        no ready stream or was collected); `collect` still returns them on the host."""
        if self._inflight is None:
            return None
        ready, drafts = self._inflight
        views = self._views.get(drafts.shape)   # views of drafts_out made once per shape
        if views is None:                        # (torch ops are host time on the hot path)
            flat = self.runner.drafts_out[:drafts.numel()]
            views = self._views[drafts.shape] = (flat.view(drafts.shape), flat)
        return DeferredDrafts(list(ready), views[0], self.stream, views[1])

    def collect(self) -> dict[str, list[int]]:
        """The drafts of the last `launch` on the host, by request id: one copy from the
        device (on the round's stream, after it) and a wait for it, the round's one host
        sync; {} when it had no ready stream or was collected or discarded already."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return {}
        ready, drafts = inflight
        with self._on_stream():
            host = self.runner.start_read(drafts)
        return {r: d for r, d in zip(ready, self.runner.finish_read(host)) if r is not None}

    def discard(self) -> None:
        """End the last `launch`'s round without reading its drafts here (the caller read
        them from the device: `deferred`)."""
        self._inflight = None

    @contextmanager
    def _on_stream(self):
        """Enqueue on the proposer's stream (CUDA), after the current stream's work so far
        (the target pass that wrote the taps). CPU: nothing changes."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield

    @torch.no_grad()
    def propose_tensors(self, items: list[tuple[str, list[int]]]):
        """`propose_batch` returning (request ids, drafts int64 [S, depth*B], fp32 logits
        [S, depth*B, Vd]) on the device, or None when no stream is ready (tests)."""
        batch = self._collect(items)
        if batch is None:
            return None
        ready, *inputs = batch
        with self._on_stream():
            drafts, logits = self.runner.step(*inputs, logits=True)
        if self.stream is not None:        # the caller reads them on its stream
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        return ready, drafts, logits

    def _collect(self, items: list[tuple[str, list[int]]]):
        """The round's inputs for `DrafterRunner.step`: (ready ids, commit fields, round
        fields), or None when no stream is ready. Marks each ready stream's context rows
        committed (kv_end = p)."""
        cw, row = self.drafter.config.context_window, self.runner.history_row
        self._clock += 1
        ready = []
        commit: tuple = ([], [], [], [])        # next ids, slots, positions, history rows
        rnd: tuple = ([], [], [], [])           # next ids, slots, anchors, history rows
        for rid, tokens in items:
            st = self.streams.get(rid)
            if st is None or st.num_positions != len(tokens) - 1:
                continue
            p, slot = st.num_positions - 1, st.slot
            lo = max(st.kv_end, p - cw)
            if p > lo:                          # commit rows lo .. p - 1
                commit[0].extend(tokens[lo + 1:p + 1])
                commit[1].extend([slot] * (p - lo))
                commit[2].extend(range(lo, p))
                commit[3].extend(row(slot, q) for q in range(lo, p))
            for f, v in zip(rnd, (tokens[p + 1], slot, p, row(slot, p))):
                f.append(v)
            st.kv_end, st.last_used = p, self._clock
            ready.append(rid)
        return (ready, commit, rnd) if ready else None


def install_plugin_drafter(engine, attn: str = "dense", capture: bool = True,
                           **runner_options) -> PluginDrafterProposer:
    """Swap an idle `LLMEngine`'s `DrafterProposer` for a `PluginDrafterProposer` of the same
    engine folder, depth and target embedding (tests and benches, until the engine builds it
    itself). Graphs when the engine runs CUDA graphs; capture=True captures them all now;
    runner_options: `DrafterRunner`'s (max_model_len: the engine's unless given).
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
    runner_options.setdefault("max_model_len", engine.args.max_model_len)
    runner_options.setdefault("step_tokens", 1 + engine.args.num_speculative_tokens)
    runner_options.setdefault("keyed", spec.coupled)
    new = PluginDrafterProposer.load(engine.manifest.path.parent, engine.manifest, target,
                                     engine.device, old.depth, engine.args.max_num_seqs,
                                     use_graphs, attn=attn, **runner_options)
    sink = getattr(engine.runner, "taps_sink", None)
    if isinstance(old, PluginDrafterProposer) and sink is old.runner.history:
        new.runner.share_history(sink)     # the target's passes write the history
    if use_graphs and capture:
        new.capture_all()
    spec.drafter = new
    return new
