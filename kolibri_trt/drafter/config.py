"""`DrafterConfig`: the block drafter's `config.json` (`shared/spec/block-drafter.md`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config_io import FieldReader, read_json, write_json_atomic
from ..errors import CheckpointError

WEIGHT_FORMATS = ("bf16", "fp8", "nvfp4")  # the seed's override values for body and head

_SPEC_FIELDS = (
    "architectures", "model_type", "hidden_size", "target_hidden_size", "target_layer_ids",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "rope_theta", "rms_norm_eps", "block_size", "context_window",
    "predecessor_rank", "spine_rank", "draft_vocab_size", "serving_defaults",
)


@dataclass(frozen=True)
class ServingDefaults:
    """How the drafter is served by default: `depth` passes per verification, body and head
    weight formats (seed 000: depth 2, fp8 body, nvfp4 head)."""

    depth: int = 2
    quant: str = "fp8"
    head: str = "nvfp4"


@dataclass(frozen=True)
class DrafterConfig:
    """Block-drafter architecture; defaults are the release values of the spec.

    Raises (on construction): CheckpointError naming the file and field for a type error or
    a contradiction (hidden_size != target_hidden_size, heads not divisible, ...).
    """

    hidden_size: int = 2560
    target_hidden_size: int = 2560
    target_layer_ids: tuple[int, ...] = (44, 47, 49)
    num_hidden_layers: int = 4
    num_attention_heads: int = 20
    num_key_value_heads: int = 20
    head_dim: int = 128
    intermediate_size: int = 6144
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    block_size: int = 4
    context_window: int = 2048
    predecessor_rank: int = 256
    spine_rank: int = 256
    draft_vocab_size: int = 60614
    serving_defaults: ServingDefaults = ServingDefaults()
    architectures: tuple[str, ...] = ("KolibriBlockDrafter",)
    model_type: str = "kolibri_block_drafter"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        def bad(name: str, message: str) -> CheckpointError:
            return CheckpointError(self.source, message, field=name)

        if self.hidden_size != self.target_hidden_size:
            raise bad("hidden_size", f"{self.hidden_size} must equal target_hidden_size="
                      f"{self.target_hidden_size} (rows meet the target's embedding and head)")
        if not self.target_layer_ids:
            raise bad("target_layer_ids", "must name at least one target layer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad("num_attention_heads", f"{self.num_attention_heads} not divisible by "
                      f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise bad("head_dim", f"must be even (rotate-half RoPE), got {self.head_dim}")

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_dict(cls, data: dict, path: str | Path | None = None) -> "DrafterConfig":
        """Build and check from a parsed `config.json`; errors name `path` and the field."""
        r = FieldReader(data, path)
        if r.get("model_type", None) != "kolibri_block_drafter":
            raise r.error("model_type", "must be 'kolibri_block_drafter' for a block drafter, "
                          f"got {r.get('model_type', None)!r}")
        sd = FieldReader(r.get("serving_defaults", {}), path)
        try:
            defaults = ServingDefaults(depth=sd.int("depth", 2),
                                       quant=sd.str("quant", "fp8", choices=WEIGHT_FORMATS),
                                       head=sd.str("head", "nvfp4", choices=WEIGHT_FORMATS))
        except CheckpointError as exc:
            raise r.error("serving_defaults", str(exc).split(": ", 1)[1]) from None
        known = dict(
            hidden_size=r.int("hidden_size"), target_hidden_size=r.int("target_hidden_size"),
            target_layer_ids=r.int_list("target_layer_ids"),
            num_hidden_layers=r.int("num_hidden_layers"),
            num_attention_heads=r.int("num_attention_heads"),
            num_key_value_heads=r.int("num_key_value_heads"), head_dim=r.int("head_dim"),
            intermediate_size=r.int("intermediate_size"), rope_theta=r.float("rope_theta"),
            rms_norm_eps=r.float("rms_norm_eps"), block_size=r.int("block_size"),
            context_window=r.int("context_window"), predecessor_rank=r.int("predecessor_rank"),
            spine_rank=r.int("spine_rank"), draft_vocab_size=r.int("draft_vocab_size"),
            serving_defaults=defaults, architectures=tuple(r.get("architectures", [])),
        )
        extra = {k: v for k, v in data.items() if k not in _SPEC_FIELDS}
        return cls(**known, extra=extra, source=None if path is None else str(path))

    @classmethod
    def from_json(cls, path: str | Path) -> "DrafterConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_dict(read_json(path), path)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {}
        for name in _SPEC_FIELDS:
            value = getattr(self, name)
            if isinstance(value, ServingDefaults):
                value = dataclasses.asdict(value)
            out[name] = list(value) if isinstance(value, tuple) else value
        out.update(self.extra)
        return out

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        write_json_atomic(path, self.to_dict())
        return path
