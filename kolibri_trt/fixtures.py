"""Deterministic scaled-down Kolibri-1 checkpoints and block drafters with random weights.

Structure as `shared/spec/kolibri-1.md` §Scaled-down: 10 layers ((4 sliding + 1 full) x 2),
hidden 256, 4 query / 2 KV heads of head_dim 128, 8 experts top-2 with I = 128, a shared
expert; the real Tekken tokenizer (131,072 ids). The drafter keeps the spec's structure
(4 layers, block 4, three taps) at hidden 256. Weights are seeded, so the same seed writes
byte-identical files. Tests use them; the embedded default is the trained pair in
checkpoints/kolibri-mini.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

import torch

from .config import FULL, SLIDING, KolibriConfig
from .drafter import DrafterConfig, DrafterTarget, KolibriBlockDrafter, ServingDefaults
from .model.reference import KolibriForCausalLM

DEFAULT_DIR = Path("fixtures/default")


def tiny_target_config(**overrides) -> KolibriConfig:
    """The scaled-down target config; keyword overrides replace fields (and are checked)."""
    layers = overrides.pop("num_hidden_layers", 10)
    fields = dict(
        vocab_size=131072, hidden_size=256, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128,
        layer_types=tuple(FULL if i % 5 == 4 else SLIDING for i in range(layers)),
        sliding_window=513, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, max_position_embeddings=262144,
    )
    fields.update(overrides)
    return KolibriConfig(**fields)


def tiny_drafter_config(target: KolibriConfig, **overrides) -> DrafterConfig:
    """A drafter config that fits `target`, tapping its last layers like 44/47/49 of 50."""
    n = target.num_hidden_layers
    fields = dict(
        hidden_size=target.hidden_size, target_hidden_size=target.hidden_size,
        target_layer_ids=tuple(sorted({max(0, n - 5), max(0, n - 2), n - 1})),
        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, head_dim=128,
        intermediate_size=512, block_size=4, context_window=2048, predecessor_rank=32,
        spine_rank=32, draft_vocab_size=min(16384, target.vocab_size),
        serving_defaults=ServingDefaults(depth=2, quant="fp8", head="nvfp4"),
    )
    fields.update(overrides)
    return DrafterConfig(**fields)


def _fill_random(module: torch.nn.Module, seed: int, dtype: torch.dtype) -> None:
    """Seeded weights: linears N(0, 1/fan_in), embeddings N(0, 1), gains 1 + N(0, 0.1^2)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.state_dict().items():
        shape = tuple(p.shape)
        if name.endswith("norm.weight") or name.startswith("tap_norms."):
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("embed_tokens.weight") or name == "mask_embedding":
            value = torch.randn(shape, generator=gen)
        else:
            value = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        p.copy_(value.to(dtype))


def random_target(cfg: KolibriConfig, seed: int = 0, dtype: torch.dtype = torch.bfloat16
                  ) -> KolibriForCausalLM:
    """A KolibriForCausalLM for `cfg` with seeded random weights."""
    model = KolibriForCausalLM(cfg).to(dtype)
    with torch.no_grad():
        _fill_random(model, seed, dtype)
    return model.requires_grad_(False).eval()


def default_draft_vocab(cfg: KolibriConfig, size: int) -> torch.Tensor:
    """The EOS ids, then the lowest-ranked ordinary ids (Tekken's first 1000 ids are special)."""
    first = 1000 if cfg.vocab_size > 1000 + size else 0
    ids = list(dict.fromkeys(list(cfg.eos_token_ids) + list(range(first, cfg.vocab_size))))
    return torch.tensor(ids[:size], dtype=torch.long)


def random_drafter(cfg: DrafterConfig, target: KolibriForCausalLM, seed: int = 1,
                   dtype: torch.dtype = torch.bfloat16) -> KolibriBlockDrafter:
    """A KolibriBlockDrafter for `cfg` bound to `target`, with seeded random weights."""
    vocab = default_draft_vocab(target.config, cfg.draft_vocab_size)
    model = KolibriBlockDrafter(cfg, DrafterTarget.of(target), vocab).to(dtype)
    with torch.no_grad():
        _fill_random(model, seed, dtype)
    return model.requires_grad_(False).eval()


def make_fixtures(out_dir: str | Path = DEFAULT_DIR, seed: int = 0, force: bool = False,
                  with_tokenizer: bool = True) -> tuple[Path, Path]:
    """Write `out_dir/target` and `out_dir/drafter` (and the Tekken tokenizer into target).

    Written into a temporary folder beside `out_dir` and renamed at the end, so a failure
    leaves nothing half-written. Returns (target_dir, drafter_dir).

    Raises:
        FileExistsError: `out_dir` exists and `force` is False.
    """
    out = Path(out_dir)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        tcfg = tiny_target_config()
        target = random_target(tcfg, seed=seed)
        target.save_pretrained(tmp / "target")
        drafter = random_drafter(tiny_drafter_config(tcfg), target, seed=seed + 1)
        drafter.save_pretrained(tmp / "drafter")
        if with_tokenizer:
            from .tokenizer import write_tekken_tokenizer
            write_tekken_tokenizer(tmp / "target", vocab_size=tcfg.vocab_size)
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "target", out / "drafter"
