"""The proposal policy of a step: copy first, the block drafter on a miss (seed 000).

Modes: "off" (no drafts), "copy", "drafter", "copy+drafter". Proposals are made before the
step's single target pass; after verification only committed tokens (and the taps of
committed positions) reach the copy index and the drafter's state.
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams, seed_key
from .copy_proposer import CopyIndex
from .drafter_gate import DrafterGate
from .drafter_proposer import DrafterProposer
from .deferred_drafts import DeferredDrafts

MODES = ("off", "copy", "drafter", "copy+drafter")


class Speculator:
    """Per-stream proposers. `limit` caps the drafts of one pass (copy and drafter);
    `gate`: when a stream without a copy draft gets a drafter round (`drafter_gate.GATES`);
    `overlap`: the engine calls `prefetch` after each step, which starts the next step's
    drafter round at once for the streams that will need it (their copy lookup, a pure
    function of the committed tokens, misses now as it will then; the gate agrees), on a
    proposer with `launch` / `collect` (`PluginDrafterProposer`: asynchronous on CUDA), so
    the round runs while the host prepares the next step; `propose_all` waits for it, unless
    `defer`: then the drafter's drafts stay on the device (`DeferredDrafts`, `take_deferred`):
    `propose_all` returns placeholders (zeros) for them, the target pass reads the real ones
    on the device, and the engine reads them at verification, in the copy of the target's
    tokens (`discard_deferred`; `resolve_deferred` reads them alone). `chain` (with `defer`):
    the engine hands `chain` each step's candidates while it verifies the step, and the
    drafter enqueues their next round on the device right then (`drafter_chain.py`); the
    prefetch then takes that round instead of launching one. `coupled`: a sampled stream's
    drafter drafts are picked with the target sampler's position-keyed noise (`add`)."""

    def __init__(self, mode: str, drafter: DrafterProposer | None, limit: int,
                 min_ngram: int = 2, max_ngram: int = 4, gate: str = "always",
                 overlap: bool = False, defer: bool = False, chain: bool = False,
                 coupled: bool = False):
        if mode not in MODES:
            raise ValueError(f"speculative: must be one of {list(MODES)}, got {mode!r}")
        if "drafter" in mode and drafter is None:
            raise ValueError(f"speculative={mode!r} needs a drafter in the engine")
        if limit < 1:
            raise ValueError(f"num_speculative_tokens: must be >= 1, got {limit}")
        self.mode, self.drafter, self.limit = mode, drafter, limit
        self.ngram = (min_ngram, max_ngram)
        self.gate = DrafterGate(gate, drafter.num_drafts if drafter is not None else 1)
        if overlap and not hasattr(drafter, "launch"):
            raise ValueError("drafter_overlap: needs the drafter's kernel path "
                             "(PluginDrafterProposer)")
        self.overlap = overlap and self.needs_taps
        if defer and "drafter" in mode and not hasattr(drafter, "deferred"):
            raise ValueError("drafts_on_device: needs the drafter's kernel path "
                             "(PluginDrafterProposer)")
        self.defer = defer and self.needs_taps
        if chain and not (self.defer and self.overlap):
            raise ValueError("drafter_chain: needs drafter_overlap and drafts_on_device on the "
                             "drafter's kernel path")
        self.chain_rounds = chain
        self.coupled = coupled and self.needs_taps
        self.deferred: DeferredDrafts | None = None   # the last propose_all's, until taken
        self.prefetched: set[str] | None = None   # streams of the round in flight
        self.prefetch_seen: set[str] = set()      # streams `prefetch` decided on
        self.copy: dict[str, CopyIndex] = {}

    @property
    def needs_taps(self) -> bool:
        return self.drafter is not None and "drafter" in self.mode

    def add(self, request_id: str, prompt: list[int],
            params: SamplingParams | None = None) -> None:
        """A new stream. With `coupled` and params sampling (temperature > 0), its drafter
        picks argmax of logits / T plus the Gumbel noise the target's sampler draws at each
        draft's output position (`kolibri_trt_plugins.vocab_argmax`: the same noise, so the
        draft equals the target's sampled token far more often than the drafter's greedy
        token does; verification, and so the output, are unchanged)."""
        if "copy" in self.mode:
            self.copy[request_id] = CopyIndex(*self.ngram)
            self.copy[request_id].extend(prompt)
        if self.coupled and params is not None and not params.greedy:
            # a block row at position q drafts the token at q + 2: output position q + 2 - len
            self.drafter.set_sampling(request_id, (float(params.temperature),
                                                   seed_key(params.resolved_seed),
                                                   len(prompt) - 2))

    def drop(self, request_id: str) -> None:
        self.copy.pop(request_id, None)
        self.gate.drop(request_id)
        if self.drafter is not None:
            self.drafter.reset(request_id)
            if self.coupled:
                self.drafter.set_sampling(request_id, None)

    def propose_all(self, items: list[tuple[str, list[int], int]]
                    ) -> dict[str, tuple[list[int], list[str]]]:
        """Drafts for every stream of the round: items are (request_id, tokens = prompt +
        output, room = most drafts allowed). Copy drafts first; the streams that got none
        are drafted by the block drafter together, in one batched pass per depth step.
        Returns request_id -> (drafts, source of each draft), for streams with drafts. A
        prefetched round counts for this call only."""
        pre, self.prefetched = self.prefetched, None
        self.deferred = None
        seen, self.prefetch_seen = self.prefetch_seen, set()
        out, cands = {}, []
        for rid, tokens, room in items:
            k = min(self.limit, room)
            if self.mode == "off" or k <= 0:
                continue
            drafts = self.propose_copy(rid, tokens, k)
            if drafts:
                out[rid] = (drafts, ["copy"] * len(drafts))
            elif self.needs_taps:
                cands.append((rid, tokens, k))
        go = self.gate.decide([rid for rid, _, _ in cands if rid not in seen])
        misses = [c for c in cands if (c[0] in pre if c[0] in seen else c[0] in go)]
        if not misses and self.chain_rounds:
            self.drafter.drop_chain()        # a chained round no stream takes (copy hit)
        if misses:
            b = self.drafter.drafter.config.block_size
            proposals = self._drafter_round(misses, pre)
            for rid, _, k in misses:
                drafts = proposals.get(rid, [])[:k]
                if drafts:
                    out[rid] = (drafts, ["drafter_row0" if i % b == 0 else "drafter_rows1+"
                                         for i in range(len(drafts))])
        return out

    def _drafter_round(self, misses: list[tuple[str, list[int], int]],
                       pre: set[str] | None) -> dict[str, list[int]]:
        """The drafter's drafts for `misses`: the prefetched round's (streams `pre`) where it
        covers them (waiting for it), a round now for the others. With `defer`, the last
        round's are left on the device (`self.deferred`) and come back as zeros."""
        covered = bool(pre) and any(r in pre for r, _, _ in misses)
        rest = [(rid, tokens) for rid, tokens, _ in misses if not pre or rid not in pre]
        if not self.defer:
            got = self.drafter.collect() if covered else {}
            if rest:
                got.update(self.drafter.propose_batch(rest))
            return got
        got = {}
        if rest:     # the prefetched round (if any) is read now, the new one deferred
            got = self.drafter.collect() if covered else {}
            self.drafter.launch(rest)
        self.deferred = self.drafter.deferred()
        if self.deferred is not None:
            n = int(self.deferred.drafts.shape[1])
            got.update((rid, [0] * n) for rid in self.deferred.request_ids if rid is not None)
        return got

    def chain(self, items: list[tuple[str, int, int, int]], own: torch.Tensor,
              inputs: torch.Tensor) -> None:
        """While a step is verified (`chain_rounds`): enqueue the next round of the streams
        of items = (request id, first row, start position, drafts) on the device
        (`PluginDrafterProposer.chain`); own: the target's own token per row; inputs: the
        step's input ids on the device."""
        if self.chain_rounds and items:
            self.drafter.chain(items, own, inputs)

    def take_deferred(self) -> DeferredDrafts | None:
        """The drafts `propose_all` left on the device (None if it left none), once."""
        out, self.deferred = self.deferred, None
        return out

    def resolve_deferred(self) -> dict[str, list[int]]:
        """The host copy of the deferred round's drafts (`take_deferred`'s), by request id:
        one copy from the device and a wait for it."""
        return self.drafter.collect()

    def discard_deferred(self) -> None:
        """The deferred round's drafts were read from the device (with the verification's
        tokens): end the round without a host copy of its own."""
        self.drafter.discard()

    def wants_prefetch(self) -> bool:
        """Whether `prefetch` has work after this step: overlap on, and no chained round
        waits (the next `propose_all` takes that one in its launch, or drops it: the lookups
        and the gate run once, there)."""
        return self.overlap and not (self.chain_rounds and self.drafter.has_chain)

    def prefetch(self, items: list[tuple[str, list[int], int]]) -> None:
        """After a step (overlap only): start the next step's drafter round, without waiting,
        for the streams of `items` (propose_all's) whose copy lookup misses and whose gate
        says draft: exactly those `propose_all` will draft next (nothing changes between)."""
        if not self.overlap:
            return
        cands = []
        for rid, tokens, room in items:
            k = min(self.limit, room)
            if k > 0 and not self.propose_copy(rid, tokens, k):
                cands.append((rid, tokens))
        go = self.gate.decide([rid for rid, _ in cands])
        ready = [(rid, tokens) for rid, tokens in cands if rid in go]
        if ready:
            self.drafter.launch(ready)
        elif self.chain_rounds:
            self.drafter.drop_chain()
        self.prefetched = {rid for rid, _ in ready}
        self.prefetch_seen = {rid for rid, _, _ in items}

    def propose_copy(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        """Copy drafts for one stream (up to k), or [] on a miss or without copy drafting."""
        return self.copy[request_id].propose(k) if "copy" in self.mode else []

    def record_outcome(self, request_id: str, sources: list[str], accepted: int) -> None:
        """After verification: `accepted` of the stream's drafts (their sources) were taken."""
        if sources and sources[0].startswith("drafter"):
            self.gate.record_outcome(request_id, accepted)

    def record_step(self, seconds: float, drafted: bool, copy_only: bool = False) -> None:
        """Wall seconds of a whole engine step; drafted: some stream verified drafter drafts
        in it (the gate's cost measure); copy_only: only copy drafts were."""
        self.gate.record_step(seconds, drafted, copy_only)

    def observe(self, request_id: str, start: int, taps: torch.Tensor | None,
                committed: list[int], written: int = 0) -> None:
        """Positions start.. were processed and are committed: their taps [n, n_taps, H], or
        (taps None) `written` positions whose taps the target's pass wrote into the drafter's
        history (`PluginDrafterProposer.taps_dst`, which also restarted the stream at 0);
        `committed` are the tokens newly appended to the stream."""
        if request_id in self.copy:
            self.copy[request_id].extend(committed)
        if not self.needs_taps:
            return
        if taps is not None and taps.shape[0]:
            if start == 0:
                self.drafter.reset(request_id)   # a (re)started prefill: preemption recomputes
            self.drafter.observe(request_id, start, taps)
        elif written:
            self.drafter.observe(request_id, start, n=written)
