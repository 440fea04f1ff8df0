"""`python build.py --target gb10` with no other argument, in a fresh folder: builds the
embedded default checkpoints (checkpoints/kolibri-mini) with the real recipes and calibration
set, writes nothing beside the engine, and prints the engine path last."""

from __future__ import annotations

import json

from kolibri_trt.builder import validate_manifest
from kolibri_trt.builder.cli import main


def test_default_build_for_gb10(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--target", "gb10", "--no-progress"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "engines/gb10"
    engine = tmp_path / "engines" / "gb10"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engines"]
    manifest = json.loads((engine / "manifest.json").read_text())
    validate_manifest(manifest)
    assert manifest["calibration"]["set"] == "kolibri-builtin-v1"
    assert manifest["calibration"]["languages"] == ["code", "english", "german"]
    sizes = {d: sum(p.stat().st_size for p in (engine / d).iterdir()) for d in ("target",
                                                                               "drafter")}
    # FP8 body + bf16 embedding + NVFP4 head of the 16,384-id mini; block-FP8 drafter
    assert 15e6 < sizes["target"] < 30e6 and 2e6 < sizes["drafter"] < 8e6
    assert not [p for p in (tmp_path / "engines").iterdir() if p.name.startswith(".")]
