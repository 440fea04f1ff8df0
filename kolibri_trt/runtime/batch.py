"""Building a step's `StepMetadata` from the scheduled streams (flat token layout)."""

from __future__ import annotations

import numpy as np
import torch

from ..model.metadata import StepMetadata
from .scheduler import ScheduledSeq


_NUMPY = {torch.long: np.int64, torch.int32: np.int32}


def build_metadata(scheduled: list[ScheduledSeq], block_size: int, ring_blocks: int,
                   extra_tokens: dict[str, list[int]] | None = None,
                   device: torch.device | str = "cpu", all_rows: bool = False) -> StepMetadata:
    """Lay out the step's tokens and their cache slots.

    extra_tokens[request_id]: draft tokens appended after a stream's newest token (they are
    verified in this pass: every one of their rows gets logits). Rows that need logits: the
    last row of a stream whose chunk reaches its newest token, plus every draft row
    (`all_rows`: every row, for scoring).
    """
    extra = extra_tokens or {}
    ids, pos, full_slots, ring_slots, rows = [], [], [], [], []
    cu, q_lens, seq_lens, tables_full, tables_ring = [0], [], [], [], []
    for item in scheduled:
        seq = item.seq
        drafts = extra.get(seq.request_id, []) if item.samples else []
        n = item.num_tokens + len(drafts)
        positions = range(item.start, item.start + n)
        ids.extend(seq.token_at(p) for p in range(item.start, item.start + item.num_tokens))
        ids.extend(drafts)
        for p in positions:
            b, off = divmod(p, block_size)
            pos.append(p)
            full_slots.append(seq.full_blocks[b] * block_size + off)
            ring_slots.append(seq.ring[b % ring_blocks] * block_size + off)
        if all_rows:
            rows.extend(range(cu[-1], cu[-1] + n))
        elif item.samples:
            first = cu[-1] + item.num_tokens - 1
            rows.extend(range(first, first + 1 + len(drafts)))
        cu.append(cu[-1] + n)
        q_lens.append(n)
        seq_lens.append(item.start + n)
        nblocks = -(-(item.start + n) // block_size)
        tables_full.append(seq.full_blocks[:nblocks])
        tables_ring.append([seq.ring[b % ring_blocks] for b in range(nblocks)])
    width = max(len(t) for t in tables_full)
    cpu = torch.device(device).type == "cpu"

    def t(values, dtype):
        """A tensor of `values` (on the CPU through numpy: a third of torch.tensor's cost)."""
        if cpu:
            return torch.from_numpy(np.array(values, dtype=_NUMPY[dtype]))
        return torch.tensor(values, dtype=dtype, device=device)

    def table(rows_: list[list[int]]) -> torch.Tensor:
        return t([r + [0] * (width - len(r)) for r in rows_], torch.int32)

    return StepMetadata(
        input_ids=t(ids, torch.long), positions=t(pos, torch.long),
        cu_q_lens=t(cu, torch.int32), seq_lens=t(seq_lens, torch.int32),
        full_block_tables=table(tables_full), sliding_block_tables=table(tables_ring),
        full_slots=t(full_slots, torch.long), sliding_slots=t(ring_slots, torch.long),
        logits_rows=t(rows, torch.long), q_lens=tuple(q_lens), seq_lens_host=tuple(seq_lens))
