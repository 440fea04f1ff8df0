#!/usr/bin/env python3
"""Pack a built engine for the GPU machine without the tensors the tracked checkpoint holds.

    python bench/carry_engine.py pack engines/mini-h200 engines/carry-b.tar.xz \
        [--checkpoint checkpoints/kolibri-mini] [--extra engines/prompts]
    python bench/carry_engine.py unpack engines/carry-b.tar.xz engines \
        [--checkpoint checkpoints/kolibri-mini]

The device machine receives the tracked tree plus at most 64 MiB in all, and the engine of the
trained default repeats tensors of `checkpoints/kolibri-mini` byte for byte (the bf16
embedding, the norms' gains, the router: about 8.5 MB of the target's 20 MB). `pack` writes
the engine folder (and any `--extra` folders) into an xz tar with those tensors removed from
each `<part>/model.safetensors`, and records in `carry_strip.json` which tensor came from which
checkpoint file, with its SHA-256. `unpack` extracts it and puts each tensor back from the
checkpoint after checking its hash, so the engine on the device is the one built here, byte for
byte in its tensors. Errors (a hash that differs, a missing tensor) raise before anything is
written in place: the rebuilt file is written next to its destination and renamed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
RECORD = "carry_strip.json"
PARTS = ("target", "drafter")


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _load(path: Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _shared(engine: Path, checkpoint: Path, part: str) -> list[dict]:
    """The tensors of engine/part/model.safetensors equal (dtype, shape, bytes) to the
    checkpoint's part's."""
    mine, _ = _load(engine / part / "model.safetensors")
    theirs, _ = _load(checkpoint / part / "model.safetensors")
    out = []
    for name, t in mine.items():
        c = theirs.get(name)
        if c is not None and c.dtype == t.dtype and c.shape == t.shape and torch.equal(c, t):
            out.append(dict(part=part, name=name, sha256=_sha(t)))
    return out


def pack(engine: Path, archive: Path, checkpoint: Path, extra: list[Path]) -> None:
    """Write `archive` (module docstring). Raises FileNotFoundError for a missing folder."""
    for p in [engine, checkpoint, *extra]:
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: not a folder")
    with tempfile.TemporaryDirectory() as tmp:
        slim = Path(tmp) / engine.name
        shutil.copytree(engine, slim)
        record = []
        for part in PARTS:
            if not (engine / part / "model.safetensors").is_file():
                continue
            drop = _shared(engine, checkpoint, part)
            tensors, meta = _load(engine / part / "model.safetensors")
            for d in drop:
                del tensors[d["name"]]
            save_file(tensors, str(slim / part / "model.safetensors"), metadata=meta)
            record += drop
        (slim / RECORD).write_text(json.dumps(dict(checkpoint=str(checkpoint.relative_to(ROOT)),
                                                   tensors=record), indent=1))
        part_file = archive.with_name(archive.name + ".part")
        with tarfile.open(part_file, "w:xz", preset=9) as tar:
            tar.add(slim, arcname=engine.name)
            for p in extra:
                tar.add(p, arcname=p.name)
        part_file.replace(archive)
    size = sum((engine / part / "model.safetensors").stat().st_size for part in PARTS
               if (engine / part / "model.safetensors").is_file())
    print(f"wrote {archive} ({archive.stat().st_size / 2**20:.2f} MiB): {len(record)} tensors "
          f"left to {checkpoint} (engine weights {size / 2**20:.2f} MiB)")


def unpack(archive: Path, dest: Path, checkpoint: Path | None) -> None:
    """Extract `archive` into dest and restore the stripped tensors (module docstring).
    Raises ValueError for a tensor whose hash differs or that the checkpoint lacks."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
        tops = {Path(m.name).parts[0] for m in tar.getmembers()}
    for top in sorted(tops):
        rec_path = dest / top / RECORD
        if not rec_path.is_file():
            continue
        rec = json.loads(rec_path.read_text())
        ckpt = checkpoint or ROOT / rec["checkpoint"]
        for part in PARTS:
            names = [d for d in rec["tensors"] if d["part"] == part]
            if not names:
                continue
            theirs, _ = _load(ckpt / part / "model.safetensors")
            target = dest / top / part / "model.safetensors"
            tensors, meta = _load(target)
            for d in names:
                t = theirs.get(d["name"])
                if t is None or _sha(t) != d["sha256"]:
                    raise ValueError(f"{ckpt / part}: tensor {d['name']} missing or not the "
                                     f"one the engine was built with (SHA-256 differs)")
                tensors[d["name"]] = t
            tmp = target.with_name(target.name + ".part")
            save_file(tensors, str(tmp), metadata=meta)
            tmp.replace(target)
        rec_path.unlink()
        print(f"unpacked {dest / top}: {len(rec['tensors'])} tensors restored from {ckpt}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("engine", type=Path)
    p.add_argument("archive", type=Path)
    p.add_argument("--checkpoint", type=Path, default=ROOT / "checkpoints" / "kolibri-mini")
    p.add_argument("--extra", type=Path, nargs="*", default=[])
    u = sub.add_parser("unpack")
    u.add_argument("archive", type=Path)
    u.add_argument("dest", type=Path)
    u.add_argument("--checkpoint", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(args.engine.resolve(), args.archive, args.checkpoint.resolve(),
             [e.resolve() for e in args.extra])
    else:
        unpack(args.archive, args.dest, args.checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
