"""The engine directory written by `build.py` and read by the runtime: the one contract.

```
<engine>/manifest.json                 schema below; the runtime reads it and never guesses
<engine>/target/config.json            KolibriConfig fields + "quantization_config" (ModelOpt)
<engine>/target/hf_quant_config.json   ModelOpt's description of the quantized modules
<engine>/target/model.safetensors      (or shards + model.safetensors.index.json)
<engine>/target/tokenizer.json, tokenizer_config.json
<engine>/drafter/config.json           DrafterConfig fields + "quantization_config"
<engine>/drafter/model.safetensors
<engine>/drafter/draft_vocab.json
```
A tensor-parallel build (`build.py --tp N`, manifest "tp_size": N > 1) stores the target's
weights as one folder per rank instead, `<engine>/target/rank0/model.safetensors` ..
`<engine>/target/rank{N-1}/...` (each a complete set of tensor names with the rank's slice:
`kolibri_trt/builder/tp_shard.py` has the split rules); config.json, hf_quant_config.json and
the tokenizer stay in `<engine>/target/` and describe the whole model. The drafter is never
sharded.

Tensor naming follows ModelOpt's Hugging Face export (`shared/notes/modelopt.md`), so that
TensorRT-LLM, vLLM and SGLang can read the weights. For a linear `X` (a `...proj`, `fuse`,
`fc`, `spine.A`, ...) with weight format:
- "bf16":        `X.weight` bf16 [N, K]
- "fp8":         `X.weight` float8_e4m3fn [N, K], `X.weight_scale` fp32 [] (amax/448),
                 `X.input_scale` fp32 [] (static activation scale from calibration)
- "block_fp8":   `X.weight` float8_e4m3fn [N, K], `X.weight_scale` fp32 [N, ceil(K/64)]
                 (one scale per output row and per 64 inputs, a last partial block of K % 64
                 inputs has its own; ModelOpt cannot export this)
- "nvfp4":       `X.weight` uint8 [N, K/2] (element 2i in the low nibble), `X.weight_scale`
                 float8_e4m3fn [N, K/16], `X.weight_scale_2` fp32 [], `X.input_scale` fp32 [];
                 w = e2m1(code) * weight_scale * weight_scale_2
Never quantized: `model.embed_tokens`, every norm, the routers `mlp.gate`, `q_norm`/`k_norm`.
The drafter's head slice (the draft-vocabulary rows of the target's lm_head) is stored in the
drafter folder as `lm_head.*` in the head format.

KV cache tensors (`shared/spec/kv-cache.md`):
- layers with FP8 KV (sliding layers; full layers too with "fp8"):
  `model.layers.L.self_attn.k_scale`, `.v_scale` fp32 [] (1.0 unless calibrated);
- full layers with "hadamard-int4": `model.layers.L.self_attn.q_rotation` fp32 [D, D] = M_q =
  R·diag(g_q ⊙ g_k) and `model.layers.L.self_attn.k_rotation` fp32 [D, D] = M_k = R, with
  R = H·diag(s)/sqrt(D), s the random signs drawn from manifest["kv_cache"]["seed"] (softmax
  scale not folded); "int4" (no rotation, for the accuracy comparison) stores
  M_q = diag(g_q ⊙ g_k) and M_k = identity under the same names.

manifest.json (schema_version 1):
{
  "schema_version": 1,
  "kolibri_trt_version": str, "torch_version": str, "modelopt_version": str | null,
  "target": "gb10" | "h100" | "h200" | "cpu",  "gpu_arch": "sm_121" | "sm_90" | null,
  "recipe": {...the recipe as loaded from build/...},
  "weights": {"target": {group: format}, "drafter": {group: format}},
      groups: "attention", "experts", "shared_expert", "router", "embedding", "norms",
              "lm_head"; drafter: "body", "head"
  "kv_cache": {"sliding": "fp8" | "bf16", "full": "hadamard-int4" | "int4" | "fp8" | "bf16",
               "seed": int, "head_dim": int, ...descriptive keys ("plan", "rotation")},
  "calibration": {"set", "file", "sequences", "tokens", ...how} | null (null: nothing calibrated),
  "sources": {relative source path: sha256 hex},   every file the build read
  "files": {relative engine path: sha256 hex},      every file the build wrote
  "written_by_modelopt": [tensor-name globs],
  "written_by_kolibri_trt": [{"tensors": glob, "why": str}],
  "tp_size": int >= 1,       tensor-parallel ranks the target is sharded for (absent in engines
                             built before tensor parallelism: read as 1, the unsharded layout)
  "tensor_parallel": {"shards": [...], ...descriptive}     only when tp_size > 1
}
"""

from __future__ import annotations

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
TARGET_DIR = "target"
DRAFTER_DIR = "drafter"

WEIGHT_FORMATS = ("bf16", "fp8", "block_fp8", "nvfp4")
SLIDING_KV_FORMATS = ("fp8", "bf16")
FULL_KV_FORMATS = ("hadamard-int4", "int4", "fp8", "bf16")
BUILD_TARGETS = ("gb10", "h100", "h200", "cpu")
BLOCK_FP8_GROUP = 64      # inputs per block-FP8 scale (spec: block-drafter.md §Serving)
NVFP4_GROUP = 16          # inputs per NVFP4 block scale (ModelOpt)


def rank_dir(rank: int) -> str:
    """The folder of rank `rank`'s target weights inside `target/` of a tensor-parallel engine."""
    return f"rank{rank}"


def target_weight_group(name: str) -> str:
    """The manifest group of a target tensor name (`manifest["weights"]["target"]` keys).

    Raises:
        ValueError: a name outside the spec's tensor list (`kolibri-1.md` §Tensor names).
    """
    if name.startswith("model.embed_tokens."):
        return "embedding"
    if name.startswith("lm_head."):
        return "lm_head"
    if name.startswith("model.norm.") or name.endswith("layernorm.weight") \
            or ".self_attn.q_norm." in name or ".self_attn.k_norm." in name:
        return "norms"
    if ".self_attn." in name:
        return "attention"
    if ".mlp.experts." in name:
        return "experts"
    if ".mlp.shared_expert." in name:
        return "shared_expert"
    if ".mlp.gate." in name:
        return "router"
    raise ValueError(f"tensor {name!r} belongs to no weight group of the spec")


def drafter_weight_group(name: str) -> str:
    """The manifest group of a drafter tensor: "head" (the lm_head slice), "norms", "body"."""
    if name.startswith("lm_head."):
        return "head"
    if name.endswith("norm.weight") or name.startswith("tap_norms.") or name == "mask_embedding":
        return "norms"
    return "body"
