"""The build steps, writing into a temporary engine folder (`engine.build_engine` renames it).

Steps: load both checkpoints (bf16) -> calibrate (quantized recipes) -> target tensors ->
drafter tensors -> write `target/`, `drafter/` (and `onnx/`) -> hash -> manifest.json.
"""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import torch

from .. import __version__
from .. import engine_format as ef
from ..checkpoint import save_tensors
from ..config_io import write_json_atomic
from ..drafter.block_drafter import DRAFT_VOCAB
from . import modelopt_backend as mo
from .calibration import Captures, capture_drafter_head, capture_target, tokenize
from .drafter import (
    drafter_hf_quant_config,
    drafter_quantization_config,
    drafter_tensors,
)
from .engine import TOKENIZER_FILES, BuildOptions, Plan, load_models, source_files, work
from .manifest import hash_files, provenance, sha256_file
from .quantize import round_amax_up
from .recipes import load_calibration_set
from .target import target_tensors
from .tp_shard import tensor_parallel_manifest, write_target_shards


def assemble(plan: Plan, tmp: Path, progress, opts: BuildOptions) -> None:
    """Write the whole engine into `tmp` (see the module docstring)."""
    stats, cal = plan.stats, plan.recipe.calibration
    sources = source_files(plan)
    progress.grow(5 + bool(opts.export_onnx))   # the advance() calls below
    if plan.recipe.quantized:
        with stats.stage("startup"):         # importing ModelOpt: a fixed cost, not per tensor
            mo.require_modelopt(f"recipe {plan.recipe.name!r}")
    with stats.stage("load", sum(p.stat().st_size for p in sources.values())):
        model, drafter = load_models(plan)
    progress.advance("loaded checkpoints")
    cap, head_amax, calib = None, None, None
    if cal is not None:
        cap, head_amax, calib = _calibrate(plan, model, drafter, progress)
    round_amax = partial(round_amax_up, steps_per_octave=cal.amax_grid_steps_per_octave) \
        if cal is not None else (lambda a: a)
    state = model.state_dict()
    t_tensors, t_formats = target_tensors(plan.cfg, state, plan.recipe, plan.kv, cap,
                                          round_amax, stats)
    progress.advance("quantized target")
    d_tensors, d_formats = drafter_tensors(
        drafter.state_dict(), state["lm_head.weight"][drafter.draft_vocab], plan.recipe,
        None if head_amax is None else round_amax(head_amax), stats)
    progress.advance("quantized drafter")
    with stats.stage("write") as st:
        _write_target(plan, tmp / ef.TARGET_DIR, t_tensors, t_formats, opts.max_shard_bytes)
        _write_drafter(plan, tmp / ef.DRAFTER_DIR, d_tensors, d_formats)
        st.work += sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
    progress.advance("wrote weights")
    if opts.export_onnx:
        from .onnx_export import export_drafter_onnx
        export_drafter_onnx(drafter, d_tensors, d_formats, tmp / "onnx")
        progress.advance("exported ONNX")
    _write_manifest(plan, tmp, sources, calib, stats)
    progress.advance("manifest")


def _calibrate(plan: Plan, model, drafter, progress) -> tuple[Captures, float, dict]:
    cal = plan.recipe.calibration
    cal_set = load_calibration_set(cal.data, plan.recipes_dir)
    seqs = tokenize(cal_set, plan.model_dir, plan.cfg.bos_token_id, plan.cfg.vocab_size,
                    cal.max_tokens_per_sequence)
    tokens = sum(int(s.numel()) for s in seqs)
    progress.grow(len(seqs))
    with plan.stats.stage("calibrate", work(plan, tokens)["calibrate"]):
        cap = capture_target(model, seqs, plan.dcfg.target_layer_ids,
                             on_sequence=partial(progress.advance, "calibrating"))
        head_in = capture_drafter_head(drafter, cap)
    head_amax = max(float(x.float().abs().max()) for x in head_in)
    calib = {"set": cal_set.name, "file": f"build/{cal.data}", "sequences": len(seqs),
             "tokens": tokens, "languages": sorted({lang for lang, _ in cal_set.texts}),
             "max_tokens_per_sequence": cal.max_tokens_per_sequence,
             "algorithm": f"ModelOpt mtq.quantize, algorithm {cal.algorithm!r}, on CPU",
             "experts": "every routed expert calibrated on all tokens (not only routed ones)",
             "amax_rounding": f"up to 2^(k/{cal.amax_grid_steps_per_octave})",
             "drafter_head": "drafter.norm output over one block pass per sentence"}
    return cap, head_amax, calib


