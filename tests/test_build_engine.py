"""Engine folders: manifest schema and hashes, reproducible bytes, recipes, every build error,
no half-written output, the CLI, the bf16 recipe, and the runtime reading what we write."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_build_support import build, load_all, write_checkpoints

from kolibri_trt.builder import (
    BuildError,
    BuildOptions,
    build_engine,
    validate_manifest,
)
from kolibri_trt.builder.manifest import sha256_file
from kolibri_trt.builder.recipes import load_target, load_weights_recipe
from kolibri_trt.errors import CheckpointError


def _manifest(engine) -> dict:
    return json.loads((engine / "manifest.json").read_text())


def test_manifest_schema_and_hashes(built_engine, build_ckpt):
    m = _manifest(built_engine)
    validate_manifest(m)
    assert (m["target"], m["gpu_arch"], m["schema_version"]) == ("gb10", "sm_121", 1)
    assert m["weights"]["target"]["lm_head"] == "nvfp4" and m["weights"]["drafter"] == {
        "body": "block_fp8", "head": "nvfp4"}
    assert m["kv_cache"]["sliding"] == "fp8" and m["kv_cache"]["full"] == "hadamard-int4"
    assert m["kv_cache"]["head_dim"] == 128 and m["modelopt_version"] == "0.47.0"
    assert m["torch_version"] == torch.__version__
    assert m["calibration"]["tokens"] > 0 and m["calibration"]["set"] == "test-short"
    assert m["sources"]["target/model.safetensors"] == sha256_file(build_ckpt[0] /
                                                                   "model.safetensors")
    assert {"build/weights.toml", "drafter/draft_vocab.json"} <= set(m["sources"])
    files = sorted(p.relative_to(built_engine).as_posix() for p in built_engine.rglob("*")
                   if p.is_file() and p.name != "manifest.json")
    assert sorted(m["files"]) == files
    assert all(sha256_file(built_engine / f) == h for f, h in m["files"].items())
    assert {"target/hf_quant_config.json", "target/tokenizer.json",
            "drafter/draft_vocab.json"} <= set(files)
    config = json.loads((built_engine / "target" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert config["quantization_config"]["quant_algo"] == "MIXED_PRECISION"


def test_manifest_validation_names_the_key(built_engine):
    m = _manifest(built_engine)
    for key, value, match in (("target", "tpu", "'target'"),
                              ("weights", {"target": {"lm_head": "int3"}, "drafter": {"b": "bf16"}},
                               "lm_head"),
                              ("files", {"x": "nothex"}, "files.x")):
        with pytest.raises(BuildError, match=match):
            validate_manifest({**m, key: value})
    with pytest.raises(BuildError, match="'calibration': missing"):
        validate_manifest({k: v for k, v in m.items() if k != "calibration"})


def test_same_inputs_same_bytes_on_every_target(built_engine, build_ckpt, test_recipes,
                                                tmp_path):
    again = build(tmp_path / "again", build_ckpt, test_recipes)
    assert (again / "manifest.json").read_bytes() == (built_engine / "manifest.json").read_bytes()
    h100 = _manifest(build(tmp_path / "h100", build_ckpt, test_recipes, target="h100"))
    weights = {k: v for k, v in _manifest(built_engine)["files"].items()
               if k.endswith(".safetensors")}
    assert weights and all(h100["files"][k] == v for k, v in weights.items())
    assert h100["gpu_arch"] == "sm_90"


def test_bf16_recipe_is_the_checkpoint(build_ckpt, test_recipes, tmp_path):
    engine = build(tmp_path / "e", build_ckpt, test_recipes, target="cpu", weights="bf16",
                   kv_cache="bf16")
    m = _manifest(engine)
    validate_manifest(m)
    assert m["modelopt_version"] is None and m["calibration"] is None and m["gpu_arch"] is None
    assert not (engine / "target" / "hf_quant_config.json").exists()
    src, eng = load_all(build_ckpt[0]), load_all(engine / "target")
    assert set(src) == set(eng) and all(torch.equal(src[n], eng[n]) for n in src)
    vocab = json.loads((build_ckpt[1] / "draft_vocab.json").read_text())
    drafter = load_all(engine / "drafter")
    assert torch.equal(drafter.pop("lm_head.weight"), src["lm_head.weight"][vocab])
    assert drafter.keys() == load_all(build_ckpt[1]).keys()


def test_progress_reaches_its_total(build_ckpt, test_recipes, tmp_path, monkeypatch):
    """The build's progress bar ends at its total: every step it announced was taken."""
    import kolibri_trt.builder.engine as engine_mod
    seen = {}

    class Counting(engine_mod.Progress):
        def __exit__(self, *exc):
            seen.update(n=self.bar.n, total=self.bar.total)
            super().__exit__(*exc)

    monkeypatch.setattr(engine_mod, "Progress", Counting)
    build_engine(BuildOptions(model=build_ckpt[0], drafter=build_ckpt[1], out=tmp_path / "e",
                              recipes_dir=test_recipes, target="cpu", weights="bf16",
                              kv_cache="bf16", progress=True))
    assert seen["total"] > 0 and seen["n"] == seen["total"], seen


