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

from ..builder.dequant import dequantize
from ..checkpoint import load_tensors
from ..config import KolibriConfig
from ..config_io import FieldReader, read_json
from ..engine_format import (BLOCK_FP8_GROUP, DRAFTER_DIR, FULL_KV_FORMATS, MANIFEST,
                             NVFP4_GROUP, SCHEMA_VERSION, SLIDING_KV_FORMATS, TARGET_DIR,
                             WEIGHT_FORMATS, drafter_weight_group, target_weight_group)
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
    """The parts of manifest.json the runtime acts on (the rest stays in `raw`).

    tp_size: tensor-parallel ranks the target is sharded for (`target/rank{r}/`); engines built
    before tensor parallelism carry no "tp_size" and are unsharded (1)."""

    path: Path
    target_formats: dict[str, str]
    drafter_formats: dict[str, str]
    kv: KVPlan
    kv_seed: int | None
    raw: dict
    tp_size: int = 1

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
        tp_size = r.int("tp_size", 1, minimum=1)
        return cls(path, target, drafter, plan, seed, r.data, tp_size)


def require_unsharded(manifest: Manifest) -> None:
    """Raises ValueError naming tensor_parallel_size when the engine's target is sharded for
    tensor parallelism (a single-process loader would find no `target/model.safetensors`)."""
    if manifest.tp_size != 1:
        raise ValueError(f"tensor_parallel_size: the engine {manifest.path.parent} is sharded "
                         f"for tp_size={manifest.tp_size}; load it with "
                         f"LLM(..., tensor_parallel_size={manifest.tp_size})")


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


def quantized_shapes(base: dict[str, tuple[int, ...]], fmt_of) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape once every linear weight is stored in its format.

    base: the bf16 checkpoint's names and shapes; fmt_of(name) -> the format of that tensor's
    group. Only 2-D `.weight`s of linears change; the embedding always stays bf16.
    """
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in base.items():
        fmt = fmt_of(name)
        if fmt == "bf16" or len(shape) != 2 or "embed_tokens" in name:
            out[name] = shape
            continue
        n, k = shape
        stem = name[: -len("weight")]
        out[name] = (n, k // 2) if fmt == "nvfp4" else (n, k)
        out[stem + "weight_scale"] = {"fp8": (), "block_fp8": (n, -(-k // BLOCK_FP8_GROUP)),
                                      "nvfp4": (n, k // NVFP4_GROUP)}[fmt]
        for extra in _SUFFIXES[fmt][1:]:
            out[stem + extra] = ()
    return out


def expected_engine_shapes(cfg: KolibriConfig, formats: dict[str, str]
                           ) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a target engine folder (weights only, KV tensors excluded)."""
    return quantized_shapes(KolibriForCausalLM.expected_shapes(cfg),
                            lambda name: formats[target_weight_group(name)])


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


def load_target(engine_dir: Path, manifest: Manifest, device: str | torch.device
                ) -> tuple[KolibriForCausalLM, dict[int, tuple[torch.Tensor, torch.Tensor]],
                           dict[int, tuple[float, float]]]:
    """Build the target model from `engine_dir/target` as the manifest describes it.

    Returns (model, rotations {layer: (M_q, M_k) fp32}, kv scales {layer: (k_scale, v_scale)}).
    Raises CheckpointError for a missing, unexpected or mis-shaped tensor (names file, tensor);
    ValueError naming tensor_parallel_size for a tensor-parallel engine (`require_unsharded`).
    """
    require_unsharded(manifest)
    folder = engine_dir / TARGET_DIR
    cfg = KolibriConfig.from_json(folder / "config.json")
    return load_target_weights(folder, cfg, manifest, device)


