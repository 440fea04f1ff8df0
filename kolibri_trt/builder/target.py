"""The target's engine tensors: ModelOpt FP8 body, NVFP4 LM head, bf16 rest, KV-plan tensors.

Groups (manifest "weights.target"): attention (q/k/v/o_proj), experts (routed), shared_expert,
router (`mlp.gate`), embedding, norms (every RMSNorm gain incl. q_norm / k_norm), lm_head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..config import KolibriConfig
from ..engine_format import target_weight_group
from . import modelopt_backend as mo
from .calibration import Captures
from .errors import BuildError
from .estimate import BuildStats
from .hadamard import fold_qk_gains, hadamard_rotation, is_power_of_two
from .recipes import KvPlan, WeightsRecipe

FP8_GROUPS = ("attention", "experts", "shared_expert")


def target_group(name: str) -> str:
    """The recipe group of checkpoint tensor `name` (`engine_format.target_weight_group`).
    Raises BuildError for a name outside the spec."""
    try:
        return target_weight_group(name)
    except ValueError as exc:
        raise BuildError(str(exc)) from None


def check_kv_plan(cfg: KolibriConfig, plan: KvPlan) -> None:
    """Raises BuildError if the plan cannot apply: the rotation needs a power-of-two head_dim."""
    if plan.full == "hadamard-int4" and not is_power_of_two(cfg.head_dim):
        raise BuildError(f"--kv-cache hadamard-int4: head_dim {cfg.head_dim} of {cfg.source} is "
                         "not a power of two (the Hadamard rotation is defined at 128); use "
                         "--kv-cache int4, fp8 or bf16")


def kv_tensors(cfg: KolibriConfig, state: dict[str, torch.Tensor], plan: KvPlan
               ) -> dict[str, torch.Tensor]:
    """KV-plan tensors: `self_attn.k_scale` / `v_scale` fp32 [] = 1.0 (uncalibrated) for FP8
    layers; `self_attn.q_rotation` (M_q) / `k_rotation` (M_k) fp32 [D, D] for INT4 full
    layers (`hadamard.fold_qk_gains`; R from `plan.seed`, the same R in every layer)."""
    check_kv_plan(cfg, plan)
    rotation = hadamard_rotation(plan.seed, cfg.head_dim) if plan.full == "hadamard-int4" else None
    out = {}
    for layer in range(cfg.num_hidden_layers):
        kind = plan.sliding if cfg.is_sliding(layer) else plan.full
        p = f"model.layers.{layer}.self_attn"
        if kind == "fp8":
            out[f"{p}.k_scale"] = torch.tensor(1.0)
            out[f"{p}.v_scale"] = torch.tensor(1.0)
        elif kind in ("hadamard-int4", "int4"):
            m_q, m_k = fold_qk_gains(state[f"{p}.q_norm.weight"], state[f"{p}.k_norm.weight"],
                                     rotation)
            out[f"{p}.q_rotation"], out[f"{p}.k_rotation"] = m_q, m_k
    return out


def fuse_groups(cfg: KolibriConfig) -> list[list[str]]:
    """Linears that share an input (ModelOpt's export fusion): q/k/v of each layer, gate/up
    of each routed and the shared expert."""
    groups = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        groups.append([f"{p}.self_attn.{x}_proj" for x in "qkv"])
        experts = [f"{p}.mlp.experts.{e}" for e in range(cfg.num_experts)]
        if cfg.shared_expert_intermediate_size:
            experts.append(f"{p}.mlp.shared_expert")
        groups += [[f"{e}.gate_proj", f"{e}.up_proj"] for e in experts]
    return groups


def calibration_loop(cfg: KolibriConfig, cap: Captures) -> Callable:
    """ModelOpt's forward_loop over the captured inputs, all sequences of a layer in one
    batch (max calibration only sees the amax): q/k/v, o_proj, router, every expert (all
    tokens) and the shared expert, and the LM head's input quantizer."""
    def loop(shadow) -> None:
        m = shadow.get_submodule
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}"
            x, a, y = (torch.cat(c[i]) for c in (cap.attn_in, cap.o_in, cap.moe_in))
            for name in ("q_proj", "k_proj", "v_proj"):
                m(f"{p}.self_attn.{name}")(x)
            m(f"{p}.self_attn.o_proj")(a)
            m(f"{p}.mlp.gate")(y)
            experts = [f"{p}.mlp.experts.{e}" for e in range(cfg.num_experts)]
            if cfg.shared_expert_intermediate_size:
                experts.append(f"{p}.mlp.shared_expert")
            for e in experts:
                m(f"{e}.down_proj")(F.silu(m(f"{e}.gate_proj")(y)) * m(f"{e}.up_proj")(y))
        head_q = getattr(m("lm_head"), "input_quantizer", None)
        if head_q is not None:
            head_q(torch.cat(cap.head_in))
    return loop


