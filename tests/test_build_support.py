"""Shared support of the build tests (tests/test_build_*.py; no tests of its own).

Small checkpoints and engines, made once per test process (`cached`) and handed to each
module through the session fixtures below, imported there by name.

A 5-layer target (4 sliding + 1 full) with head_dim 128 (the Hadamard rotation's size), hidden
64, vocab 2048 with the real Tekken tokenizer cut to 2048 ids, and a drafter whose
intermediate size 96 and ranks 8 exercise partial 64-wide FP8 blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_configs import micro_target_config

from kolibri_trt.fixtures import random_drafter, random_target, tiny_drafter_config
from kolibri_trt.tokenizer import write_tekken_tokenizer

VOCAB = 2048


def build_target_config(**overrides):
    fields = dict(vocab_size=VOCAB, head_dim=128, num_attention_heads=2, num_key_value_heads=1)
    fields.update(overrides)
    return micro_target_config(**fields)


def write_checkpoints(root: Path, seed: int = 5, **target_overrides) -> tuple[Path, Path]:
    """Write root/target (bf16 + tokenizer) and root/drafter; returns both folders."""
    target = random_target(build_target_config(**target_overrides), seed=seed)
    dcfg = tiny_drafter_config(target.config, num_attention_heads=2, num_key_value_heads=1,
                               head_dim=32, intermediate_size=96, predecessor_rank=8,
                               spine_rank=8, draft_vocab_size=300, context_window=16)
    drafter = random_drafter(dcfg, target, seed=seed + 1)
    target.save_pretrained(root / "target")
    write_tekken_tokenizer(root / "target", vocab_size=target.config.vocab_size)
    drafter.save_pretrained(root / "drafter")
    return root / "target", root / "drafter"


def load_all(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an engine (or checkpoint) subfolder by name."""
    from safetensors.torch import load_file

    from kolibri_trt.checkpoint import tensor_files

    out = {}
    for path in sorted(set(tensor_files(folder).values())):
        out.update(load_file(str(path)))
    return out


_CACHE: dict = {}


def cached(key, make):
    """`make()` once per test process, then the same value."""
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


SHORT_CALIBRATION = """schema_version = 1
name = "test-short"
english = ["The river rose for three days.", "Please summarise the report."]
german = ["Der Zug nach München fällt heute aus."]
code = ["def f(x):\\n    return x * x\\n"]
"""


def recipes_copy(root: Path, calibration: str = SHORT_CALIBRATION) -> Path:
    """A copy of the repository's build/ recipes with a short calibration set (fast tests;
    the default-fixture test uses the real one)."""
    import shutil

    from kolibri_trt.builder.recipes import RECIPES_DIR

    shutil.copytree(RECIPES_DIR, root, ignore=shutil.ignore_patterns("README.md"))
    (root / "calibration.toml").write_text(calibration, encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def build_ckpt(tmp_path_factory):
    """(target_dir, drafter_dir) of the small bf16 checkpoints (head_dim 128)."""
    return cached("ckpt", lambda: write_checkpoints(tmp_path_factory.mktemp("build_ckpt")))


@pytest.fixture(scope="session")
def test_recipes(tmp_path_factory):
    """The recipes folder the small builds use (`recipes_copy`)."""
    return cached("recipes", lambda: recipes_copy(tmp_path_factory.mktemp("r") / "build"))


def build(out: Path, ckpt, recipes: Path, **options) -> Path:
    """Build from `ckpt` into `out` (target gb10 unless given) without a progress bar."""
    from kolibri_trt.builder import BuildOptions, build_engine
    path, _ = build_engine(BuildOptions(model=ckpt[0], drafter=ckpt[1], out=out,
                                        progress=False, recipes_dir=recipes,
                                        **{"target": "gb10", **options}))
    return path


@pytest.fixture(scope="session")
def built_engine(build_ckpt, test_recipes, tmp_path_factory):
    """The default recipe (fp8-nvfp4, hadamard-int4) built for gb10 from `build_ckpt`."""
    return cached("engine", lambda: build(tmp_path_factory.mktemp("eng") / "gb10", build_ckpt,
                                          test_recipes))