def _write_target(plan: Plan, d: Path, tensors: dict, formats: dict, shard: int | None) -> None:
    if plan.tp_size == 1:
        save_tensors(d, tensors, max_shard_bytes=shard)
    else:                       # one weight folder per tensor-parallel rank (tp_shard.py)
        write_target_shards(d, tensors, plan.tp_size, shard)
    config = plan.cfg.to_dict()
    kv_algo = "FP8" if plan.kv.sliding == plan.kv.full == "fp8" else None
    if any(f is not None for f in formats.values()) or kv_algo is not None:
        hf = mo.hf_quant_config(formats, kv_algo)
        write_json_atomic(d / "hf_quant_config.json", hf)
        config["quantization_config"] = mo.quantization_config(hf)
    write_json_atomic(d / "config.json", config)
    for name in TOKENIZER_FILES:
        if (plan.model_dir / name).is_file():
            shutil.copyfile(plan.model_dir / name, d / name)


def _write_drafter(plan: Plan, d: Path, tensors: dict, formats: dict) -> None:
    save_tensors(d, tensors)
    config = plan.dcfg.to_dict()
    hf = drafter_hf_quant_config(formats, __version__)
    if hf is not None:
        write_json_atomic(d / "hf_quant_config.json", hf)
        config["quantization_config"] = drafter_quantization_config(hf)
    write_json_atomic(d / "config.json", config)
    shutil.copyfile(plan.drafter_dir / DRAFT_VOCAB, d / DRAFT_VOCAB)


def _write_manifest(plan: Plan, tmp: Path, sources: dict, calib: dict | None, stats) -> None:
    with stats.stage("hash") as st:
        files = hash_files(tmp)
        src = {k: sha256_file(p) for k, p in sources.items()}
        st.work += sum(p.stat().st_size for p in sources.values())
        st.work += sum((tmp / k).stat().st_size for k in files)
    weights = {"target": dict(plan.recipe.target), "drafter": dict(plan.recipe.drafter)}
    by_mo, ours = provenance(weights, plan.kv.full, plan.kv.sliding)
    manifest = {
        "schema_version": ef.SCHEMA_VERSION, "kolibri_trt_version": __version__,
        "torch_version": torch.__version__,
        "modelopt_version": mo.modelopt_version() if plan.recipe.quantized else None,
        "target": plan.spec.name, "gpu_arch": plan.spec.gpu_arch,
        "recipe": {"target": plan.spec.to_dict(), "weights": plan.recipe.to_dict(),
                   "kv_cache": plan.kv.to_dict()},
        "weights": weights,
        "kv_cache": {"plan": plan.kv.name, "sliding": plan.kv.sliding, "full": plan.kv.full,
                     "seed": plan.kv.seed, "head_dim": plan.cfg.head_dim,
                     "fp8_scales": "k_scale = v_scale = 1.0 (uncalibrated)",
                     "rotation": "R = H diag(s) / sqrt(head_dim), s from the seed "
                                 "(kolibri_trt.builder.hadamard.hadamard_rotation), the same "
                                 "R in every full layer; softmax scale not folded"},
        "calibration": calib, "sources": src, "files": files,
        "written_by_modelopt": by_mo, "written_by_kolibri_trt": ours,
        "tp_size": plan.tp_size,
    }
    if plan.tp_size > 1:
        manifest["tensor_parallel"] = tensor_parallel_manifest(plan.tp_size)
    write_json_atomic(tmp / ef.MANIFEST, manifest)
