"""Whether a stream whose copy lookup missed gets a block-drafter round (adaptive drafting).

A whole engine step (proposal, target pass, verification, commit) takes `plain_s` seconds of
wall time when no stream has drafts and `drafted_s` when the drafter ran: the round itself,
what of it the overlap does not hide, and the longer verification. Steps with copy drafts only
are not timed: a miss skipped by the gate becomes a step without drafts, so that is the step
a round must beat (a copy step verifies up to num_speculative_tokens drafts, a costlier pass).
With drafts a stream commits 1 + a tokens (a = accepted drafts) per step, without them 1. So
drafting pays when the expected accepted tokens exceed the extra time in units of plain steps:

    E[a] > (drafted_s - plain_s) / plain_s.

Measuring whole steps, rather than the round's own call, counts every cost the round brings
(on the H200, a round's `propose_batch` took 0.42 ms while the mini's German eval implied
about 0.8 ms per round in all: README, speculative decoding).

Policy "always" drafts on every miss (the seed's copy-first-then-drafter rule). Policy
"adaptive" keeps, per stream, an exponential moving average of the drafts accepted in its
drafter rounds (a new stream starts at the average over all streams' rounds, or at the
optimistic `block` tokens before any round) and, globally, moving averages of
`plain_s` and `drafted_s` measured by the engine; a stream skips the drafter while its average
is below the ratio, and is probed again after PROBE_EVERY skipped misses (which also keeps
`drafted_s` current), so a stream whose text turns predictable gets drafts back; one step in
PLAIN_EVERY (PLAIN_FIRST while `plain_s` was never measured) drafts nothing when every step
would (so `plain_s` gets measured). Either way the
output is unchanged: verification commits exactly the target's tokens; only how many passes
they take changes.
"""

from __future__ import annotations

GATES = ("always", "adaptive")
EMA = 0.25          # weight of the newest observation in every moving average
PROBE_EVERY = 8     # skipped misses after which a stream drafts once more
PLAIN_EVERY = 32    # drafted steps in a row after which one step drafts nothing (plain_s)
PLAIN_FIRST = 8     # the same while plain_s has never been measured


class DrafterGate:
    """Per-step drafter decisions (`decide`). policy: one of GATES; block: drafts a round
    proposes (depth * block_size tokens), the starting estimate of a stream's accepted drafts."""

    def __init__(self, policy: str, block: int):
        if policy not in GATES:
            raise ValueError(f"drafter_gate: must be one of {list(GATES)}, got {policy!r}")
        if block < 1:
            raise ValueError(f"block: must be >= 1, got {block}")
        self.policy, self.block = policy, float(block)
        self.accepted: dict[str, float] = {}   # stream -> EMA of accepted drafts per round
        self.accepted_all: float | None = None  # EMA of accepted drafts per round, all streams
        self.skipped: dict[str, int] = {}      # stream -> misses skipped since its last round
        self.plain_s: float | None = None      # EMA of a step's wall seconds, no drafter
        self.drafted_s: float | None = None    # EMA of a step's wall seconds with a round
        self.drafted_run = 0                   # drafted steps since the last plain one

    @property
    def threshold(self) -> float | None:
        """(drafted_s - plain_s) / plain_s: the plain steps a drafter round costs; None until
        both are measured."""
        if self.plain_s is None or self.drafted_s is None or not self.plain_s:
            return None
        return max(0.0, self.drafted_s - self.plain_s) / self.plain_s

    def decide(self, request_ids: list[str]) -> set[str]:
        """The streams (of those whose copy lookup missed in one step) that draft. "adaptive":
        a stream drafts while its accepted average reaches the threshold (or nothing is
        measured yet), after PROBE_EVERY skipped misses, and never in a plain probe step (one
        after PLAIN_EVERY drafted steps in a row, so that `plain_s` stays measured when every
        step would draft, as in speculative mode "drafter")."""
        if self.policy == "always" or not request_ids:
            return set(request_ids)
        if self.drafted_run >= (PLAIN_EVERY if self.plain_s is not None else PLAIN_FIRST):
            self.drafted_run = 0
            return set()
        t, out = self.threshold, set()
        for rid in request_ids:
            if (t is None or self.skipped.get(rid, 0) >= PROBE_EVERY
                    or self.accepted.get(rid, self.start) >= t):
                out.add(rid)
                self.skipped[rid] = 0
            else:
                self.skipped[rid] = self.skipped.get(rid, 0) + 1
        return out

    def record_step(self, seconds: float, drafted: bool, copy_only: bool = False) -> None:
        """Wall seconds of one engine step; drafted: the drafter's drafts were in it;
        copy_only: only copy drafts were (such a step is not timed)."""
        if copy_only and not drafted:
            return
        if drafted:
            self.drafted_s = _ema(self.drafted_s, seconds)
            self.drafted_run += 1
        else:
            self.plain_s = _ema(self.plain_s, seconds)
            self.drafted_run = 0

    def record_outcome(self, request_id: str, accepted: int) -> None:
        """Drafts accepted in the stream's latest drafter round."""
        self.accepted[request_id] = _ema(self.accepted.get(request_id, self.start), accepted)
        self.accepted_all = _ema(self.accepted_all, accepted)

    @property
    def start(self) -> float:
        """A new stream's estimate of accepted drafts per round: all streams' average so far,
        else `block`."""
        return self.block if self.accepted_all is None else self.accepted_all

    def drop(self, request_id: str) -> None:
        self.accepted.pop(request_id, None)
        self.skipped.pop(request_id, None)


def _ema(old: float | None, new: float) -> float:
    return float(new) if old is None else (1 - EMA) * old + EMA * float(new)
