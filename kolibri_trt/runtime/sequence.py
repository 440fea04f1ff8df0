"""One request's state inside the runtime."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from ..sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"      # not admitted, or preempted (its cache was freed: recompute)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """A stream: prompt, generated tokens and where its K/V live.

    Invariant between steps: the K/V of all tokens but the newest are cached
    (`num_computed == num_tokens - 1` once prefilled); the newest token is the next input.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0                       # tokens whose K/V are in the cache
    full_blocks: list[int] = field(default_factory=list)   # physical blocks, full layers
    ring: list[int] = field(default_factory=list)          # physical blocks, sliding ring
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    # acceptance_method="rejection_sampler": the request's own random stream (seeded lazily)
    generator: torch.Generator | None = field(default=None, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def token_at(self, position: int) -> int:
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < p else self.output_token_ids[position - p]

    @property
    def num_pending(self) -> int:
        """Tokens to feed before the next token can be sampled (>= 1 while running)."""
        return self.num_tokens - self.num_computed

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
