"""Shared fixtures: small seeded Kolibri-1 configs and models built by the project itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kolibri_trt.config import FULL, SLIDING
from kolibri_trt.fixtures import random_drafter, random_target, tiny_drafter_config, tiny_target_config

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def micro_target_config(**overrides):
    """A fast config: 5 layers (4 sliding + 1 full), tiny widths, window shorter than tests'
    sequences, vocab 512 (no tokenizer needed)."""
    fields = dict(vocab_size=512, hidden_size=64, num_hidden_layers=5, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, sliding_window=7, num_experts=6,
                  num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=24)
    fields.update(overrides)
    if "layer_types" not in overrides:
        n = fields["num_hidden_layers"]
        fields["layer_types"] = tuple(FULL if i % 5 == 4 else SLIDING for i in range(n))
    return tiny_target_config(**fields)


@pytest.fixture(scope="session")
def micro_target():
    return random_target(micro_target_config(), seed=11, dtype=torch.float32)


@pytest.fixture(scope="session")
def micro_drafter(micro_target):
    cfg = tiny_drafter_config(micro_target.config, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, intermediate_size=48, predecessor_rank=8,
                              spine_rank=8, draft_vocab_size=200, context_window=6)
    return random_drafter(cfg, micro_target, seed=12, dtype=torch.float32)
