"""Synthetic full-size engines made on the GPU machine itself (no files, no ModelOpt, no network).

Random bf16 weights of the spec's exact shapes (`shared/spec/kolibri-1.md`; a `KolibriConfig`
of any size) are generated one layer at a time on the device, quantized with this project's own
torch quantizers into exactly the tensors a `build.py` engine of the fp8-nvfp4 recipe stores
(names, dtypes and shapes of `engine_loader.expected_engine_shapes` + `kv_tensor_shapes`), and
the kernel path's `PluginModel` is built straight from them
(`plugin_loader.plugin_model_from_tensors`). At full size the bf16 model (~154 GB) never
exists at once: only one layer's bf16 weights (~3 GB) live next to the FP8 engine (~78 GB).

What each tensor is (equal bit for bit to what build.py's ModelOpt path writes for the same bf16
weights: tests/test_synthetic_engine.py):
- FP8 linears (attention, routed and shared experts; ModelOpt 0.47 `FP8_DEFAULT_CFG` export):
  weight_scale = amax / 448 (fp32), the amax TIED over each fusion group as the exporter's
  `preprocess_linear_fusion` ties it (q/k/v of a layer; gate/up of each expert and of the shared
  expert: the max of the group's amaxes); weight = e4m3(bf16(w / weight_scale)) (`fp8_quantize`).
- LM head: NVFP4 by `quantize.quantize_nvfp4` (bit-equal to ModelOpt's `NVFP4QTensor`).
- Embedding, norms, routers: bf16 as generated.
- KV tensors: FP8 layers `k_scale` / `v_scale` = 1.0 (what the build writes, uncalibrated);
  rotated-INT4 full layers `q_rotation` / `k_rotation` = `hadamard.fold_qk_gains` with
  R = `hadamard.hadamard_rotation(kv_seed)` (the build's code).
- `input_scale` (static activation scales) come from calibration, which a synthetic engine does
  not run: they hold PLACEHOLDER_INPUT_SCALE (the kernel path never reads them).

Random weights follow `fixtures.py`: linears N(0, 1/fan_in), embedding N(0, 1), norm gains
1 + N(0, 0.1^2); seeded per layer, so a seed gives the same engine on the same device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from ..config import KolibriConfig
from ..runtime.kv_cache import INT4_FULL, KVPlan
from .dequant import E4M3_MAX
from .hadamard import fold_qk_gains, hadamard_rotation
from .quantize import quantize_nvfp4

# the fp8-nvfp4 recipe (build/weights.toml): the only one the kernel path runs
FP8_NVFP4 = {"attention": "fp8", "experts": "fp8", "shared_expert": "fp8", "router": "bf16",
             "embedding": "bf16", "norms": "bf16", "lm_head": "nvfp4"}
DEFAULT_KV = KVPlan("fp8", "hadamard-int4")
DEFAULT_KV_SEED = 1003          # build/kv-cache.toml
PLACEHOLDER_INPUT_SCALE = 1.0   # no calibration: every input_scale holds this
_EXPERT_CHUNK = 16              # experts quantized per fp32 temporary


# ---- quantizers (ModelOpt's FP8 export, written out) ---------------------------------------
def fp8_weight_scale(amax: torch.Tensor) -> torch.Tensor:
    """ModelOpt's per-tensor FP8 weight_scale: amax (fp32) / 448 in fp32, any shape."""
    return amax.float() / E4M3_MAX


