"""Loading an engine's target for the kernel path (`model/plugin_model.py`): the stored low-bit
tensors go to the device as they are, regrouped into the kernels' layouts (`plugins/LAYOUTS.md`).

`load_plugin_weights` reads one weight folder for one config: the whole target, or a
tensor-parallel rank's shard (`runtime/tensor_parallel.py`: its q/k/v heads fused into one QKV
weight per rank, its slice of every expert's gate/up rows and down columns).

Fusions need shared scales: q/k/v_proj become one QKV weight and each expert's gate/up one
w13, which is exact only because ModelOpt's export ties those per-tensor scales (checked here;
an engine that breaks the rule is refused, not requantized).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint import load_tensors
from ..config import KolibriConfig
from ..drafter import DrafterTarget
from ..drafter.plugin_drafter import DrafterPlugin
from ..engine_format import TARGET_DIR
from ..errors import CheckpointError
from ..model.plugin_model import GPU_FORMATS, Head, LayerWeights, PluginModel
from .engine_loader import (Manifest, expected_engine_shapes, kv_tensor_shapes,
                            read_drafter_engine, require_unsharded)


def check_gpu_formats(manifest: Manifest) -> None:
    """Raises ValueError naming the weight group whose format the kernel path cannot run."""
    for group, fmt in manifest.target_formats.items():
        if fmt not in GPU_FORMATS[group]:
            raise ValueError(f"engine {manifest.path}: weights.target.{group} is {fmt!r}; the GPU "
                             f"path runs {list(GPU_FORMATS[group])} (build with --weights fp8-nvfp4)")


def load_plugin_target(engine_dir: Path, manifest: Manifest, device: str | torch.device
                       ) -> tuple[PluginModel, DrafterTarget, dict[int, tuple[float, float]]]:
    """The target of `engine_dir` as a `PluginModel` on `device`, the `DrafterTarget` the
    drafter borrows (embedding; the engine's drafter has its own head slice, so the target
    head is a shape-only meta tensor), and the FP8 KV scales {layer: (k_scale, v_scale)}.

    Raises:
        ValueError: a weight format the kernels do not run (names the group), or a
            tensor-parallel engine (names tensor_parallel_size).
        CheckpointError: missing/mis-shaped tensors, or per-tensor scales that a fusion needs
            equal but are not (names the file and tensor).
    """
    check_gpu_formats(manifest)
    require_unsharded(manifest)
    folder = Path(engine_dir) / TARGET_DIR
    cfg = KolibriConfig.from_json(folder / "config.json")
    return load_plugin_weights(folder, cfg, manifest, device)


def load_plugin_weights(folder: Path, cfg: KolibriConfig, manifest: Manifest,
                        device: str | torch.device, with_head: bool = True, all_reduce=None
                        ) -> tuple[PluginModel, DrafterTarget, dict[int, tuple[float, float]]]:
    """`load_plugin_target` from the weights in `folder` for a model of `cfg`: the whole target
    (`target/`), or one tensor-parallel rank's shard config and folder (`target/rank{r}`, as
    `engine_loader.load_target_weights`). with_head=False: a model without LM head (a rank
    that does not sample; the stored head is not kept); all_reduce: `PluginModel`'s hook.
    Same returns and errors as `load_plugin_target` (formats are the caller's to check)."""
    shapes = {**expected_engine_shapes(cfg, manifest.target_formats),
              **kv_tensor_shapes(cfg, manifest.kv)}
    t = load_tensors(folder, shapes, device=device)
    return plugin_model_from_tensors(t, cfg, manifest.target_formats, folder, with_head,
                                     all_reduce)


def plugin_model_from_tensors(t: dict[str, torch.Tensor], cfg: KolibriConfig,
                              formats: dict[str, str], source: Path | str,
                              with_head: bool = True, all_reduce=None
                              ) -> tuple[PluginModel, DrafterTarget, dict[int, tuple]]:
    """The tensor-dict -> `PluginModel` part of `load_plugin_weights`, for engine tensors
    already in memory (names, dtypes and shapes of `expected_engine_shapes` +
    `kv_tensor_shapes`, on the model's device; e.g. `builder/synthetic.py`). formats: the
    manifest's target formats; source: what errors name. Each layer's fused weights are popped
    from `t` as they are regrouped (peak memory: the tensors plus one layer). Same returns and
    errors as `load_plugin_target`."""
    layers = [_layer(cfg, t, i, Path(source)) for i in range(cfg.num_hidden_layers)]
    head = None
    if with_head:
        head = Head(formats["lm_head"], t["lm_head.weight"],
                    t["lm_head.weight_scale"], t.get("lm_head.weight_scale_2"))
    embed = t["model.embed_tokens.weight"]
    model = PluginModel(cfg, embed, t["model.norm.weight"], layers, head, all_reduce)
    head_shape = torch.empty(cfg.vocab_size, cfg.hidden_size, device="meta")
    scales = {i: (float(t[f"model.layers.{i}.self_attn.k_scale"]),
                  float(t[f"model.layers.{i}.self_attn.v_scale"]))
              for i in range(cfg.num_hidden_layers)
              if f"model.layers.{i}.self_attn.k_scale" in t}
    return model, DrafterTarget(embed, head_shape, cfg.num_hidden_layers), scales


def _tied_scale(t: dict, names: list[str], folder: Path) -> torch.Tensor:
    """The one per-tensor scale that `names` (tensor stems) share; CheckpointError if not."""
    first = t[names[0] + ".weight_scale"]
    for name in names[1:]:
        if not torch.equal(t[name + ".weight_scale"], first):
            raise CheckpointError(folder, f"weight_scale differs from {names[0]}.weight_scale; "
                                  "the fused kernel needs them tied (ModelOpt export does this)",
                                  tensor=name + ".weight_scale")
    return first.float().reshape(())


def _layer(cfg: KolibriConfig, t: dict, i: int, folder: Path) -> LayerWeights:
    """Layer i regrouped; the fused weights are popped from `t` so that each stored tensor is
    freed once copied (peak memory: the engine plus one layer)."""
    pre = f"model.layers.{i}."
    att, mlp = pre + "self_attn.", pre + "mlp."
    qkv = [att + p for p in ("q_proj", "k_proj", "v_proj")]
    experts = [f"{mlp}experts.{e}." for e in range(cfg.num_experts)]
    w13, s13, w2, s2 = [], [], [], []
    for e in experts:
        s13.append(_tied_scale(t, [e + "gate_proj", e + "up_proj"], folder))
        w13.append(torch.cat([t.pop(e + "gate_proj.weight"), t.pop(e + "up_proj.weight")]))
        w2.append(t.pop(e + "down_proj.weight"))
        s2.append(t[e + "down_proj.weight_scale"].float().reshape(()))
    shared = None
    if cfg.shared_expert_intermediate_size > 0:
        se = mlp + "shared_expert."
        shared = (torch.cat([t.pop(se + "gate_proj.weight"), t.pop(se + "up_proj.weight")])[None],
                  _tied_scale(t, [se + "gate_proj", se + "up_proj"], folder).reshape(1),
                  t.pop(se + "down_proj.weight")[None].contiguous(),
                  t[se + "down_proj.weight_scale"].float().reshape(1))
    rotation = None
    if att + "q_rotation" in t:
        rotation = (t[att + "q_rotation"].float().contiguous(),
                    t[att + "k_rotation"].float().contiguous())
    return LayerWeights(
        input_norm=t[pre + "input_layernorm.weight"],
        post_norm=t[pre + "post_attention_layernorm.weight"],
        qkv=torch.cat([t.pop(n + ".weight") for n in qkv]).contiguous(),
        qkv_scale=_tied_scale(t, qkv, folder),
        o_proj=t[att + "o_proj.weight"], o_scale=t[att + "o_proj.weight_scale"].float(),
        q_norm=t[att + "q_norm.weight"], k_norm=t[att + "k_norm.weight"], rotation=rotation,
        router=t[mlp + "gate.weight"].to(torch.bfloat16).contiguous(),
        w13=torch.stack(w13).contiguous(), w13_scale=torch.stack(s13).contiguous(),
        w2=torch.stack(w2).contiguous(), w2_scale=torch.stack(s2).contiguous(), shared=shared)


def load_plugin_drafter(engine_dir: str | Path, manifest: Manifest, target,
                        device: str | torch.device, attn: str = "dense") -> DrafterPlugin:
    """The drafter of `engine_dir/drafter` as a `DrafterPlugin` on `device`, bound to the
    target's embedding (`target`: a `DrafterTarget`, e.g. from `load_plugin_target`, or a
    `KolibriForCausalLM`); attn: "dense" | "sdpa" | "kernel" (the ring attention's implementation).

    Raises:
        CheckpointError: no drafter in the engine, or bad files (names file / tensor).
        ValueError: a drafter weight format this path does not run (names the group).
    """
    cfg, tgt, vocab, tensors, formats, _ = read_drafter_engine(Path(engine_dir), manifest,
                                                               target, device)
    return DrafterPlugin.from_tensors(cfg, tensors, formats, tgt, vocab.to(device), attn=attn)
