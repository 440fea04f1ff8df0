"""The drafter's engine tensors: block-FP8 body, NVFP4 head slice, bf16 norms.

Groups (manifest "weights.drafter"; `engine_format.drafter_weight_group`): body (fuse, fc,
attention, MLP, spine, predecessor linears), head (the draft-vocabulary rows of the target's
lm_head, stored as `lm_head.*`); the norms and `mask_embedding` always stay bf16.
"""

from __future__ import annotations

import torch

from ..engine_format import BLOCK_FP8_GROUP, drafter_weight_group
from . import modelopt_backend as mo
from .estimate import BuildStats
from .quantize import quantize_block_fp8
from .recipes import WeightsRecipe
from .target import nvfp4_head


def drafter_tensors(state: dict[str, torch.Tensor], head_rows: torch.Tensor,
                    recipe: WeightsRecipe, head_input_amax: float | None,
                    stats: BuildStats | None = None
                    ) -> tuple[dict[str, torch.Tensor], dict[str, str | None]]:
    """All drafter tensors of the engine and the per-module formats.

    state: the drafter checkpoint by name; head_rows: target lm_head[draft_vocab] [Vd, H].
    stats records the "block_fp8" and "nvfp4" stages.
    Returns (name -> tensor, module -> "block_fp8" / "nvfp4" / None).
    """
    stats = BuildStats() if stats is None else stats
    groups = recipe.drafter
    out: dict[str, torch.Tensor] = {}
    formats: dict[str, str | None] = {}
    body = {}
    for name, t in state.items():
        group = drafter_weight_group(name)
        if group == "body" and groups["body"] == "block_fp8":
            body[name[: -len(".weight")]] = t.to(torch.bfloat16)
        else:
            out[name] = t.to(torch.bfloat16)
            if group == "body":
                formats[name[: -len(".weight")]] = None
    if body:
        with stats.stage("block_fp8", sum(w.numel() for w in body.values())):
            amax = mo.block_fp8_amax(body, BLOCK_FP8_GROUP)
            for prefix, w in body.items():
                q, scale = quantize_block_fp8(w, amax[prefix], BLOCK_FP8_GROUP)
                out[f"{prefix}.weight"], out[f"{prefix}.weight_scale"] = q, scale
                formats[prefix] = "block_fp8"
    if groups["head"] == "nvfp4":
        with stats.stage("nvfp4", head_rows.numel()):
            out.update(nvfp4_head(head_rows, head_input_amax, "lm_head"))
        formats["lm_head"] = "nvfp4"
    else:
        out["lm_head.weight"] = head_rows.to(torch.bfloat16)
        formats["lm_head"] = None
    return dict(sorted(out.items())), formats


def drafter_hf_quant_config(formats: dict[str, str | None], version: str) -> dict | None:
    """hf_quant_config.json for the drafter, in ModelOpt's MIXED_PRECISION layout. The 1x64
    block-FP8 entries are ours (`"quant_algo": "FP8_BLOCK_1X64"`, weight only): ModelOpt cannot
    express them. None when nothing is quantized."""
    layers = {}
    for name, fmt in sorted(formats.items()):
        if fmt == "block_fp8":
            layers[name] = {"quant_algo": "FP8_BLOCK_1X64", "block_size": [1, BLOCK_FP8_GROUP],
                            "weight_only": True}
        elif fmt == "nvfp4":
            layers[name] = {"quant_algo": "NVFP4", "group_size": 16}
    if not layers:
        return None
    return {"producer": {"name": "kolibri_trt", "version": version,
                         "modelopt_version": mo.modelopt_version()},
            "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                             "quantized_layers": layers,
                             "exclude_modules": sorted(n for n, f in formats.items() if f is None)}}


def drafter_quantization_config(hf: dict) -> dict:
    """config.json's `quantization_config` for the drafter: ModelOpt's keys (quant_method
    "modelopt", quant_algo, quantized_layers, producer) for our mixed layout."""
    q = hf["quantization"]
    return {"quant_method": "modelopt", "quant_algo": q["quant_algo"],
            "quantized_layers": q["quantized_layers"], "ignore": q["exclude_modules"],
            "producer": hf["producer"]}
