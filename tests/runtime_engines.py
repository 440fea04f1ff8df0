"""Small engines for runtime tests: a random target with the real tokenizer (vocab 2000)."""

from __future__ import annotations

from pathlib import Path

import torch

from kolibri_trt.config import FULL, SLIDING
from kolibri_trt.fixtures import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from kolibri_trt.tokenizer import write_tekken_tokenizer

VOCAB = 2000


def small_target(window: int = 24, hidden_size: int = 64):
    """5 layers (4 sliding + 1 full), hidden 64, 2 query / 1 KV heads of 128, vocab 2000."""
    cfg = tiny_target_config(vocab_size=VOCAB, hidden_size=hidden_size, num_hidden_layers=5,
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


def write_engine(folder: Path, model, drafter=None, weights: str = "bf16",
                 kv_cache: str = "bf16", tp_size: int = 1) -> Path:
    """Save the checkpoints with the tokenizer and build an engine from them with build.py's
    code (a short calibration set; bf16 + bf16: the unquantized engine of exact parity;
    tp_size > 1: sharded for that many tensor-parallel ranks, folder suffix -tp{n})."""
    from kolibri_trt.builder import BuildOptions, build_engine
    from test_build_support import recipes_copy

    model.save_pretrained(folder / "ckpt" / "target")
    write_tekken_tokenizer(folder / "ckpt" / "target", vocab_size=model.config.vocab_size)
    drafter = drafter if drafter is not None else small_drafter(model)
    drafter.save_pretrained(folder / "ckpt" / "drafter")
    recipes = folder / "recipes" if (folder / "recipes").is_dir() else recipes_copy(folder / "recipes")
    out, _ = build_engine(BuildOptions(target="cpu", model=folder / "ckpt" / "target",
                                       drafter=folder / "ckpt" / "drafter",
                                       out=folder / (f"engine-{weights}-{kv_cache}"
                                                     + (f"-tp{tp_size}" if tp_size > 1 else "")),
                                       weights=weights, kv_cache=kv_cache, progress=False,
                                       recipes_dir=recipes, tp_size=tp_size))
    return out


def reference_of(engine: Path):
    """The reference model of an unquantized engine (its target folder is a checkpoint plus
    ModelOpt's quantization_config, which the reference ignores)."""
    from kolibri_trt import KolibriForCausalLM
    return KolibriForCausalLM.from_pretrained(engine / "target", dtype=torch.bfloat16)
