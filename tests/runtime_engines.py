"""Small engines for runtime tests: a random target with the real tokenizer (vocab 2000)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kolibri_trt.config import FULL, SLIDING
from kolibri_trt.fixtures import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from kolibri_trt.tokenizer import write_tekken_tokenizer

VOCAB = 2000
GROUPS = ("attention", "experts", "shared_expert", "router", "embedding", "norms", "lm_head")


def small_target(window: int = 24):
    """5 layers (4 sliding + 1 full), hidden 64, 2 query / 1 KV heads of 128, vocab 2000."""
    cfg = tiny_target_config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=5,
                             layer_types=(SLIDING,) * 4 + (FULL,), num_attention_heads=2,
                             num_key_value_heads=1, head_dim=128, sliding_window=window,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32)
    return random_target(cfg, seed=21)


def small_drafter(target):
    """A block drafter for `small_target` (2 heads of 128, block 4, context window 32)."""
    cfg = tiny_drafter_config(target.config, num_attention_heads=1, num_key_value_heads=1,
                              intermediate_size=96, predecessor_rank=16, spine_rank=16,
                              draft_vocab_size=1500, context_window=32)
    return random_drafter(cfg, target, seed=22)


def write_bf16_engine(folder: Path, model, drafter=None) -> Path:
    """An unquantized engine (bf16 weights, bf16 KV cache) in the engine format."""
    model.save_pretrained(folder / "target")
    write_tekken_tokenizer(folder / "target", vocab_size=model.config.vocab_size)
    weights = {"target": {g: "bf16" for g in GROUPS}}
    if drafter is not None:
        drafter.save_pretrained(folder / "drafter")
        weights["drafter"] = {"body": "bf16", "head": "bf16"}
    manifest = {"schema_version": 1, "weights": weights,
                "kv_cache": {"sliding": "bf16", "full": "bf16"}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def reference_of(folder: Path):
    from kolibri_trt import KolibriForCausalLM
    return KolibriForCausalLM.from_pretrained(folder / "target", dtype=torch.bfloat16)
