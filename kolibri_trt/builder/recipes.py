"""Build recipes as data: `build/*.toml` read into frozen dataclasses, checked on load.

Files (repository root `build/`, see `build/README.md`):
- `targets.toml`   targets gb10 / h100 / h200 / cpu: GPU arch, kernels, dtypes, what they accept;
- `weights.toml`   weight recipes ("fp8-nvfp4", "bf16"): the format of every tensor group;
- `kv-cache.toml`  KV-cache plans ("hadamard-int4", "int4", "fp8", "bf16") and the rotation seed;
- `calibration.toml` the built-in calibration sentences.
Every error is a `BuildError` naming the file and the key (unknown keys are errors too).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine_format import (
    BUILD_TARGETS,
    FULL_KV_FORMATS,
    SLIDING_KV_FORMATS,
    WEIGHT_FORMATS,
)
from .errors import BuildError

RECIPES_DIR = Path(__file__).resolve().parents[2] / "build"
SCHEMA_VERSION = 1
TARGET_GROUPS = {  # group -> formats the builder can write for it
    "attention": ("bf16", "fp8"), "experts": ("bf16", "fp8"), "shared_expert": ("bf16", "fp8"),
    "router": ("bf16",), "embedding": ("bf16",), "norms": ("bf16",), "lm_head": ("bf16", "nvfp4"),
}
DRAFTER_GROUPS = {"body": ("bf16", "block_fp8"), "head": ("bf16", "nvfp4")}
KERNEL_ROLES = ("fp8_linear", "block_fp8_linear", "nvfp4_linear", "moe", "sliding_attention",
                "full_attention", "qk_norm_fold")


class _Table:
    """Typed access to one TOML table; `close()` rejects keys nobody read."""

    def __init__(self, data: Any, path: Path, where: str):
        self.path, self.where = path, where
        if not isinstance(data, dict):
            raise self.error("", f"must be a table, got {type(data).__name__}")
        self.data, self.seen = data, set()

    def error(self, key: str, message: str) -> BuildError:
        name = ".".join(p for p in (self.where, key) if p) or "<top level>"
        return BuildError(f"{self.path}: key {name!r}: {message}")

    def get(self, key: str, kind: type | tuple, default: Any = ...) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is ...:
                raise self.error(key, "missing")
            return default
        value = self.data[key]
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise self.error(key, f"must be {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            raise self.error(key, f"must be one of {list(choices)}, got {value!r}")
        return value

    def table(self, key: str) -> _Table:
        return _Table(self.get(key, dict), self.path, ".".join(p for p in (self.where, key) if p))

    def close(self) -> None:
        for key in self.data:
            if key not in self.seen:
                raise self.error(key, "unknown key")


def _read(path: Path) -> _Table:
    if not path.is_file():
        raise BuildError(f"{path}: recipe file not found")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"{path}: not valid TOML ({exc})") from None
    top = _Table(data, path, "")
    if top.get("schema_version", int) != SCHEMA_VERSION:
        raise top.error("schema_version", f"must be {SCHEMA_VERSION}")
    return top


def _pick(names: list[str], name: str, what: str, option: str, path: Path) -> str:
    if name not in names:
        raise BuildError(f"unknown {option} {name!r}: {what} are {sorted(names)} ({path})")
    return name


@dataclass(frozen=True)
class TargetSpec:
    """One build target. gpu_arch: "sm_121" / "sm_90" or None (cpu); memory_gib: device memory
    (0 = host); kernels: role -> plugin module name or "reference"; dtypes: role -> torch dtype
    name; weights / kv_cache: the recipe and plan names this target accepts; tensor_parallel:
    the tp sizes (`build.py --tp`) it accepts (GPUs of one host; 1 = unsharded)."""

    name: str
    description: str
    gpu_arch: str | None
    memory_gib: int
    nvfp4_native: bool
    weights: tuple[str, ...]
    kv_cache: tuple[str, ...]
    dtypes: dict[str, str] = field(hash=False)
    kernels: dict[str, str] = field(hash=False)
    tensor_parallel: tuple[int, ...] = (1,)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "gpu_arch": self.gpu_arch,
                "memory_gib": self.memory_gib, "nvfp4_native": self.nvfp4_native,
                "dtypes": dict(self.dtypes), "kernels": dict(self.kernels),
                "tensor_parallel": list(self.tensor_parallel)}


def load_target(name: str, recipes_dir: Path = RECIPES_DIR) -> TargetSpec:
    """Read `targets.toml` and return target `name`.

    Raises:
        BuildError: unknown target (lists the known ones) or a malformed entry (file + key).
    """
    path = Path(recipes_dir) / "targets.toml"
    top = _read(path)
    targets = top.table("targets")
    top.close()
    if sorted(targets.data) != sorted(BUILD_TARGETS):
        raise targets.error("", f"must define exactly {sorted(BUILD_TARGETS)}")
    _pick(list(targets.data), name, "known targets", "--target", path)
    t = targets.table(name)
    spec = TargetSpec(
        name=name, description=t.get("description", str),
        gpu_arch=t.get("gpu_arch", str, None), memory_gib=t.get("memory_gib", int),
        nvfp4_native=t.get("nvfp4_native", bool),
        weights=tuple(_str_list(t, "weights")), kv_cache=tuple(_str_list(t, "kv_cache")),
        dtypes=_str_table(t.table("dtypes"), ("activations", "accumulation")),
        kernels=_str_table(t.table("kernels"), KERNEL_ROLES),
        tensor_parallel=_tp_sizes(t, "tensor_parallel"))
    t.close()
    return spec


def _tp_sizes(t: _Table, key: str) -> tuple[int, ...]:
    value = t.get(key, list)
    if not value or 1 not in value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise t.error(key, f"must be a list of ints >= 1 that contains 1, got {value!r}")
    return tuple(value)


def _str_list(t: _Table, key: str) -> list[str]:
    value = t.get(key, list)
    if not all(isinstance(v, str) for v in value):
        raise t.error(key, f"must be a list of strings, got {value!r}")
    return value


def _str_table(t: _Table, keys: tuple[str, ...]) -> dict[str, str]:
    out = {k: t.get(k, str) for k in keys}
    t.close()
    return out


@dataclass(frozen=True)
class CalibrationSpec:
    """How static input scales are calibrated: ModelOpt `algorithm` ("max") over the sentences
    of `data` (a file in the recipes folder), each cut to `max_tokens_per_sequence` tokens;
    calibrated amax is rounded up to the grid 2^(k / amax_grid_steps_per_octave)."""

    algorithm: str
    data: str
    max_tokens_per_sequence: int
    amax_grid_steps_per_octave: int


@dataclass(frozen=True)
class WeightsRecipe:
    """Weight formats per tensor group (`TARGET_GROUPS`, `DRAFTER_GROUPS`); `calibration` is
    None for recipes without static input scales (all bf16)."""

    name: str
    description: str
    target: dict[str, str] = field(hash=False)
    drafter: dict[str, str] = field(hash=False)
    calibration: CalibrationSpec | None = None

    @property
    def quantized(self) -> bool:
        return any(f != "bf16" for f in (*self.target.values(), *self.drafter.values()))

    def to_dict(self) -> dict:
        cal = self.calibration
        return {"name": self.name, "description": self.description, "target": dict(self.target),
                "drafter": dict(self.drafter),
                "calibration": None if cal is None else dict(vars(cal))}


def load_weights_recipe(name: str | None = None, recipes_dir: Path = RECIPES_DIR
                        ) -> WeightsRecipe:
    """Read `weights.toml` and return recipe `name` (None: the file's `default`).

    Raises:
        BuildError: unknown recipe, a group missing or unknown, a format the builder cannot
            write for that group, a quantized recipe without `calibration` (file + key).
    """
    path = Path(recipes_dir) / "weights.toml"
    top = _read(path)
    default, recipes = top.get("default", str), top.table("recipes")
    top.close()
    name = _pick(list(recipes.data), default if name is None else name, "weight recipes",
                 "--weights", path)
    r = recipes.table(name)
    target = _groups(r.table("target"), TARGET_GROUPS)
    drafter = _groups(r.table("drafter"), DRAFTER_GROUPS)
    cal = _calibration(r.table("calibration")) if "calibration" in r.data else None
    recipe = WeightsRecipe(name, r.get("description", str), target, drafter, cal)
    r.close()
    if recipe.quantized and cal is None:
        raise r.error("calibration", "a quantized recipe needs a [calibration] table")
    return recipe


def _groups(t: _Table, allowed: dict[str, tuple[str, ...]]) -> dict[str, str]:
    out = {g: t.choice(g, formats) for g, formats in allowed.items()}
    t.close()
    assert all(f in WEIGHT_FORMATS for f in out.values())
    return out


def _calibration(t: _Table) -> CalibrationSpec:
    spec = CalibrationSpec(algorithm=t.choice("algorithm", ("max",)), data=t.get("data", str),
                           max_tokens_per_sequence=t.get("max_tokens_per_sequence", int),
                           amax_grid_steps_per_octave=t.get("amax_grid_steps_per_octave", int))
    t.close()
    if spec.max_tokens_per_sequence < 2 or spec.amax_grid_steps_per_octave < 1:
        raise t.error("", "max_tokens_per_sequence must be >= 2 and the grid steps >= 1")
    return spec


@dataclass(frozen=True)
class KvPlan:
    """KV-cache precision of the sliding and the full-attention layers, and the seed of the
    Hadamard signs (`shared/spec/kv-cache.md`)."""

    name: str
    description: str
    sliding: str
    full: str
    seed: int

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "sliding": self.sliding,
                "full": self.full, "seed": self.seed}


def load_kv_plan(name: str | None = None, recipes_dir: Path = RECIPES_DIR) -> KvPlan:
    """Read `kv-cache.toml` and return plan `name` (None: the file's `default`).

    Raises:
        BuildError: unknown plan (lists the known ones) or a malformed entry.
    """
    path = Path(recipes_dir) / "kv-cache.toml"
    top = _read(path)
    default, seed, plans = top.get("default", str), top.get("seed", int), top.table("plans")
    top.close()
    name = _pick(list(plans.data), default if name is None else name, "KV-cache plans",
                 "--kv-cache", path)
    p = plans.table(name)
    plan = KvPlan(name, p.get("description", str), p.choice("sliding", SLIDING_KV_FORMATS),
                  p.choice("full", FULL_KV_FORMATS), seed)
    p.close()
    return plan


@dataclass(frozen=True)
class CalibrationSet:
    """The calibration sentences: `name` and (language, text) pairs in file order."""

    name: str
    texts: tuple[tuple[str, str], ...]


def load_calibration_set(filename: str, recipes_dir: Path = RECIPES_DIR) -> CalibrationSet:
    """Read the calibration file (`calibration.toml`): a `name` and lists of strings.

    Raises:
        BuildError: missing file, a non-string entry, or no text at all.
    """
    path = Path(recipes_dir) / filename
    top = _read(path)
    name = top.get("name", str)
    texts = []
    for lang in [k for k in top.data if k not in ("schema_version", "name")]:
        texts += [(lang, s) for s in _str_list(top, lang)]
    top.close()
    if not texts:
        raise top.error("", "holds no calibration text")
    return CalibrationSet(name, tuple(texts))
