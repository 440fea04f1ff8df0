"""`manifest.json`: assembled at the end of a build, checked by `validate_manifest`.

Schema: `kolibri_trt/engine_format.py` (schema_version 1). The runtime reads formats, the KV
plan and hashes from here and never guesses from tensor names. Nothing in the manifest
depends on time, the machine or absolute paths, so the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import engine_format as ef
from .errors import BuildError

_CHUNK = 1 << 22
REQUIRED = {
    "schema_version": int, "kolibri_trt_version": str, "torch_version": str,
    "modelopt_version": (str, type(None)), "target": str, "gpu_arch": (str, type(None)),
    "recipe": dict, "weights": dict, "kv_cache": dict, "sources": dict, "files": dict,
    "written_by_modelopt": list, "written_by_kolibri_trt": list, "calibration": (dict, type(None)),
}


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_files(root: Path, exclude: tuple[str, ...] = (ef.MANIFEST,)) -> dict[str, str]:
    """sha256 of every file under `root` by relative POSIX path, sorted."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in exclude:
            out[rel] = sha256_file(p)
    return out


def validate_manifest(m: Any, where: str = ef.MANIFEST) -> None:
    """Check a parsed manifest against schema version 1.

    Raises:
        BuildError: a missing key, a wrong type, an unknown target / format / KV kind, a
            bad tp_size, or a malformed hash; the message names the key.
    """
    def bad(key: str, msg: str) -> BuildError:
        return BuildError(f"{where}: key {key!r}: {msg}")

    if not isinstance(m, dict):
        raise BuildError(f"{where}: must be a JSON object")
    for key, kind in REQUIRED.items():
        if key not in m:
            raise bad(key, "missing")
        if not isinstance(m[key], kind) or isinstance(m[key], bool):
            raise bad(key, f"wrong type {type(m[key]).__name__}")
    if m["schema_version"] != ef.SCHEMA_VERSION:
        raise bad("schema_version", f"{m['schema_version']}, this reader knows {ef.SCHEMA_VERSION}")
    if m["target"] not in ef.BUILD_TARGETS:
        raise bad("target", f"{m['target']!r} not in {list(ef.BUILD_TARGETS)}")
    _check_weights(m["weights"], bad)
    _check_tp(m, bad)
    _check_kv(m["kv_cache"], bad)
    for key in ("sources", "files"):
        for name, digest in m[key].items():
            if not (isinstance(digest, str) and len(digest) == 64
                    and all(c in "0123456789abcdef" for c in digest)):
                raise bad(f"{key}.{name}", "must be a sha256 hex digest")


def _check_weights(w: Mapping, bad) -> None:
    for part in ("target", "drafter"):
        groups = w.get(part)
        if not isinstance(groups, dict) or not groups:
            raise bad(f"weights.{part}", "must map tensor groups to formats")
        for group, fmt in groups.items():
            if fmt not in ef.WEIGHT_FORMATS:
                raise bad(f"weights.{part}.{group}", f"unknown format {fmt!r}")


def _check_tp(m: Mapping, bad) -> None:
    """"tp_size" (optional: engines from before tensor parallelism have none) is an int >= 1;
    a sharded engine (> 1) describes its shards under "tensor_parallel"."""
    if "tp_size" not in m:
        return
    tp = m["tp_size"]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise bad("tp_size", f"must be an integer >= 1, got {tp!r}")
    if tp > 1 and not isinstance(m.get("tensor_parallel"), dict):
        raise bad("tensor_parallel", f"missing: tp_size is {tp}")


def _check_kv(kv: Mapping, bad) -> None:
    if kv.get("sliding") not in ef.SLIDING_KV_FORMATS:
        raise bad("kv_cache.sliding", f"{kv.get('sliding')!r} not in {list(ef.SLIDING_KV_FORMATS)}")
    if kv.get("full") not in ef.FULL_KV_FORMATS:
        raise bad("kv_cache.full", f"{kv.get('full')!r} not in {list(ef.FULL_KV_FORMATS)}")
    for key in ("seed", "head_dim"):
        if not isinstance(kv.get(key), int) or isinstance(kv.get(key), bool):
            raise bad(f"kv_cache.{key}", "must be an integer")


def provenance(weights: Mapping[str, Mapping[str, str]], kv_full: str, kv_sliding: str
               ) -> tuple[list[str], list[dict[str, str]]]:
    """(written_by_modelopt globs, written_by_kolibri_trt [{"tensors", "why"}]) for a build."""
    t, d = weights["target"], weights["drafter"]
    by_mo: list[str] = []
    ours: list[dict[str, str]] = []
    if "fp8" in (t["attention"], t["experts"], t["shared_expert"]):
        by_mo += [("target: model.layers.*.{self_attn,mlp}.*_proj.{weight,weight_scale,"
                   "input_scale} (mtq.quantize FP8_DEFAULT_CFG, max calibration, HF exporter)"),
                  "target/hf_quant_config.json", "target/config.json: quantization_config"]
    if t["lm_head"] == "nvfp4":
        by_mo.append("target: lm_head.{weight,weight_scale,weight_scale_2} (NVFP4QTensor.quantize)")
        ours.append({"tensors": "target: lm_head.input_scale",
                     "why": "NVFP4 fake quantization needs CUDA: the head's input amax comes from "
                            "a per-tensor max quantizer, scaled as ModelOpt does (amax / (6*448))"})
    if d["head"] == "nvfp4":
        by_mo.append("drafter: lm_head.{weight,weight_scale,weight_scale_2} (NVFP4QTensor.quantize)")
        ours.append({"tensors": "drafter: lm_head.input_scale", "why": "as the target's head"})
    if d["body"] == "block_fp8":
        ours.append({"tensors": "drafter: body *.{weight,weight_scale}, drafter/hf_quant_config.json",
                     "why": "1x64 block FP8: ModelOpt calibrates the block amax but its exporter "
                            "assumes square blocks"})
    kv = {"fp8": "k_scale,v_scale", "hadamard-int4": "q_rotation,k_rotation",
          "int4": "q_rotation,k_rotation", "bf16": ""}
    names = ",".join(x for x in dict.fromkeys((kv[kv_sliding], kv[kv_full])) if x)
    if names:
        ours.append({"tensors": f"target: model.layers.*.self_attn.{{{names}}}",
                     "why": "the KV plan (k_scale = v_scale = 1.0, uncalibrated; M_q, M_k of the "
                            "full layers): ModelOpt cannot export mixed KV precision"})
    return by_mo, ours
