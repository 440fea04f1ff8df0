"""`KolibriConfig`: the Kolibri-1 `config.json`, fixed by `shared/spec/kolibri-1.md`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_io import FieldReader, read_json, write_json_atomic

SLIDING = "sliding_attention"
FULL = "full_attention"
LAYER_TYPES = (SLIDING, FULL)

# Fields the spec fixes, in the order `to_dict` writes them.
_SPEC_FIELDS = (
    "architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "layer_types", "sliding_window",
    "rope_theta", "full_attention_rope", "max_position_embeddings", "rms_norm_eps",
    "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "norm_topk_prob", "hidden_act", "tie_word_embeddings",
    "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype",
)


@dataclass(frozen=True)
class KolibriConfig:
    """Kolibri-1 architecture (`shared/spec/kolibri-1.md` §config.json); full-size defaults.

    Sizes are counts (layers, heads, experts) or widths in elements. `extra` keeps fields the
    spec does not define (e.g. `transformers_version`, `quantization_config`) so that a
    round trip through `save` preserves them; they never change the forward pass.

    Raises (from `from_dict` / `from_json`, and `__post_init__`):
        CheckpointError: a field is missing, has the wrong type, or contradicts another
            (`layer_types` length, heads not divisible, unknown layer type, ...). The message
            names the file and the field.
    """

    vocab_size: int = 131072
    hidden_size: int = 2560
    num_hidden_layers: int = 50
    num_attention_heads: int = 20
    num_key_value_heads: int = 4
    head_dim: int = 128
    layer_types: tuple[str, ...] = tuple(FULL if i % 5 == 4 else SLIDING for i in range(50))
    sliding_window: int = 513
    rope_theta: float = 10000.0
    full_attention_rope: bool = False
    max_position_embeddings: int = 262144
    rms_norm_eps: float = 1e-6
    num_experts: int = 256
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 768
    shared_expert_intermediate_size: int = 768
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    bos_token_id: int = 1
    eos_token_id: int | tuple[int, ...] = 2
    pad_token_id: int | None = 11
    torch_dtype: str = "bfloat16"
    architectures: tuple[str, ...] = ("KolibriForCausalLM",)
    model_type: str = "kolibri"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(self)

    # ---- derived -------------------------------------------------------------------------
    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """All end-of-sequence ids (the spec allows one id or a list)."""
        eos = self.eos_token_id
        return (eos,) if isinstance(eos, int) else tuple(eos)

    @property
    def q_per_kv(self) -> int:
        """Query heads per KV head (GQA group size; 5 at full size)."""
        return self.num_attention_heads // self.num_key_value_heads

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == SLIDING

    # ---- I/O -----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict, path: str | Path | None = None) -> "KolibriConfig":
        """Build and check a config from a parsed `config.json` (errors name `path`)."""
        r = FieldReader(data, path)
        if r.get("model_type", None) != "kolibri":
            raise r.error("model_type", f"must be 'kolibri' for a Kolibri-1 checkpoint, "
                          f"got {r.get('model_type', None)!r}")
        arch = r.get("architectures", ["KolibriForCausalLM"])
        if not isinstance(arch, list) or "KolibriForCausalLM" not in arch:
            raise r.error("architectures", f"must contain 'KolibriForCausalLM', got {arch!r}")
        types = r.get("layer_types")
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise r.error("layer_types", f"must be a list of strings, got {types!r}")
        eos = r.get("eos_token_id")
        eos = r.int("eos_token_id", minimum=0) if not isinstance(eos, list) \
            else r.int_list("eos_token_id", minimum=0)
        pad = None if r.get("pad_token_id", None) is None else r.int("pad_token_id", minimum=0)
        known = dict(
            vocab_size=r.int("vocab_size"), hidden_size=r.int("hidden_size"),
            num_hidden_layers=r.int("num_hidden_layers"),
            num_attention_heads=r.int("num_attention_heads"),
            num_key_value_heads=r.int("num_key_value_heads"), head_dim=r.int("head_dim"),
            layer_types=tuple(types), sliding_window=r.int("sliding_window"),
            rope_theta=r.float("rope_theta"),
            full_attention_rope=r.bool("full_attention_rope", False),
            max_position_embeddings=r.int("max_position_embeddings"),
            rms_norm_eps=r.float("rms_norm_eps"), num_experts=r.int("num_experts"),
            num_experts_per_tok=r.int("num_experts_per_tok"),
            moe_intermediate_size=r.int("moe_intermediate_size"),
            shared_expert_intermediate_size=r.int("shared_expert_intermediate_size", 0, minimum=0),
            norm_topk_prob=r.bool("norm_topk_prob", True),
            hidden_act=r.str("hidden_act", "silu"),
            tie_word_embeddings=r.bool("tie_word_embeddings", False),
            bos_token_id=r.int("bos_token_id", minimum=0), eos_token_id=eos, pad_token_id=pad,
            torch_dtype=r.str("torch_dtype", "bfloat16", choices=("bfloat16", "float16", "float32")),
            architectures=tuple(arch), model_type="kolibri",
        )
        extra = {k: v for k, v in data.items() if k not in _SPEC_FIELDS}
        return cls(**known, extra=extra, source=None if path is None else str(path))

    @classmethod
    def from_json(cls, path: str | Path) -> "KolibriConfig":
        """Read and check `config.json` (a file, or a checkpoint directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_dict(read_json(path), path)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {}
        for name in _SPEC_FIELDS:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        out.update(self.extra)
        return out

    def save(self, directory: str | Path) -> Path:
        """Write `directory/config.json` atomically; returns its path."""
        path = Path(directory) / "config.json"
        write_json_atomic(path, self.to_dict())
        return path

    def replace(self, **changes: Any) -> "KolibriConfig":
        return dataclasses.replace(self, **changes)


def _check(c: KolibriConfig) -> None:
    """Cross-field checks of the spec; raises CheckpointError naming the field."""
    from .errors import CheckpointError

    def bad(name: str, message: str) -> CheckpointError:
        return CheckpointError(c.source, message, field=name)

    if len(c.layer_types) != c.num_hidden_layers:
        raise bad("layer_types", f"has {len(c.layer_types)} entries, "
                  f"num_hidden_layers is {c.num_hidden_layers}")
    for i, t in enumerate(c.layer_types):
        if t not in LAYER_TYPES:
            raise bad("layer_types", f"entry {i} is {t!r}: unknown layer type "
                      f"(allowed: {list(LAYER_TYPES)})")
    if c.num_attention_heads % c.num_key_value_heads:
        raise bad("num_attention_heads", f"{c.num_attention_heads} query heads are not "
                  f"divisible by num_key_value_heads={c.num_key_value_heads}")
    if c.head_dim % 2:
        raise bad("head_dim", f"must be even (rotate-half RoPE), got {c.head_dim}")
    if c.num_experts_per_tok > c.num_experts:
        raise bad("num_experts_per_tok", f"{c.num_experts_per_tok} exceeds "
                  f"num_experts={c.num_experts}")
    if c.full_attention_rope:
        raise bad("full_attention_rope", "Kolibri-1's full-attention layers are NoPE: "
                  "must be false")
    if c.hidden_act != "silu":
        raise bad("hidden_act", f"only 'silu' is defined by the spec, got {c.hidden_act!r}")
    if c.tie_word_embeddings:
        raise bad("tie_word_embeddings", "Kolibri-1 has a separate lm_head: must be false")
    ids = {"bos_token_id": (c.bos_token_id,), "eos_token_id": c.eos_token_ids,
           "pad_token_id": () if c.pad_token_id is None else (c.pad_token_id,)}
    for name, values in ids.items():
        for v in values:
            if not 0 <= v < c.vocab_size:
                raise bad(name, f"id {v} is outside the vocabulary [0, {c.vocab_size})")