def load_target_weights(folder: Path, cfg: KolibriConfig, manifest: Manifest,
                        device: str | torch.device):
    """`load_target` from the weights in `folder` for modules of `cfg` (the whole target, or
    one tensor-parallel rank's shard config and `target/rank{r}`); same returns and errors."""
    formats = manifest.target_formats
    shapes = {**expected_engine_shapes(cfg, formats), **kv_tensor_shapes(cfg, manifest.kv)}
    tensors = load_tensors(folder, shapes, device=device)
    with torch.device("meta"):
        model = KolibriForCausalLM(cfg)
    _assign(model, tensors, lambda name: formats[target_weight_group(name)])
    rotations, scales = {}, {}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}.self_attn."
        if pre + "q_rotation" in tensors:
            rotations[i] = (tensors[pre + "q_rotation"].float(), tensors[pre + "k_rotation"].float())
        if pre + "k_scale" in tensors:
            scales[i] = (float(tensors[pre + "k_scale"]), float(tensors[pre + "v_scale"]))
    return model.requires_grad_(False).eval(), rotations, scales


def _assign(model: nn.Module, tensors: dict[str, torch.Tensor], fmt_of) -> None:
    """Swap each quantized `Linear` for a `DequantLinear` and load every other tensor (bf16)."""
    for name, module in list(model.named_modules()):
        fmt = fmt_of(name + ".weight") if isinstance(module, Linear) else "bf16"
        if fmt != "bf16":
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child,
                    DequantLinear(dequantize(tensors, name, fmt)))
    plain = {name: tensors[name].to(torch.bfloat16) for name in model.state_dict()}
    model.load_state_dict(plain, strict=True, assign=True)


def read_drafter_engine(engine_dir: Path, manifest: Manifest, target, device):
    """What both drafter loaders read from `engine_dir/drafter`: (DrafterConfig, the
    DrafterTarget bound to `target`, draft vocabulary int64 [Vd], stored tensors by name on
    `device`, the manifest's drafter formats, name -> format).

    Raises:
        CheckpointError: the engine has no drafter, or its files are bad (names file/tensor).
    """
    from ..drafter import DrafterConfig, DrafterTarget, KolibriBlockDrafter
    from ..drafter.block_drafter import DRAFT_VOCAB, check_fits_target, read_draft_vocab
    folder = Path(engine_dir) / DRAFTER_DIR
    if not manifest.drafter_formats or not folder.is_dir():
        raise CheckpointError(folder, "this engine has no drafter (build it with one, or use "
                              "speculative='off' or 'copy')")
    cfg = DrafterConfig.from_json(folder / "config.json")
    tgt = DrafterTarget.of(target)
    check_fits_target(cfg, tgt, folder / "config.json")
    vocab = read_draft_vocab(folder / DRAFT_VOCAB, cfg.draft_vocab_size, tgt.lm_head.shape[0])
    formats = manifest.drafter_formats
    base = dict(KolibriBlockDrafter.expected_shapes(cfg))
    base["lm_head.weight"] = (cfg.draft_vocab_size, cfg.hidden_size)
    fmt_of = lambda name: formats[drafter_weight_group(name)] \
        if drafter_weight_group(name) != "norms" else "bf16"  # noqa: E731
    tensors = load_tensors(folder, quantized_shapes(base, fmt_of), device=device)
    return cfg, tgt, vocab, tensors, formats, fmt_of


def load_drafter(engine_dir: Path, manifest: Manifest, target: KolibriForCausalLM,
                 device: str | torch.device):
    """The block drafter of `engine_dir/drafter`, bound to the loaded target; its head is the
    stored draft-vocabulary slice (`lm_head.*`, dequantized), not the target's full head.

    Raises:
        CheckpointError: the engine has no drafter, or its files are bad (names file/tensor).
    """
    from ..drafter import KolibriBlockDrafter
    cfg, tgt, vocab, tensors, formats, fmt_of = read_drafter_engine(engine_dir, manifest, target,
                                                                    device)
    with torch.device("meta"):
        model = KolibriBlockDrafter(cfg, tgt, torch.empty(0, dtype=torch.long))
    head = dequantize(tensors, "lm_head", formats["head"])
    _assign(model, {k: v for k, v in tensors.items() if not k.startswith("lm_head.")}, fmt_of)
    model.draft_vocab = vocab.to(device)
    model.head_slice = head
    return model.requires_grad_(False).eval()
