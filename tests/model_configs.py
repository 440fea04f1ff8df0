"""Small model configs shared by the tests (a module, not conftest: tests/plugins has its own
conftest, and two modules named `conftest` cannot both be imported by name)."""

from __future__ import annotations

from pathlib import Path

from kolibri_trt.config import FULL, SLIDING
from kolibri_trt.fixtures import tiny_target_config

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
