"""Speculative-decoding counters (vLLM / TensorRT-LLM terms), per request and pooled.

Sources: "copy" (prompt lookup), "drafter_row0" (the block drafter's chain row, position 1 of
each pass), "drafter_rows1+" (its mask rows). The acceptance length tau is tokens committed
per target pass (accepted drafts + the bonus token), pooled over passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SOURCES = ("copy", "drafter_row0", "drafter_rows1+")


@dataclass
class SpecMetrics:
    """Counts. proposed/accepted[source]; per_position_proposed/accepted[i] for draft
    position i + 1; target_passes: decode/verification passes that produced tokens;
    tokens: tokens committed by those passes."""

    proposed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    accepted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    per_position_proposed: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    target_passes: int = 0
    tokens: int = 0

    def record(self, sources: list[str], num_accepted: int, num_committed: int) -> None:
        """One pass for one stream: `sources[i]` made draft i; `num_accepted` drafts kept;
        `num_committed` tokens committed (a stop may commit fewer than num_accepted + 1)."""
        self.target_passes += 1
        self.tokens += num_committed
        for i, src in enumerate(sources):
            if len(self.per_position_proposed) <= i:
                self.per_position_proposed.append(0)
                self.per_position_accepted.append(0)
            self.proposed[src] += 1
            self.per_position_proposed[i] += 1
            if i < num_accepted:
                self.accepted[src] += 1
                self.per_position_accepted[i] += 1

    def merge(self, other: "SpecMetrics") -> None:
        for src in SOURCES:
            self.proposed[src] += other.proposed[src]
            self.accepted[src] += other.accepted[src]
        for i, (p, a) in enumerate(zip(other.per_position_proposed, other.per_position_accepted)):
            if len(self.per_position_proposed) <= i:
                self.per_position_proposed.append(0)
                self.per_position_accepted.append(0)
            self.per_position_proposed[i] += p
            self.per_position_accepted[i] += a
        self.target_passes += other.target_passes
        self.tokens += other.tokens

    @property
    def acceptance_length(self) -> float | None:
        """tau: tokens per target pass."""
        return self.tokens / self.target_passes if self.target_passes else None

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / p if p else 0.0 for p, a in zip(self.per_position_proposed,
                                                   self.per_position_accepted)]

    def summary(self) -> str:
        tau = self.acceptance_length
        rates = " ".join(f"{r:.2f}" for r in self.acceptance_rate_per_position[:8])
        by_src = ", ".join(f"{s} {self.accepted[s]}/{self.proposed[s]}" for s in SOURCES)
        return (f"tau {tau:.2f} tokens/pass over {self.target_passes} passes; accepted/proposed: "
                f"{by_src}; per position: {rates}" if tau is not None else "no target passes")
