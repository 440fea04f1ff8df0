"""What NVIDIA ModelOpt (nvidia-modelopt 0.47.0) does in a build, on CPU.

- Target FP8 (attention, routed and shared experts): `mtq.quantize` with `mtq.FP8_DEFAULT_CFG`
  (per-tensor e4m3 weights and inputs; it keeps routers `*mlp.gate.*` and `*lm_head*` out) and
  ModelOpt's max calibration; `preprocess_linear_fusion` (the exporter's q/k/v and gate/up
  fusion: shared input and weight scales), then its exporter internals
  `_process_quantized_modules` + `postprocess_state_dict` write `weight` (e4m3),
  `weight_scale`, `input_scale`; `process_layer_quant_config` / `convert_hf_quant_config_format`
  write `hf_quant_config.json` and config.json's `quantization_config`.
- NVFP4 heads: `NVFP4QTensor.quantize(w, 16)` (NVFP4 fake quantization needs CUDA, so the head's
  input amax is calibrated by a per-tensor max quantizer and turned into ModelOpt's NVFP4
  input scale amax / (6 * 448) here).
- Drafter block FP8: ModelOpt's static block quantizer (`block_sizes {-1: 64}`) calibrates the
  per-block amax; its exporter cannot write 1x64 blocks, so `quantize.quantize_block_fp8`
  writes the tensors.
ModelOpt's HF exporter itself needs a `transformers` model; ours is plain torch, so its linears
are handed to ModelOpt as a "shadow" tree of `nn.Linear` modules named like the checkpoint
tensors, sharing the weights.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Callable, Mapping

import torch
from torch import nn

from ..engine_format import NVFP4_GROUP
from .dequant import E2M1_MAX, E4M3_MAX
from .errors import BuildError

MODELOPT_PIN = "0.47.0"
GROUP_PATTERNS = {"attention": "*self_attn.*", "experts": "*mlp.experts.*",
                  "shared_expert": "*mlp.shared_expert.*"}


@contextlib.contextmanager
def quiet():
    """Silence ModelOpt's prints ("Inserted N quantizers") and import warnings: stdout carries
    only the engine path."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def require_modelopt(why: str):
    """Import `modelopt.torch.quantization` (as mtq) or raise BuildError saying what needs it."""
    try:
        with quiet():
            import modelopt.torch.export  # noqa: F401  (registers the exporter helpers)
            import modelopt.torch.quantization as mtq
    except ImportError as exc:
        raise BuildError(f"{why} quantizes with NVIDIA ModelOpt, which does not import ({exc}); "
                         f"install nvidia-modelopt=={MODELOPT_PIN} with requests and "
                         "huggingface_hub, or build with --weights bf16") from None
    return mtq


def modelopt_version() -> str | None:
    """The installed ModelOpt version, or None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("nvidia-modelopt")
    except PackageNotFoundError:
        return None


def shadow_linears(weights: Mapping[str, torch.Tensor]) -> nn.Module:
    """A module tree of bias-free `nn.Linear` named like the checkpoint: weights[name] [N, K]
    becomes module `name` (e.g. "model.layers.0.self_attn.q_proj") sharing the tensor."""
    root = nn.Module()
    for name, w in weights.items():
        with torch.device("meta"):
            lin = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
        lin.weight = nn.Parameter(w, requires_grad=False)
        parent = root
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, lin)
    return root


def target_fp8_config(groups: Mapping[str, str], head_nvfp4: bool) -> dict:
    """`mtq.FP8_DEFAULT_CFG` with the recipe's bf16 groups switched off; with an NVFP4 head, a
    per-tensor max quantizer on the head's input (only its amax is used)."""
    mtq = require_modelopt("the FP8 target recipe")
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    for group, pattern in GROUP_PATTERNS.items():
        if groups[group] == "bf16":
            cfg["quant_cfg"].append({"quantizer_name": pattern, "enable": False})
    if head_nvfp4:
        cfg["quant_cfg"].append({"quantizer_name": "lm_head.input_quantizer",
                                 "cfg": {"num_bits": (4, 3), "axis": None}})
    return cfg


