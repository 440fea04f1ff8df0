"""Per-step metadata of one batched model pass (prefill chunks, decodes and verifications mixed).

Flat token layout: the T tokens of a step are the concatenation of each scheduled stream's new
tokens, in schedule order. Stream s owns rows cu_q_lens[s] .. cu_q_lens[s+1]-1; its new tokens
sit at positions seq_lens[s] - q_len_s .. seq_lens[s] - 1.

Worked example (block size 16): stream A decodes 1 token with 40 cached, stream B verifies
1 + 3 tokens with 10 cached, stream C prefills a first chunk of 5 tokens:
    input_ids   = [a40, b10, b11, b12, b13, c0, c1, c2, c3, c4]        T = 10
    positions   = [40,  10,  11,  12,  13,  0,  1,  2,  3,  4]
    cu_q_lens   = [0, 1, 5, 10]                                          S = 3
    seq_lens    = [41, 14, 5]                 (cached + new: the new K/V are written first)
    logits_rows = [0, 1, 2, 3, 4, 9]          A's token, B's four rows, C's last row
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepMetadata:
    """Everything one forward pass needs besides the weights and the caches."""

    input_ids: torch.Tensor            # int64 [T], device of the model
    positions: torch.Tensor            # int64 [T], position of each token in its stream
    cu_q_lens: torch.Tensor            # int32 [S+1], row offsets of each stream's tokens
    seq_lens: torch.Tensor             # int32 [S], positions in the cache incl. the new ones
    full_block_tables: torch.Tensor    # int32 [S, max_blocks], logical -> physical, full layers
    sliding_block_tables: torch.Tensor  # int32 [S, max_blocks], ring-mapped, sliding layers
    full_slots: torch.Tensor           # int64 [T], physical slot (block*bs + offset) per token
    sliding_slots: torch.Tensor        # int64 [T], same in the sliding layers' ring
    logits_rows: torch.Tensor          # int64 [R], rows of T whose logits are wanted
    q_lens: tuple[int, ...]            # host copy of the S query lengths
    seq_lens_host: tuple[int, ...]     # host copy of seq_lens

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)
