#!/usr/bin/env python3
"""Build the training corpus of the mini Kolibri target and its drafter: English, German and
Python text that can be had offline here (Debian documentation packages, man pages, the Python
docs and standard library, permissively licensed packages of the venv), end to end:

    python tools/corpus.py [--out corpus] [--scratch /tmp/kolibri-corpus] [--mb-en 33 --mb-de 26
        --mb-code 25] [--valid-fraction 0.01] [--seed 0]

Steps: `apt-get download` + `dpkg-deb -x` the packages of `corpus_sources.SOURCES`; clean each
file to plain text (`corpus_clean.py`); check the language of every prose document (a German
package's untranslated page counts as English); drop exact duplicate documents and repeated
paragraphs; drop documents that share an 13-word window with the evaluation prompts
(`shared/data/prompts`, never trained on); cap bytes per source and per language; shuffle at
document level; split train/validation per language. Writes into --out (git-ignored):
`train.jsonl.xz`, `valid.jsonl.xz` (one `{"lang", "source", "text"}` per line, LZMA/xz) and
`SOURCES.md` (every source, its licence, bytes per language). Sizes are UTF-8 bytes.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import hashlib
import json
import lzma
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_clean as cc  # noqa: E402
from corpus_sources import SOURCES, Source, site_packages_sources  # noqa: E402
from train_common import write_bytes_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EVAL_PROMPTS = ROOT.parent / "shared" / "data" / "prompts"
LANGS = ("en", "de", "code")
XZ_PRESET = 6
MAN_WORKERS = 2


def fetch_packages(sources: list[Source], scratch: Path) -> dict[str, Path]:
    """Download and extract every `deb:` package once; returns {package: extracted root}.

    Raises: RuntimeError naming the package when apt-get download or dpkg-deb fails."""
    roots, debs = {}, scratch / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    for pkg in sorted({s.package for s in sources if s.package}):
        root = scratch / "x" / pkg
        if not (root / ".done").is_file():
            if not list(debs.glob(f"{pkg}_*.deb")):
                r = subprocess.run(["apt-get", "download", pkg], cwd=debs, capture_output=True,
                                   text=True)
                if r.returncode:
                    raise RuntimeError(f"apt-get download {pkg} failed (run apt-get update "
                                       f"first?): {r.stderr.strip()[-300:]}")
            deb = sorted(debs.glob(f"{pkg}_*.deb"))[-1]
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            (root / ".done").write_text(deb.name)
        roots[pkg] = root
    return roots


def read_file(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def to_text(kind: str, path: Path) -> str:
    """One file of a source to normalised plain text ("" if unusable)."""
    data = read_file(path)
    if kind == "man":
        return cc.man_to_text(data)
    text = cc.decode_bytes(data)
    if kind == "html":
        return cc.html_to_text(text)
    if kind == "lyx":
        return cc.lyx_to_text(text)
    if kind == "rst":
        return cc.rst_to_text(text)
    if kind == "python":
        return cc.normalize_text(text, max_blank_lines=2) if cc.python_source_ok(text) else ""
    if kind == "text":   # plain text; fortune files separate entries with "%" lines
        return cc.normalize_text(text.replace("\n%\n", "\n\n"))
    raise ValueError(f"unknown source kind {kind!r}")


def source_files(src: Source, roots: dict[str, Path], seed: int) -> list[Path]:
    """The files of `src` in a seeded random order (so a cap takes a random sample)."""
    base = roots[src.package] if src.package else Path(src.root)
    files = sorted({p for g in src.globs for p in base.glob(g) if p.is_file()})
    files = [p for p in files if not any(x in str(p) for x in src.exclude)]
    random.Random(f"{seed}:{src.name}").shuffle(files)
    return files


class Collector:
    """Accumulates cleaned documents per language under byte caps, with de-duplication and
    the contamination check."""

    def __init__(self, caps: dict[str, int], banned: set[int]):
        self.caps, self.banned = caps, banned
        self.docs: dict[str, list[dict]] = defaultdict(list)
        self.bytes = defaultdict(int)                       # per language
        self.by_source = defaultdict(lambda: defaultdict(int))  # source -> lang -> bytes
        self.dropped = defaultdict(int)                     # reason -> documents
        self.doc_keys: set[bytes] = set()
        self.para_keys: dict[str, set[bytes]] = defaultdict(set)

    def add(self, src: Source, text: str) -> int:
        """Add one document; returns the bytes kept (0 if dropped)."""
        if len(text) < cc.MIN_DOC_CHARS:
            self.dropped["short or empty"] += 1
            return 0
        lang = "code" if src.lang == "code" else cc.guess_language(text)
        if lang is None:
            self.dropped["no clear language"] += 1
            return 0
        key = hashlib.blake2b(" ".join(text.split()).encode(), digest_size=16).digest()
        if key in self.doc_keys:
            self.dropped["duplicate document"] += 1
            return 0
        self.doc_keys.add(key)
        if lang != "code":
            text = cc.dedupe_paragraphs(text, self.para_keys[lang])
            if len(text) < cc.MIN_DOC_CHARS:
                self.dropped["repeated paragraphs only"] += 1
                return 0
        if self.banned and cc.word_shingles(text) & self.banned:
            self.dropped["overlaps evaluation prompts"] += 1
            return 0
        n = len(text.encode("utf-8"))
        if self.bytes[lang] + n > self.caps[lang]:
            self.dropped[f"over the {lang} cap"] += 1
            return 0
        self.docs[lang].append({"lang": lang, "source": src.name, "text": text})
        self.bytes[lang] += n
        self.by_source[src.name][lang] += n
        return n


def collect(sources: list[Source], roots: dict[str, Path], col: Collector, seed: int) -> None:
    """Clean every source's files (man pages on MAN_WORKERS groff processes) into `col`."""
    from tqdm import tqdm
    for src in tqdm(sources, desc="sources", unit="src"):
        files, taken = source_files(src, roots, seed), 0
        cap = int(src.max_mb * 1e6)
        workers = MAN_WORKERS if src.kind == "man" else 1
        with cf.ThreadPoolExecutor(workers) as pool:
            for start in range(0, len(files), 64):
                if taken >= cap:
                    break
                chunk = files[start:start + 64]
                for text in pool.map(lambda p: to_text(src.kind, p), chunk):
                    if src.cut_at and src.cut_at in text:
                        text = text[:text.index(src.cut_at)].rstrip()
                    if taken < cap:
                        taken += col.add(src, text)


