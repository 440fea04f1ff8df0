"""Shared fixtures: small seeded Kolibri-1 configs and models built by the project itself."""

from __future__ import annotations

import pytest
import torch

# One intra-op thread: the suite's tensors are tiny, and on a loaded 2-core machine OpenMP's
# spinning threads made some tests over 100x slower (seen: 188 s vs 1.2 s for one generate).
torch.set_num_threads(1)

from kolibri_trt.fixtures import random_drafter, random_target, tiny_drafter_config

from model_configs import micro_target_config


@pytest.fixture(scope="session")
def micro_target():
    return random_target(micro_target_config(), seed=11, dtype=torch.float32)


@pytest.fixture(scope="session")
def micro_drafter(micro_target):
    cfg = tiny_drafter_config(micro_target.config, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, intermediate_size=48, predecessor_rank=8,
                              spine_rank=8, draft_vocab_size=200, context_window=6)
    return random_drafter(cfg, micro_target, seed=12, dtype=torch.float32)


# session fixtures of the build tests (a built engine and its checkpoints), shared by their
# files; imported last because test_build_support imports micro_target_config
from test_build_support import build_ckpt, built_engine, test_recipes  # noqa: E402,F401