def fp8_quantize(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3(bf16(w / scale)): ModelOpt's export of a bf16 weight (`(w / weight_scale).to(e4m3)`
    with weight_scale an fp32 0-dim tensor keeps the bf16 dtype on CPU: the fp32 quotient is
    rounded to bf16, then to e4m3, both round-to-nearest-even). Written out so that a batched
    call (scale [E, 1, 1]) and a GPU give the same bits as the CPU export."""
    return (w.float() / scale.float()).to(torch.bfloat16).to(torch.float8_e4m3fn)


def _amax(w: torch.Tensor, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    a = w.abs()
    return (a.amax() if dims is None else a.amax(dim=dims)).float()


def _fp8_linear(prefix: str, q: torch.Tensor, scale: torch.Tensor, input_scale: torch.Tensor,
                out: dict[str, torch.Tensor]) -> None:
    out[prefix + ".weight"] = q
    out[prefix + ".weight_scale"] = scale
    out[prefix + ".input_scale"] = input_scale


def quantize_fp8_group(weights: Mapping[str, torch.Tensor], input_scale: torch.Tensor
                       ) -> dict[str, torch.Tensor]:
    """A fusion group {linear prefix: bf16 [N, K]} (q/k/v, or one expert's gate/up; a group
    of one for o_proj / down_proj) with one tied weight_scale = max(amax) / 448."""
    scale = fp8_weight_scale(torch.stack([_amax(w) for w in weights.values()]).amax())
    out: dict[str, torch.Tensor] = {}
    for prefix, w in weights.items():
        _fp8_linear(prefix, fp8_quantize(w, scale), scale, input_scale, out)
    return out


def quantize_experts(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """All routed experts of a layer at once: gate, up bf16 [E, I, H], down bf16 [E, H, I] ->
    (w13 e4m3 [E, 2I, H] (gate rows, then up rows), s13 fp32 [E] (tied over gate/up),
    w2 e4m3 [E, H, I], s2 fp32 [E]); per expert exactly `quantize_fp8_group`."""
    e, inter, hidden = gate.shape
    s13 = fp8_weight_scale(torch.maximum(_amax(gate, (1, 2)), _amax(up, (1, 2))))
    s2 = fp8_weight_scale(_amax(down, (1, 2)))
    w13 = torch.empty(e, 2 * inter, hidden, dtype=torch.float8_e4m3fn, device=gate.device)
    w2 = torch.empty(e, hidden, inter, dtype=torch.float8_e4m3fn, device=gate.device)
    for c in range(0, e, _EXPERT_CHUNK):
        sl = slice(c, c + _EXPERT_CHUNK)
        w13[sl, :inter] = fp8_quantize(gate[sl], s13[sl, None, None])
        w13[sl, inter:] = fp8_quantize(up[sl], s13[sl, None, None])
        w2[sl] = fp8_quantize(down[sl], s2[sl, None, None])
    return w13, s13, w2, s2


# ---- one layer: bf16 checkpoint tensors -> engine tensors ---------------------------------
def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def stack_experts(cfg: KolibriConfig, i: int, state: Mapping[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer i's routed experts of a checkpoint state dict as stacked bf16 (gate [E, I, H],
    up [E, I, H], down [E, H, I])."""
    pre = f"{layer_prefix(i)}mlp.experts."
    return tuple(torch.stack([state[f"{pre}{e}.{p}.weight"] for e in range(cfg.num_experts)])
                 for p in ("gate_proj", "up_proj", "down_proj"))


def quantize_layer(cfg: KolibriConfig, i: int, state: Mapping[str, torch.Tensor],
                   experts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                   kv: KVPlan = DEFAULT_KV, rotation: torch.Tensor | None = None
                   ) -> dict[str, torch.Tensor]:
    """Engine tensors of layer i (fp8-nvfp4 recipe) from its bf16 checkpoint tensors.

    state: the layer's checkpoint tensors by full name (the routed experts may be left out
    when `experts` = (gate, up, down) stacked as `stack_experts` gives them); kv: the cache
    plan; rotation: R [D, D] for a "hadamard-int4" full layer (`hadamard_rotation(kv_seed)`).
    Routed experts come out as views of one e4m3 tensor per layer ([E, 2I, H] and [E, H, I]).
    """
    pre = layer_prefix(i)
    att, mlp = pre + "self_attn.", pre + "mlp."
    dev = state[pre + "input_layernorm.weight"].device
    placeholder = torch.tensor(PLACEHOLDER_INPUT_SCALE, dtype=torch.float32, device=dev)
    out: dict[str, torch.Tensor] = {}
    for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        out[pre + name] = state[pre + name]
    for name in ("q_norm.weight", "k_norm.weight"):
        out[att + name] = state[att + name]
    out[mlp + "gate.weight"] = state[mlp + "gate.weight"]
    out.update(quantize_fp8_group({att + p: state[att + p + ".weight"]
                                   for p in ("q_proj", "k_proj", "v_proj")}, placeholder))
    out.update(quantize_fp8_group({att + "o_proj": state[att + "o_proj.weight"]}, placeholder))
    if cfg.shared_expert_intermediate_size > 0:
        se = mlp + "shared_expert."
        out.update(quantize_fp8_group({se + p: state[se + p + ".weight"]
                                       for p in ("gate_proj", "up_proj")}, placeholder))
        out.update(quantize_fp8_group({se + "down_proj": state[se + "down_proj.weight"]},
                                      placeholder))
    w13, s13, w2, s2 = quantize_experts(*(experts or stack_experts(cfg, i, state)))
    inter = w13.shape[1] // 2
    for e in range(cfg.num_experts):
        ex = f"{mlp}experts.{e}."
        _fp8_linear(ex + "gate_proj", w13[e, :inter], s13[e], placeholder, out)
        _fp8_linear(ex + "up_proj", w13[e, inter:], s13[e], placeholder, out)
        _fp8_linear(ex + "down_proj", w2[e], s2[e], placeholder, out)
    fmt = kv.sliding if cfg.is_sliding(i) else kv.full
    if fmt == "fp8":
        one = torch.tensor(1.0, dtype=torch.float32, device=dev)
        out[att + "k_scale"], out[att + "v_scale"] = one, one.clone()
    elif fmt in INT4_FULL:
        if fmt == "hadamard-int4" and rotation is None:
            raise ValueError(f"layer {i}: a hadamard-int4 full layer needs the rotation R")
        m_q, m_k = fold_qk_gains(state[att + "q_norm.weight"].cpu(),
                                 state[att + "k_norm.weight"].cpu(),
                                 rotation.cpu() if fmt == "hadamard-int4" else None)
        out[att + "q_rotation"], out[att + "k_rotation"] = m_q.to(dev), m_k.to(dev)
    return out


