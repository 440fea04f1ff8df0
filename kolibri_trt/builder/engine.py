"""`build_engine`: checkpoint (+ drafter) -> engine directory (`kolibri_trt/engine_format.py`).

Order: resolve recipes and inputs (every error before any work), load and check the
checkpoints, calibrate, quantize the target and the drafter, write everything into a
temporary folder beside the output, hash it, write manifest.json, rename. A failure or an
interrupt removes the temporary folder: no half-written engine is ever left at `out`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..checkpoint import tensor_files
from ..config import KolibriConfig
from ..drafter import DrafterConfig, KolibriBlockDrafter
from ..drafter.block_drafter import DRAFT_VOCAB
from ..model.reference import KolibriForCausalLM
from .errors import BuildError
from .estimate import BuildStats, stage_work
from .progress import Progress
from .recipes import (
    RECIPES_DIR,
    KvPlan,
    TargetSpec,
    WeightsRecipe,
    load_kv_plan,
    load_target,
    load_weights_recipe,
)
from .target import check_kv_plan

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
DEFAULT_SHARD_BYTES = 5 * 2**30
# The embedded default: the trained mini Kolibri target and its distilled block drafter
# (checkpoints/kolibri-mini/README.md), shipped in the repository beside this package.
DEFAULT_CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints" / "kolibri-mini"


@dataclass(frozen=True)
class BuildOptions:
    """What to build. model / drafter: checkpoint folders (None: the embedded default,
    `DEFAULT_CHECKPOINTS`); out: engine folder (None: engines/<target>); weights /
    kv_cache: recipe and plan names (None: the files' defaults); tp_size: tensor-parallel
    ranks the target is sharded for (1: unsharded; `tp_shard.py`)."""

    target: str
    model: Path | None = None
    drafter: Path | None = None
    out: Path | None = None
    weights: str | None = None
    kv_cache: str | None = None
    force: bool = False
    export_onnx: bool = False
    progress: bool = True
    recipes_dir: Path = RECIPES_DIR
    max_shard_bytes: int | None = DEFAULT_SHARD_BYTES
    tp_size: int = 1


@dataclass
class Plan:
    """Resolved build inputs (all checked before any heavy work)."""

    spec: TargetSpec
    recipe: WeightsRecipe
    kv: KvPlan
    model_dir: Path
    drafter_dir: Path
    out: Path
    cfg: KolibriConfig
    dcfg: DrafterConfig
    recipes_dir: Path
    stats: BuildStats = field(default_factory=BuildStats)
    tp_size: int = 1


def resolve(opts: BuildOptions) -> Plan:
    """Check options, recipes and both configs; make the default fixtures if needed.

    Raises:
        BuildError: unknown target / recipe / plan, a combination the target does not
            accept, an existing output without `force`, --drafter without --model, a
            checkpoint that is already quantized, a KV plan the head_dim cannot take, a
            --tp the target does not accept or the model cannot be split by.
        CheckpointError: a checkpoint that is not Kolibri-1 or a drafter that does not fit.
    """
    spec = load_target(opts.target, opts.recipes_dir)
    recipe = load_weights_recipe(opts.weights, opts.recipes_dir)
    kv = load_kv_plan(opts.kv_cache, opts.recipes_dir)
    for kind, name, allowed in (("--weights", recipe.name, spec.weights),
                                ("--kv-cache", kv.name, spec.kv_cache)):
        if name not in allowed:
            raise BuildError(f"{kind} {name!r} is not available for target {spec.name!r} "
                             f"(it accepts {list(allowed)})")
    out = Path(opts.out) if opts.out is not None else Path("engines") / spec.name
    if out.exists() and not opts.force:
        raise BuildError(f"output folder {out} exists; pass --force to replace it")
    model_dir, drafter_dir = _inputs(opts)
    cfg = KolibriConfig.from_json(model_dir / "config.json")
    if "quantization_config" in cfg.extra:
        raise BuildError(f"{cfg.source}: has a quantization_config; the builder needs the bf16 "
                         "release checkpoint, not an engine or a quantized export")
    check_kv_plan(cfg, kv)
    _check_tp(opts.tp_size, spec, cfg, recipe)
    if not (model_dir / "tokenizer.json").is_file():
        raise BuildError(f"{model_dir / 'tokenizer.json'}: missing; the engine carries the "
                         "checkpoint's tokenizer")
    dcfg = DrafterConfig.from_json(drafter_dir / "config.json")
    plan = Plan(spec, recipe, kv, model_dir, drafter_dir, out, cfg, dcfg, Path(opts.recipes_dir),
                tp_size=opts.tp_size)
    check_drafter_fits(plan)
    return plan


def _check_tp(tp_size, spec: TargetSpec, cfg: KolibriConfig, recipe: WeightsRecipe) -> None:
    """BuildError naming --tp: not an accepted size of the target, or a model / recipe that
    cannot be split that many ways (heads, intermediate sizes, quantization blocks)."""
    from .tp_shard import check_tp
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise BuildError(f"--tp: must be an int >= 1, got {tp_size!r}")
    if tp_size not in spec.tensor_parallel:
        raise BuildError(f"--tp {tp_size} is not available for target {spec.name!r} (it "
                         f"accepts {list(spec.tensor_parallel)})")
    try:
        check_tp(cfg, tp_size, recipe.target)
    except ValueError as exc:
        raise BuildError(f"--tp {tp_size}: {exc}") from None


def _inputs(opts: BuildOptions) -> tuple[Path, Path]:
    if opts.model is None:
        if opts.drafter is not None:
            raise BuildError(f"--drafter given without --model: give the target the drafter "
                             f"was trained for (the embedded default's: "
                             f"{DEFAULT_CHECKPOINTS / 'target'})")
        if not (DEFAULT_CHECKPOINTS / "target" / "config.json").is_file():
            raise BuildError(f"the embedded default checkpoints are missing under "
                             f"{DEFAULT_CHECKPOINTS} (a checkout without checkpoints/?): "
                             "pass --model and --drafter")
        return DEFAULT_CHECKPOINTS / "target", DEFAULT_CHECKPOINTS / "drafter"
    if opts.drafter is None:
        raise BuildError(f"--model {opts.model} given without --drafter: an engine holds the "
                         "target and its drafter")
    return Path(opts.model), Path(opts.drafter)


def build_engine(opts: BuildOptions) -> tuple[Path, BuildStats]:
    """Build the engine described by `opts`; returns (engine folder, stage timings).

    Raises: see `resolve`; also BuildError / CheckpointError from loading, calibration and
    quantization, each naming the input at fault.
    """
    plan = resolve(opts)
    plan.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=plan.out.parent, prefix=f".{plan.out.name}.building-"))
    try:
        with Progress(enabled=opts.progress) as progress:
            from .assemble import assemble
            assemble(plan, tmp, progress, opts)
        tmp.chmod(0o755)
        _replace(tmp, plan.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return plan.out, plan.stats


def _replace(tmp: Path, out: Path) -> None:
    """Move the finished `tmp` to `out`, removing an old `out` only once `tmp` is in place."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def source_files(plan: Plan) -> dict[str, Path]:
    """Every file the build reads, by manifest key ("target/...", "drafter/...", "build/...")."""
    out: dict[str, Path] = {}
    for role, d in (("target", plan.model_dir), ("drafter", plan.drafter_dir)):
        for p in sorted(set(tensor_files(d).values())):
            out[f"{role}/{p.name}"] = p
        out[f"{role}/config.json"] = d / "config.json"
    out[f"drafter/{DRAFT_VOCAB}"] = plan.drafter_dir / DRAFT_VOCAB
    for name in TOKENIZER_FILES:
        if (plan.model_dir / name).is_file():
            out[f"target/{name}"] = plan.model_dir / name
    recipe_files = ["targets.toml", "weights.toml", "kv-cache.toml"]
    if plan.recipe.calibration is not None:
        recipe_files.append(plan.recipe.calibration.data)
    for name in recipe_files:
        out[f"build/{name}"] = plan.recipes_dir / name
    return dict(sorted(out.items()))


def load_models(plan: Plan) -> tuple[KolibriForCausalLM, KolibriBlockDrafter]:
    """The target and drafter in bf16 (strict loaders: CheckpointError names what is wrong,
    including a drafter that does not fit its target)."""
    model = KolibriForCausalLM.from_pretrained(plan.model_dir, dtype=torch.bfloat16)
    drafter = KolibriBlockDrafter.from_pretrained(plan.drafter_dir, target=model,
                                                  dtype=torch.bfloat16)
    return model, drafter


def work(plan: Plan, tokens: int) -> dict[str, float]:
    """Per-stage work of this build (for the throughput report)."""
    return stage_work(plan.cfg, plan.dcfg, tokens)


def check_drafter_fits(plan: Plan) -> None:
    """Early check from the configs alone: the drafter's hidden size and tapped layers fit
    the target (CheckpointError naming the drafter's config.json and the field)."""
    from ..drafter.block_drafter import check_fits_target
    from ..drafter.reference import DrafterTarget

    meta = torch.empty(plan.cfg.vocab_size, plan.cfg.hidden_size, device="meta")
    check_fits_target(plan.dcfg, DrafterTarget(meta, meta, plan.cfg.num_hidden_layers),
                      plan.drafter_dir / "config.json")