def banned_shingles(prompts_dir: Path) -> set[int]:
    """13-word shingles of every evaluation prompt (Spec-Bench turns, HumanEval prompts)."""
    out: set[int] = set()
    if not prompts_dir.is_dir():
        return out
    for path in sorted(prompts_dir.glob("*.jsonl*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line) if line.strip() else {}
                for text in rec.get("turns", []) + [rec.get("prompt", "")]:
                    out |= cc.word_shingles(text)
    return out


def split_docs(docs: dict[str, list[dict]], valid_fraction: float, seed: int
               ) -> tuple[list[dict], list[dict]]:
    """Per language, shuffle documents and put the first `valid_fraction` of bytes (at least
    one document) into validation; then shuffle each split across languages."""
    rng = random.Random(seed)
    train, valid = [], []
    for lang in LANGS:
        items = list(docs.get(lang, []))
        rng.shuffle(items)
        total, acc, k = sum(len(d["text"]) for d in items), 0, 0
        while k < len(items) - 1 and (k == 0 or acc < valid_fraction * total):
            acc += len(items[k]["text"])
            k += 1
        valid += items[:k]
        train += items[k:]
    rng.shuffle(train)
    rng.shuffle(valid)
    return train, valid


def write_jsonl_xz(path: Path, docs: list[dict]) -> int:
    """Write documents as xz-compressed JSON lines, atomically; returns the compressed bytes."""
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    packed = lzma.compress(data, preset=XZ_PRESET)
    write_bytes_atomic(path, packed)
    return len(packed)


def iter_corpus(path: Path):
    """Yield the documents ({"lang", "source", "text"}) of a `*.jsonl.xz` corpus file."""
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "corpus")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/kolibri-corpus"),
                    help="downloaded and extracted packages (~1 GB; outside the repo, so it "
                    "is never carried to the GPU machine by mistake)")
    ap.add_argument("--mb-en", type=float, default=33.0)
    ap.add_argument("--mb-de", type=float, default=26.0)
    ap.add_argument("--mb-code", type=float, default=25.0)
    ap.add_argument("--valid-fraction", type=float, default=0.01)
    ap.add_argument("--eval-prompts", type=Path, default=EVAL_PROMPTS,
                    help="evaluation prompt folder whose texts must not be trained on")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not 0 < args.valid_fraction < 0.5:
        ap.error("--valid-fraction must be in (0, 0.5)")
    sources = SOURCES + site_packages_sources()
    roots = fetch_packages(sources, args.scratch)
    caps = {"en": int(args.mb_en * 1e6), "de": int(args.mb_de * 1e6),
            "code": int(args.mb_code * 1e6)}
    col = Collector(caps, banned_shingles(args.eval_prompts))
    collect(sources, roots, col, args.seed)
    train, valid = split_docs(col.docs, args.valid_fraction, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {"train.jsonl.xz": write_jsonl_xz(args.out / "train.jsonl.xz", train),
             "valid.jsonl.xz": write_jsonl_xz(args.out / "valid.jsonl.xz", valid)}
    from corpus_sources import sources_markdown
    md = sources_markdown(sources, col, train, valid, sizes, args)
    write_bytes_atomic(args.out / "SOURCES.md", md.encode("utf-8"))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
