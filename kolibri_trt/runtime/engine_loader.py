"""Loading an engine directory (`engine_format.py`) for the runtime: manifest, weights, KV plan.

The manifest says every tensor group's format; the loader never guesses from tensor names.
On CPU, quantized linears are dequantized once to fp32 (`DequantLinear`), which is the
dequantizing reference path; bf16 groups load as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..checkpoint import load_tensors
from ..config import KolibriConfig
from ..config_io import FieldReader, read_json
from ..engine_format import (FULL_KV_FORMATS, MANIFEST, SCHEMA_VERSION, SLIDING_KV_FORMATS,
                             TARGET_DIR, WEIGHT_FORMATS, target_weight_group)
from ..errors import CheckpointError
from ..model import ops
from ..model.reference import KolibriForCausalLM, Linear
from .kv_cache import INT4_FULL, KVPlan

TARGET_GROUPS = ("attention", "experts", "shared_expert", "router", "embedding", "norms",
                 "lm_head")
# tensors each weight format stores per linear, besides `weight`
_SUFFIXES = {"bf16": (), "fp8": ("weight_scale", "input_scale"), "block_fp8": ("weight_scale",),
             "nvfp4": ("weight_scale", "weight_scale_2", "input_scale")}


@dataclass(frozen=True)
class Manifest:
    """The parts of manifest.json the runtime acts on (the rest stays in `raw`)."""

    path: Path
    target_formats: dict[str, str]
    drafter_formats: dict[str, str]
    kv: KVPlan
    kv_seed: int | None
    raw: dict

    @classmethod
    def read(cls, engine_dir: str | Path) -> "Manifest":
        """Raises CheckpointError naming manifest.json and the field for anything unexpected."""
        path = Path(engine_dir) / MANIFEST
        r = FieldReader(read_json(path), path)
        if r.int("schema_version") != SCHEMA_VERSION:
            raise r.error("schema_version", f"this runtime reads version {SCHEMA_VERSION}")
        weights = FieldReader(r.get("weights"), path)
        target = _formats(weights, "target", TARGET_GROUPS)
        drafter = _formats(weights, "drafter", ("body", "head")) if "drafter" in weights.data else {}
        kv = FieldReader(r.get("kv_cache"), path)
        plan = KVPlan(kv.str("sliding", choices=SLIDING_KV_FORMATS),
                      kv.str("full", choices=FULL_KV_FORMATS))
        seed = kv.int("seed", None, minimum=0) if plan.full == "hadamard-int4" else None
        return cls(path, target, drafter, plan, seed, r.data)


def _formats(r: FieldReader, key: str, groups: tuple[str, ...]) -> dict[str, str]:
    table = FieldReader(r.get(key), r.path)
    out = {g: table.str(g, choices=WEIGHT_FORMATS) for g in groups}
    extra = sorted(set(table.data) - set(groups))
    if extra:
        raise CheckpointError(r.path, f"unknown weight groups {extra}", field=f"weights.{key}")
    return out


class DequantLinear(nn.Module):
    """A quantized linear dequantized once to fp32 [N, K]; computes in fp32 with the
    row-invariant `ops.linear`, returns x.dtype (the CPU reference of the low-bit GEMMs)."""

    def __init__(self, weight_fp32: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight_fp32, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x.float(), self.weight).to(x.dtype)


def expected_engine_shapes(cfg: KolibriConfig, formats: dict[str, str]
                           ) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a target engine folder (weights only, KV tensors excluded)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in KolibriForCausalLM.expected_shapes(cfg).items():
        fmt = formats[target_weight_group(name)]
        if fmt == "bf16" or len(shape) != 2 or name.startswith("model.embed_tokens"):
            out[name] = shape
            continue
        n, k = shape
        base = name[: -len("weight")]
        out[name] = (n, k // 2) if fmt == "nvfp4" else (n, k)
        scale_shape = {"fp8": (), "block_fp8": (n, k // 64), "nvfp4": (n, k // 16)}[fmt]
        out[base + "weight_scale"] = scale_shape
        for extra in _SUFFIXES[fmt][1:]:
            out[base + extra] = ()
    return out


def kv_tensor_shapes(cfg: KolibriConfig, plan: KVPlan) -> dict[str, tuple[int, ...]]:
    """The KV-cache tensors an engine stores for `plan` (`engine_format.py`)."""
    out: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}.self_attn."
        fmt = plan.sliding if cfg.is_sliding(i) else plan.full
        if fmt == "fp8":
            out[pre + "k_scale"], out[pre + "v_scale"] = (), ()
        elif fmt in INT4_FULL:
            d = cfg.head_dim
            out[pre + "q_rotation"], out[pre + "k_rotation"] = (d, d), (d, d)
    return out


def _dequant(fmt: str, t: dict[str, torch.Tensor], base: str) -> torch.Tensor:
    from ..builder.dequant import dequantize_linear  # the build's own inverse of its formats
    return dequantize_linear(fmt, {k[len(base):]: v for k, v in t.items() if k.startswith(base)})


def load_target(engine_dir: Path, manifest: Manifest, device: str | torch.device
                ) -> tuple[KolibriForCausalLM, dict[int, tuple[torch.Tensor, torch.Tensor]],
                           dict[int, tuple[float, float]]]:
    """Build the target model from `engine_dir/target` as the manifest describes it.

    Returns (model, rotations {layer: (M_q, M_k) fp32}, kv scales {layer: (k_scale, v_scale)}).
    Raises CheckpointError for a missing, unexpected or mis-shaped tensor (names file, tensor).
    """
    folder = engine_dir / TARGET_DIR
    cfg = KolibriConfig.from_json(folder / "config.json")
    formats = manifest.target_formats
    shapes = {**expected_engine_shapes(cfg, formats), **kv_tensor_shapes(cfg, manifest.kv)}
    tensors = load_tensors(folder, shapes, device=device)
    with torch.device("meta"):
        model = KolibriForCausalLM(cfg)
    for name, module in list(model.named_modules()):
        fmt = formats[target_weight_group(name + ".weight")] if isinstance(module, Linear) else "bf16"
        if fmt != "bf16":
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child,
                    DequantLinear(_dequant(fmt, tensors, name + ".")))
    plain = {name: tensors[name].to(torch.bfloat16) for name in model.state_dict()}
    model.load_state_dict(plain, strict=True, assign=True)
    rotations, scales = {}, {}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}.self_attn."
        if pre + "q_rotation" in tensors:
            rotations[i] = (tensors[pre + "q_rotation"].float(), tensors[pre + "k_rotation"].float())
        if pre + "k_scale" in tensors:
            scales[i] = (float(tensors[pre + "k_scale"]), float(tensors[pre + "v_scale"]))
    return model.requires_grad_(False).eval(), rotations, scales


def load_drafter(engine_dir: Path, manifest: Manifest, target: KolibriForCausalLM,
                 device: str | torch.device):
    """The block drafter of `engine_dir/drafter`, bound to the loaded target.

    Raises:
        CheckpointError: the engine has no drafter, or its files are bad.
    """
    from ..drafter import KolibriBlockDrafter
    from ..engine_format import DRAFTER_DIR
    folder = engine_dir / DRAFTER_DIR
    if not manifest.drafter_formats or not folder.is_dir():
        raise CheckpointError(folder, "this engine has no drafter (build it with one, or use "
                              "speculative='off' or 'copy')")
    if set(manifest.drafter_formats.values()) != {"bf16"}:
        raise NotImplementedError("quantized drafter weights are not loaded on CPU yet")
    return KolibriBlockDrafter.from_pretrained(folder, target=target, device=device)