def target_tensors(cfg: KolibriConfig, state: dict[str, torch.Tensor], recipe: WeightsRecipe,
                   plan: KvPlan, cap: Captures | None, round_amax: Callable[[float], float],
                   stats: BuildStats | None = None
                   ) -> tuple[dict[str, torch.Tensor], dict[str, str | None]]:
    """All target tensors of the engine and the per-module formats for hf_quant_config.

    state: the checkpoint (bf16) by name; cap: calibration captures (needed when the recipe
    quantizes); stats: records the "modelopt_fp8" and "nvfp4" stages.
    Returns (name -> tensor, linear module name -> "fp8" / "nvfp4" / None).
    """
    stats = BuildStats() if stats is None else stats
    groups = recipe.target
    out = {n: t.to(torch.bfloat16) for n, t in state.items()
           if groups[target_group(n)] == "bf16"}
    formats: dict[str, str | None] = {}
    head_amax = None
    if any(groups[g] == "fp8" for g in FP8_GROUPS) or groups["lm_head"] == "nvfp4":
        if cap is None:
            raise BuildError(f"recipe {recipe.name!r} quantizes but no calibration ran")
        linears = {n[: -len(".weight")]: t for n, t in state.items()
                   if target_group(n) in (*FP8_GROUPS, "router", "lm_head")}
        fp8_elements = sum(t.numel() for n, t in linears.items() if target_group(
            n + ".weight") in FP8_GROUPS and groups[target_group(n + ".weight")] == "fp8")
        with stats.stage("modelopt_fp8", fp8_elements):
            shadow = mo.shadow_linears(linears)
            cfg_mo = mo.target_fp8_config(groups, head_nvfp4=groups["lm_head"] == "nvfp4")
            exported, formats, head_amax = mo.quantize_fp8(
                shadow, cfg_mo, calibration_loop(cfg, cap), round_amax, fuse_groups(cfg))
        out.update({n: t for n, t in exported.items() if not n.startswith("lm_head.")})
    if groups["lm_head"] == "nvfp4":
        with stats.stage("nvfp4", state["lm_head.weight"].numel()):
            out.update(nvfp4_head(state["lm_head.weight"], head_amax, "lm_head"))
        formats["lm_head"] = "nvfp4"
    out.update(kv_tensors(cfg, state, plan))
    return dict(sorted(out.items())), formats


def nvfp4_head(weight: torch.Tensor, input_amax: float | None, prefix: str
               ) -> dict[str, torch.Tensor]:
    """`prefix.weight/weight_scale/weight_scale_2/input_scale` of an NVFP4 head (ModelOpt's
    packing). Raises BuildError without a calibrated input amax."""
    if input_amax is None or not input_amax > 0:
        raise BuildError(f"{prefix}: no calibrated input amax for the NVFP4 input scale")
    packed, block, global_scale = mo.nvfp4_pack(weight.to(torch.bfloat16))
    return {f"{prefix}.weight": packed, f"{prefix}.weight_scale": block,
            f"{prefix}.weight_scale_2": global_scale,
            f"{prefix}.input_scale": mo.nvfp4_input_scale(input_amax)}
