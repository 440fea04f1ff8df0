"""Strict safetensors checkpoint I/O (single file or sharded with an index), never unpickling.

Layout: `shared/spec/kolibri-1.md` §Checkpoint layout (Hugging Face conventions):
`model.safetensors`, or `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config_io import FieldReader, read_json, write_json_atomic
from .errors import CheckpointError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def tensor_files(directory: str | Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that holds it.

    Raises:
        CheckpointError: no safetensors weights (only pickles, which are never loaded), a
            broken index (names the index and the tensor), a shard listed but absent, or a
            tensor stored twice.
    """
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(d, "checkpoint directory not found")
    if (d / INDEX).is_file():
        return _files_from_index(d / INDEX)
    if (d / SINGLE).is_file():
        return {name: d / SINGLE for name in _names(d / SINGLE)}
    pickles = sorted(p.name for p in d.iterdir() if p.suffix in PICKLE_SUFFIXES)
    hint = f" (found {pickles}: pickled weights are never loaded; convert them to safetensors)" \
        if pickles else ""
    raise CheckpointError(d, f"no {SINGLE} or {INDEX}{hint}")


def _names(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(path, f"not a readable safetensors file ({exc})") from None


def _files_from_index(index: Path) -> dict[str, Path]:
    r = FieldReader(read_json(index), index)
    weight_map = r.get("weight_map")
    if not isinstance(weight_map, dict):
        raise r.error("weight_map", "must be an object mapping tensor names to files")
    out: dict[str, Path] = {}
    contents: dict[str, set[str]] = {}
    for name, fname in weight_map.items():
        if not isinstance(fname, str) or "/" in fname or fname.startswith("."):
            raise CheckpointError(index, f"bad shard file name {fname!r}", tensor=name)
        shard = index.parent / fname
        if fname not in contents:
            if not shard.is_file():
                raise CheckpointError(shard, f"listed in {index.name} (for {name!r}) but missing")
            contents[fname] = set(_names(shard))
        if name not in contents[fname]:
            raise CheckpointError(shard, f"listed in {index.name} but not in this shard",
                                  tensor=name)
        out[name] = shard
    for fname, names in contents.items():
        for name in sorted(names - set(weight_map)):
            raise CheckpointError(index.parent / fname, f"in the shard but not in {index.name}",
                                  tensor=name)
    return out


def load_tensors(directory: str | Path, expected: Mapping[str, tuple[int, ...]],
                 dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                 ) -> dict[str, torch.Tensor]:
    """Load exactly the `expected` tensors, checking names and shapes before reading data.

    Args:
        directory: checkpoint folder.
        expected: tensor name -> shape, as the spec fixes them for this config.
        dtype: cast floating tensors to this dtype (None keeps the stored dtype).
    Returns:
        name -> tensor on `device`.
    Raises:
        CheckpointError: a missing, unexpected or mis-shaped tensor (names file and tensor).
    """
    files = tensor_files(directory)
    for name in expected:
        if name not in files:
            raise CheckpointError(Path(directory), "missing from the checkpoint", tensor=name)
    for name, path in files.items():
        if name not in expected:
            raise CheckpointError(path, "unexpected tensor (not in the spec for this config)",
                                  tensor=name)
    out: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in names:
                shape = tuple(f.get_slice(name).get_shape())
                if shape != tuple(expected[name]):
                    raise CheckpointError(path, f"shape {shape}, expected {tuple(expected[name])}",
                                          tensor=name)
                t = f.get_tensor(name)
                if dtype is not None and t.is_floating_point():
                    t = t.to(dtype)
                out[name] = t.to(device)
    return out


def save_tensors(directory: str | Path, tensors: Mapping[str, torch.Tensor],
                 max_shard_bytes: int | None = None, metadata: dict | None = None) -> list[Path]:
    """Write tensors as `model.safetensors`, or as shards plus an index when over the limit.

    Files are written into a temporary folder beside `directory` and moved in at the end,
    so a failure leaves no half-written weights. Existing weight files of the other layout
    are removed. Returns the written weight files.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    shards = _plan_shards(tensors, max_shard_bytes)
    tmp = Path(tempfile.mkdtemp(dir=d, prefix=".weights-"))
    try:
        names = [SINGLE] if len(shards) == 1 else [
            f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        for fname, group in zip(names, shards):
            save_file({k: tensors[k].contiguous() for k in group}, str(tmp / fname),
                      metadata={"format": "pt", **(metadata or {})})
        if len(shards) > 1:
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            weight_map = {k: fname for fname, group in zip(names, shards) for k in group}
            write_json_atomic(tmp / INDEX, {"metadata": {"total_size": total},
                                            "weight_map": dict(sorted(weight_map.items()))})
        for old in list(d.glob("model*.safetensors")) + [d / INDEX]:
            old.unlink(missing_ok=True)
        for p in tmp.iterdir():
            os.replace(p, d / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [d / n for n in names]


def _plan_shards(tensors: Mapping[str, torch.Tensor], limit: int | None) -> list[list[str]]:
    if limit is None:
        return [list(tensors)]
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards

