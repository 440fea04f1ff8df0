"""Continuous batching: block accounting, admission, chunked prefill and preemption.

Each step every running stream gets the tokens it still has to feed (1 for a decode, the
rest of its prompt for a prefill, cut to the step's token budget: chunked prefill), oldest
first; waiting streams are admitted FIFO while there is room. When a running stream needs a
full-layer block and none is free, the most recently admitted stream is preempted: its blocks
are freed and it waits at the head of the queue to be recomputed later (nothing is lost; the
row-invariant numerics make the recomputed cache identical).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .kv_cache import CacheGeometry
from .sequence import Sequence, Status


class BlockManager:
    """Free lists of the two pools. Each admitted stream owns `ring_blocks` sliding blocks and
    ceil(positions / block_size) full blocks."""

    def __init__(self, geometry: CacheGeometry):
        self.geometry = geometry
        self.free_full = list(range(geometry.num_full_blocks - 1, -1, -1))
        self.free_sliding = list(range(geometry.num_sliding_blocks - 1, -1, -1))

    def full_blocks_for(self, positions: int) -> int:
        return -(-positions // self.geometry.block_size)

    def can_admit(self, positions: int) -> bool:
        return (len(self.free_sliding) >= self.geometry.ring_blocks
                and len(self.free_full) >= self.full_blocks_for(positions))

    def admit(self, seq: Sequence) -> None:
        seq.ring = [self.free_sliding.pop() for _ in range(self.geometry.ring_blocks)]

    def grow(self, seq: Sequence, positions: int) -> bool:
        """Give `seq` full blocks for `positions` positions; False (nothing taken) if short."""
        need = self.full_blocks_for(positions) - len(seq.full_blocks)
        if need > len(self.free_full):
            return False
        seq.full_blocks.extend(self.free_full.pop() for _ in range(max(0, need)))
        return True

    def free(self, seq: Sequence) -> None:
        self.free_full.extend(reversed(seq.full_blocks))
        self.free_sliding.extend(reversed(seq.ring))
        seq.full_blocks, seq.ring = [], []

    @property
    def num_used_full(self) -> int:
        return self.geometry.num_full_blocks - len(self.free_full)


@dataclass(frozen=True)
class ScheduledSeq:
    """A stream in this step: feed tokens at positions start .. start + num_tokens - 1."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the newest token: its last row gives the next token."""
        return self.start + self.num_tokens == self.seq.num_tokens


class Scheduler:
    """FIFO admission, oldest-first service, newest-first preemption."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, extra_tokens: dict[str, int] | None = None) -> list[ScheduledSeq]:
        """Pick this step's work. `extra_tokens[request_id]` asks for room for that many more
        positions after the newest token (draft tokens to verify); returns the scheduled streams."""
        extra = extra_tokens or {}
        budget, out = self.max_num_batched_tokens, []
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget <= 0:
                continue
            n = min(seq.num_pending, budget)
            room = extra.get(seq.request_id, 0) if n == seq.num_pending else 0
            if not self._grow_or_preempt(seq, seq.num_computed + n + room):
                continue
            out.append(ScheduledSeq(seq, seq.num_computed, n))
            budget -= n + room
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.num_pending, budget)
            if not self.blocks.can_admit(seq.num_computed + n):
                break
            self.waiting.popleft()
            self.blocks.admit(seq)
            self.blocks.grow(seq, seq.num_computed + n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.append(ScheduledSeq(seq, seq.num_computed, n))
            budget -= n
        return out

    def _grow_or_preempt(self, seq: Sequence, positions: int) -> bool:
        while not self.blocks.grow(seq, positions):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free `seq`'s cache and queue it first for recomputation (prompt + its outputs)."""
        self.blocks.free(seq)
        self.running.remove(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        seq.status = Status.FINISHED
