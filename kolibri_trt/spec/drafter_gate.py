"""Whether a stream whose copy lookup missed gets a block-drafter round (adaptive drafting).

A drafter round costs about `round_s` seconds of wall time before the target pass; a pass
costs `pass_s`. With drafts, a pass commits 1 + a tokens (a = accepted drafts), without them 1.
So drafting pays for a stream when its expected accepted tokens exceed the round's cost in
target passes:

    E[a] > round_s / pass_s.

Policy "always" drafts on every miss (the seed's copy-first-then-drafter rule). Policy
"adaptive" keeps, per stream, an exponential moving average of the drafts accepted in its
drafter rounds (starting at the optimistic `block` tokens) and, globally, moving averages of
`round_s` and `pass_s` measured by the engine; a stream skips the drafter while its average is
below the ratio, and is probed again after PROBE_EVERY skipped misses, so a stream whose text
turns predictable gets drafts back. Either way the output is unchanged: verification commits
exactly the target's tokens; only how many passes they take changes.
"""

from __future__ import annotations

GATES = ("always", "adaptive")
EMA = 0.25          # weight of the newest observation in every moving average
PROBE_EVERY = 8     # skipped misses after which a stream drafts once more


class DrafterGate:
    """Per-stream drafter decisions. policy: one of GATES; block: drafts a round proposes
    (depth * block_size tokens), the starting estimate of a stream's accepted drafts."""

    def __init__(self, policy: str, block: int):
        if policy not in GATES:
            raise ValueError(f"drafter_gate: must be one of {list(GATES)}, got {policy!r}")
        if block < 1:
            raise ValueError(f"block: must be >= 1, got {block}")
        self.policy, self.block = policy, float(block)
        self.accepted: dict[str, float] = {}   # stream -> EMA of accepted drafts per round
        self.skipped: dict[str, int] = {}      # stream -> misses skipped since its last round
        self.round_s: float | None = None      # EMA of a drafter round's wall seconds
        self.pass_s: float | None = None       # EMA of a target pass's wall seconds

    @property
    def threshold(self) -> float | None:
        """round_s / pass_s (target passes a drafter round costs), None until both measured."""
        if self.round_s is None or not self.pass_s:
            return None
        return self.round_s / self.pass_s

    def wants(self, request_id: str) -> bool:
        """Whether the stream drafts on this miss; records the decision (skip counts)."""
        t = self.threshold
        go = (self.policy == "always" or t is None
              or self.skipped.get(request_id, 0) >= PROBE_EVERY
              or self.accepted.get(request_id, self.block) >= t)
        self.skipped[request_id] = 0 if go else self.skipped.get(request_id, 0) + 1
        return go

    def record_round(self, seconds: float) -> None:
        """Wall seconds of one batched drafter round (`propose_batch`, its sync included)."""
        self.round_s = _ema(self.round_s, seconds)

    def record_pass(self, seconds: float) -> None:
        """Wall seconds of one target pass with its verification and commit."""
        self.pass_s = _ema(self.pass_s, seconds)

    def record_outcome(self, request_id: str, accepted: int) -> None:
        """Drafts accepted in the stream's latest drafter round."""
        self.accepted[request_id] = _ema(self.accepted.get(request_id, self.block), accepted)

    def drop(self, request_id: str) -> None:
        self.accepted.pop(request_id, None)
        self.skipped.pop(request_id, None)


def _ema(old: float | None, new: float) -> float:
    return float(new) if old is None else (1 - EMA) * old + EMA * float(new)
