#!/usr/bin/env python3
"""A seeded document subset of the training corpus, for device calls whose carry must stay
small (the tracked tree plus every carried path travel under 64 MiB):

    python tools/corpus_subset.py --fraction 0.2 --out corpus/sub

Writes <out>/train.jsonl.xz (each document of corpus/train.jsonl.xz kept with probability
--fraction, file order kept) and a copy of corpus/valid.jsonl.xz, so `train_drafter.py
--corpus <out>` and `gen_self_distill.py --corpus <out>/train.jsonl.xz` take it as they take
the corpus. Prints the documents and bytes kept per language.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "corpus")
    ap.add_argument("--fraction", type=float, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not 0.0 < args.fraction <= 1.0:
        ap.error(f"--fraction: must be in (0, 1], got {args.fraction}")
    src = args.corpus / "train.jsonl.xz"
    if not src.is_file():
        ap.error(f"--corpus: {src} does not exist (tools/corpus.py makes it)")
    with lzma.open(src, "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    keep = np.random.default_rng(args.seed).random(len(lines)) < args.fraction
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "train.jsonl.xz.tmp"
    docs, chars = Counter(), Counter()
    with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
        for line, k in zip(lines, keep):
            if k:
                f.write(line)
                lang = json.loads(line)["lang"]
                docs[lang] += 1
                chars[lang] += len(line)
    tmp.replace(args.out / "train.jsonl.xz")
    shutil.copyfile(args.corpus / "valid.jsonl.xz", args.out / "valid.jsonl.xz")
    print(f"{sum(docs.values())} of {len(lines)} documents: "
          + ", ".join(f"{k} {docs[k]} ({chars[k] / 1e6:.1f} MB)" for k in sorted(docs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