def test_runtime_reads_the_engine(built_engine):
    loader = pytest.importorskip("kolibri_trt.runtime.engine_loader")
    manifest = loader.Manifest.read(built_engine)
    model, rotations, scales = loader.load_target(built_engine, manifest, "cpu")
    assert set(rotations) == {4} and set(scales) == {0, 1, 2, 3}     # strict load: names, shapes
    assert manifest.target_formats["experts"] == "fp8" and model.config.head_dim == 128


def test_recipes_load_and_check(tmp_path, test_recipes):
    for name in ("gb10", "h100", "h200", "cpu"):
        spec = load_target(name)
        assert set(spec.kernels) >= {"fp8_linear", "nvfp4_linear", "full_attention"}
    assert load_target("gb10").gpu_arch == "sm_121" and load_target("cpu").gpu_arch is None
    assert load_weights_recipe().name == "fp8-nvfp4"
    bad = tmp_path / "build"
    shutil.copytree(test_recipes, bad)
    text = (bad / "weights.toml").read_text().replace('lm_head = "nvfp4"', 'lm_head = "int2"')
    (bad / "weights.toml").write_text(text)
    with pytest.raises(BuildError, match=r"weights\.toml: key 'recipes\.fp8-nvfp4\.target"
                                         r"\.lm_head': must be one of"):
        load_weights_recipe(recipes_dir=bad)
    (bad / "targets.toml").write_text((bad / "targets.toml").read_text().replace(
        "nvfp4_native = true", "nvfp4_native = true\nturbo = 1"))
    with pytest.raises(BuildError, match="'targets.gb10.turbo': unknown key"):
        load_target("gb10", recipes_dir=bad)


def _opts(ckpt, recipes, tmp_path, **kw) -> BuildOptions:
    base = dict(target="gb10", model=ckpt[0], drafter=ckpt[1], out=tmp_path / "out",
                progress=False, recipes_dir=recipes)
    return BuildOptions(**{**base, **kw})


@pytest.mark.parametrize("change, error, match", [
    (dict(target="tpu"), BuildError, r"unknown --target 'tpu'.*'gb10'"),
    (dict(weights="int8"), BuildError, r"unknown --weights 'int8'"),
    (dict(kv_cache="int2"), BuildError, r"unknown --kv-cache 'int2'.*'hadamard-int4'"),
    (dict(model=None), BuildError, "--drafter given without --model"),
    (dict(drafter=None), BuildError, "without --drafter"),
])
def test_option_errors(build_ckpt, test_recipes, tmp_path, change, error, match):
    with pytest.raises(error, match=match):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path, **change))
    assert not (tmp_path / "out").exists()


def test_checkpoint_errors(build_ckpt, test_recipes, tmp_path):
    bad = tmp_path / "llama"
    shutil.copytree(build_ckpt[0], bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"llama/config.json: field 'model_type'"):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path, model=bad))
    drafter = tmp_path / "drafter"
    shutil.copytree(build_ckpt[1], drafter)
    dcfg = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**dcfg, "target_layer_ids": [1, 3, 44]}))
    with pytest.raises(CheckpointError, match="field 'target_layer_ids': layer 44"):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path, drafter=drafter))
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "tokenizer.json").unlink()
    with pytest.raises(BuildError, match="tokenizer.json: missing"):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path, model=bad))


def test_hadamard_needs_power_of_two_head_dim(tmp_path, test_recipes):
    ckpt = write_checkpoints(tmp_path / "ck", head_dim=96)
    with pytest.raises(BuildError, match="hadamard-int4: head_dim 96"):
        build_engine(_opts(ckpt, test_recipes, tmp_path))


def test_existing_output_needs_force_and_failures_leave_nothing(build_ckpt, test_recipes,
                                                                tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("old engine")
    with pytest.raises(BuildError, match="exists; pass --force"):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path))

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")
    monkeypatch.setattr("kolibri_trt.builder.assemble.target_tensors", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path, force=True))
    assert (out / "keep").read_text() == "old engine"                    # old engine intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]          # no temp folder left
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("kolibri_trt.builder.assemble.target_tensors", interrupt)
    with pytest.raises(KeyboardInterrupt):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path, out=tmp_path / "new"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_cli_prints_the_engine_path_last(build_ckpt, test_recipes, tmp_path, capsys):
    from kolibri_trt.builder.cli import main

    out = tmp_path / "cpu"
    args = ["--target", "cpu", "--model", str(build_ckpt[0]), "--drafter", str(build_ckpt[1]),
            "--out", str(out), "--weights", "bf16", "--kv-cache", "fp8",
            "--recipes", str(test_recipes)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines()[-1] == str(out)
    assert "built" in captured.err
    hf = json.loads((out / "target" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert main(args) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["--target", "tpu"]) == 2
    assert "unknown --target 'tpu'" in capsys.readouterr().err


def test_missing_modelopt_is_a_clear_error(build_ckpt, test_recipes, tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "modelopt.torch.quantization", None)
    with pytest.raises(BuildError, match="recipe 'fp8-nvfp4' quantizes with NVIDIA ModelOpt.*"
                                         "--weights bf16"):
        build_engine(_opts(build_ckpt, test_recipes, tmp_path))
    assert not (tmp_path / "out").exists()