def quantize_globals(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The embedding, the final norm (bf16) and the NVFP4 LM head (`quantize_nvfp4` of the
    bf16 head; input_scale the placeholder)."""
    head = state["lm_head.weight"]
    packed, block, global_scale = quantize_nvfp4(head.to(torch.bfloat16))
    return {"model.embed_tokens.weight": state["model.embed_tokens.weight"],
            "model.norm.weight": state["model.norm.weight"],
            "lm_head.weight": packed, "lm_head.weight_scale": block,
            "lm_head.weight_scale_2": global_scale,
            "lm_head.input_scale": torch.tensor(PLACEHOLDER_INPUT_SCALE, dtype=torch.float32,
                                                device=head.device)}


def quantize_target(cfg: KolibriConfig, state: Mapping[str, torch.Tensor],
                    kv: KVPlan = DEFAULT_KV, kv_seed: int = DEFAULT_KV_SEED
                    ) -> dict[str, torch.Tensor]:
    """Every target tensor of an fp8-nvfp4 engine from a whole bf16 checkpoint state dict
    (small models; the full-size path is `synthetic_engine_tensors`, layer by layer)."""
    rotation = hadamard_rotation(kv_seed, cfg.head_dim) if kv.full == "hadamard-int4" else None
    out = quantize_globals(state)
    for i in range(cfg.num_hidden_layers):
        out.update(quantize_layer(cfg, i, state, kv=kv, rotation=rotation))
    return out


# ---- random weights, one layer at a time ---------------------------------------------------
def _generator(device: torch.device, seed: int, index: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + index)


def _randn(shape, gen: torch.Generator, device, std: float, mean: float = 0.0) -> torch.Tensor:
    """bf16 N(mean, std^2), drawn in bf16 on `device` (no fp32 copy of big tensors)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    x.mul_(std)
    return x.add_(mean) if mean else x


def random_layer(cfg: KolibriConfig, i: int, seed: int, device
                 ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Layer i's random bf16 checkpoint tensors (routed experts left out) and its routed
    experts stacked (gate [E, I, H], up [E, I, H], down [E, H, I])."""
    gen = _generator(torch.device(device), seed, i + 1)
    h, d, e, inter = (cfg.hidden_size, cfg.head_dim, cfg.num_experts,
                      cfg.moe_intermediate_size)
    hq, hkv, ish = cfg.num_attention_heads, cfg.num_key_value_heads, \
        cfg.shared_expert_intermediate_size
    pre = layer_prefix(i)
    att, mlp = pre + "self_attn.", pre + "mlp."

    def lin(n: int, k: int) -> torch.Tensor:
        return _randn((n, k), gen, device, 1.0 / math.sqrt(k))

    def gain(n: int) -> torch.Tensor:
        return _randn((n,), gen, device, 0.1, 1.0)

    state = {pre + "input_layernorm.weight": gain(h),
             pre + "post_attention_layernorm.weight": gain(h),
             att + "q_proj.weight": lin(hq * d, h), att + "k_proj.weight": lin(hkv * d, h),
             att + "v_proj.weight": lin(hkv * d, h), att + "o_proj.weight": lin(h, hq * d),
             att + "q_norm.weight": gain(d), att + "k_norm.weight": gain(d),
             mlp + "gate.weight": lin(e, h)}
    if ish > 0:
        se = mlp + "shared_expert."
        state.update({se + "gate_proj.weight": lin(ish, h), se + "up_proj.weight": lin(ish, h),
                      se + "down_proj.weight": lin(h, ish)})
    experts = (_randn((e, inter, h), gen, device, 1.0 / math.sqrt(h)),
               _randn((e, inter, h), gen, device, 1.0 / math.sqrt(h)),
               _randn((e, h, inter), gen, device, 1.0 / math.sqrt(inter)))
    return state, experts


def random_globals(cfg: KolibriConfig, seed: int, device) -> dict[str, torch.Tensor]:
    """The random bf16 embedding, final norm and LM head."""
    gen = _generator(torch.device(device), seed, 0)
    v, h = cfg.vocab_size, cfg.hidden_size
    return {"model.embed_tokens.weight": _randn((v, h), gen, device, 1.0),
            "model.norm.weight": _randn((h,), gen, device, 0.1, 1.0),
            "lm_head.weight": _randn((v, h), gen, device, 1.0 / math.sqrt(h))}


def synthetic_engine_tensors(cfg: KolibriConfig, device, seed: int = 0,
                             kv: KVPlan = DEFAULT_KV, kv_seed: int = DEFAULT_KV_SEED,
                             progress: Callable[[int, int], None] | None = None
                             ) -> dict[str, torch.Tensor]:
    """Every target tensor of a random fp8-nvfp4 engine of `cfg`, made on `device` one layer
    at a time (peak: the engine plus one layer in bf16). progress(i, n) after each layer."""
    rotation = hadamard_rotation(kv_seed, cfg.head_dim) if kv.full == "hadamard-int4" else None
    out = quantize_globals(random_globals(cfg, seed, device))
    for i in range(cfg.num_hidden_layers):
        state, experts = random_layer(cfg, i, seed, device)
        out.update(quantize_layer(cfg, i, state, experts, kv, rotation))
        del state, experts
        if progress is not None:
            progress(i + 1, cfg.num_hidden_layers)
    return out


def check_engine_tensors(cfg: KolibriConfig, tensors: Mapping[str, torch.Tensor],
                         kv: KVPlan = DEFAULT_KV) -> None:
    """Raises ValueError naming the first tensor whose name, shape or dtype differs from the
    engine contract (`expected_engine_shapes` + `kv_tensor_shapes`, fp8-nvfp4 dtypes)."""
    from ..engine_format import target_weight_group
    from ..runtime.engine_loader import expected_engine_shapes, kv_tensor_shapes

    shapes = {**expected_engine_shapes(cfg, FP8_NVFP4), **kv_tensor_shapes(cfg, kv)}
    missing, extra = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise ValueError(f"engine tensors: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, shape in shapes.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
        if name.endswith((".k_scale", ".v_scale", ".q_rotation", ".k_rotation",
                          "weight_scale_2", "input_scale")):
            want = torch.float32
        else:
            fmt = FP8_NVFP4[target_weight_group(name)]
            want = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn,
                    "nvfp4": torch.uint8}[fmt]
            if name.endswith(".weight_scale"):
                want = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float32
        if t.dtype != want:
            raise ValueError(f"{name}: dtype {t.dtype}, expected {want}")


def synthetic_plugin_model(cfg: KolibriConfig | None = None, device="cuda", seed: int = 0,
                           kv: KVPlan = DEFAULT_KV, kv_seed: int = DEFAULT_KV_SEED,
                           progress: Callable[[int, int], None] | None = None):
    """A random full-size (default `KolibriConfig()`) target as the kernel path runs it:
    `synthetic_engine_tensors`, checked against the engine contract, regrouped by
    `plugin_loader.plugin_model_from_tensors`. Returns what `load_plugin_target` returns:
    (PluginModel, DrafterTarget, FP8 KV scales {layer: (k_scale, v_scale)})."""
    from ..runtime.plugin_loader import plugin_model_from_tensors

    cfg = KolibriConfig() if cfg is None else cfg
    tensors = synthetic_engine_tensors(cfg, device, seed, kv, kv_seed, progress)
    check_engine_tensors(cfg, tensors, kv)
    return plugin_model_from_tensors(tensors, cfg, FP8_NVFP4, f"<synthetic seed {seed}>")