def quantize_fp8(shadow: nn.Module, cfg: dict, forward_loop: Callable[[nn.Module], None],
                 round_amax: Callable[[float], float], fuse_groups: list[list[str]]
                 ) -> tuple[dict[str, torch.Tensor], dict[str, str | None], float | None]:
    """Quantize and calibrate `shadow` with ModelOpt, then export it.

    round_amax: applied to every calibrated input amax (machine-independent scales);
    fuse_groups: module names sharing an input (q/k/v, gate/up) for ModelOpt's fusion.
    Returns (exported state dict: name -> tensor, per-module ModelOpt format ("fp8" or None),
    the LM head's calibrated input amax or None).
    """
    mtq = require_modelopt("the FP8 target recipe")
    from modelopt.torch.export.quant_utils import (
        get_quantization_format,
        postprocess_state_dict,
        preprocess_linear_fusion,
    )
    from modelopt.torch.export.unified_export_hf import _process_quantized_modules

    with quiet():
        mtq.quantize(shadow, cfg, forward_loop)
        head_amax = _round_input_amax(shadow, round_amax)
        for names in fuse_groups:
            modules = [shadow.get_submodule(n) for n in names]
            if all(get_quantization_format(m) != "none" and m.weight_quantizer.is_enabled
                   for m in modules):
                preprocess_linear_fusion(modules)
        formats = {n: _format(get_quantization_format(m)) for n, m in shadow.named_modules()
                   if isinstance(m, nn.Linear)}
        _process_quantized_modules(shadow, torch.bfloat16)
        state = postprocess_state_dict(shadow.state_dict(), E4M3_MAX, None)
    return dict(state), formats, head_amax


def _format(fmt: str | None) -> str | None:
    return None if fmt in (None, "none") else fmt


def _round_input_amax(shadow: nn.Module, round_amax: Callable[[float], float]) -> float | None:
    head_amax = None
    for name, m in shadow.named_modules():
        q = getattr(m, "input_quantizer", None)
        if q is None or not q.is_enabled or q.amax is None:
            continue
        q.amax = torch.tensor(round_amax(float(q.amax.float())), dtype=torch.float32)
        if name == "lm_head":
            head_amax = float(q.amax)
            q.disable()          # the head is packed by NVFP4QTensor, not by the FP8 exporter
    return head_amax


def nvfp4_input_scale(amax: float) -> torch.Tensor:
    """ModelOpt's NVFP4 activation scale: amax / (6 * 448), fp32 []."""
    return torch.tensor(amax / (E2M1_MAX * E4M3_MAX), dtype=torch.float32)


def nvfp4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`NVFP4QTensor.quantize(w, 16)`: w [N, K] -> (uint8 [N, K/2], e4m3 [N, K/16], fp32 [])."""
    require_modelopt("the NVFP4 head")
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    with quiet():
        qt, block, global_scale = NVFP4QTensor.quantize(w, NVFP4_GROUP)
    return qt._quantized_data, block, global_scale.reshape(()).float()


def block_fp8_amax(weights: Mapping[str, torch.Tensor], group: int) -> dict[str, torch.Tensor]:
    """ModelOpt's static block-quantizer amax (weight-only max calibration, e4m3, blocks of
    `group` inputs per row): name -> fp32 [N, ceil(K/group)]."""
    mtq = require_modelopt("the block-FP8 drafter recipe")
    shadow = shadow_linears(weights)
    cfg = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                         {"quantizer_name": "*weight_quantizer",
                          "cfg": {"num_bits": (4, 3), "block_sizes": {-1: group},
                                  "axis": None}}],
           "algorithm": "max"}
    with quiet():
        mtq.quantize(shadow, cfg, None)
    return {n: shadow.get_submodule(n).weight_quantizer.amax.float().reshape(w.shape[0], -1)
            for n, w in weights.items()}


def hf_quant_config(formats: Mapping[str, str | None], kv_cache_algo: str | None) -> dict:
    """`hf_quant_config.json` as ModelOpt's exporter writes it, from per-module formats
    ("fp8", "nvfp4" or None for unquantized) via `process_layer_quant_config`."""
    require_modelopt("hf_quant_config.json")
    from modelopt.torch.export.quant_utils import process_layer_quant_config

    layers = {}
    for name, fmt in sorted(formats.items()):
        layers[f"{name}.quantization"] = fmt
        layers[f"{name}.awq_block_size"] = NVFP4_GROUP if fmt == "nvfp4" else 0
    with quiet():
        quant = process_layer_quant_config(layers)
    quant["kv_cache_quant_algo"] = kv_cache_algo
    return {"producer": {"name": "modelopt", "version": modelopt_version()},
            "quantization": quant}


def quantization_config(hf_config: dict) -> dict:
    """config.json's `quantization_config` (ModelOpt's `convert_hf_quant_config_format`)."""
    require_modelopt("quantization_config")
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    with quiet():
        return convert_hf_quant_config_format(copy.deepcopy(hf_config))
