#!/usr/bin/env python3
"""Train the mini target's tokenizer: a byte-level BPE (Hugging Face `tokenizers`) on the
corpus, with Tekken's pre-tokenizer regex and Tekken's control tokens at Tekken's ids, so
`KolibriTokenizer.from_pretrained` loads it with the same chat template and the runtime, the
servers and the CLI work unchanged:

    python tools/train_tokenizer.py [--corpus corpus] [--out corpus/tokenizer]
        [--vocab-size 16384] [--max-mb 60]

Ids 0..NUM_CONTROL-1 are Tekken's first control tokens (<unk>=0, <s>=1, </s>=2, [INST]=3,
[/INST]=4, ..., <pad>=11, ..., [SYSTEM_PROMPT]=17, ...; the unnamed ones keep Tekken's
<SPECIAL_n> names), then the 256 byte tokens, then the merges. Writes tokenizer.json and
tokenizer_config.json (Tekken's, chat template included) atomically.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, \
    processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_common import write_bytes_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NUM_CONTROL = 32          # Tekken ids 0..31: the 20 named control tokens and 12 spare ones
MIN_FREQUENCY = 2
# Tekken's pre-tokenizer (mistral_common tekken_240911.json "pattern"), copied here so that
# training needs no mistral-common; `tests/test_training_tools.py` checks it is the same.
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def control_tokens() -> list[str]:
    """Names of ids 0..NUM_CONTROL-1, Tekken's (`kolibri_trt.tokenizer.special_token_names`)."""
    from kolibri_trt.tokenizer import special_token_names
    return special_token_names()[:NUM_CONTROL]


def iter_texts(corpus_file: Path, max_bytes: int):
    """Document texts of a `*.jsonl.xz` corpus file, until `max_bytes` UTF-8 bytes."""
    seen = 0
    with lzma.open(corpus_file, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            text = json.loads(line)["text"]
            seen += len(text.encode("utf-8"))
            if seen > max_bytes:
                return
            yield text


def train_bpe(texts, vocab_size: int, names: list[str], progress: bool = True) -> Tokenizer:
    """A byte-level BPE of `vocab_size` ids (control tokens first, at ids 0..len(names)-1).

    Raises ValueError if vocab_size cannot hold the control tokens and the 256 bytes."""
    if vocab_size < len(names) + 256:
        raise ValueError(f"vocab_size {vocab_size} < {len(names)} control tokens + 256 bytes")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=MIN_FREQUENCY, special_tokens=names,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=progress)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{names[1]} $A", pair=f"{names[1]} $A $B", special_tokens=[(names[1], 1)])
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    for i, n in enumerate(names):
        if tok.token_to_id(n) != i:
            raise RuntimeError(f"control token {n!r} got id {tok.token_to_id(n)}, expected {i}")
    return tok


def write_tokenizer(tok: Tokenizer, out: Path) -> None:
    """tokenizer.json + Tekken's tokenizer_config.json (chat template), both atomically."""
    from kolibri_trt.tokenizer import tokenizer_config
    out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out / "tokenizer.json", tok.to_str(pretty=False).encode("utf-8"))
    config = json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    write_bytes_atomic(out / "tokenizer_config.json", config.encode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "corpus")
    ap.add_argument("--out", type=Path, help="default: <corpus>/tokenizer")
    ap.add_argument("--vocab-size", type=int, default=16384)
    ap.add_argument("--max-mb", type=float, default=60.0,
                    help="train on at most this many MB of the (shuffled) training split")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    out = args.out or args.corpus / "tokenizer"
    texts = iter_texts(args.corpus / "train.jsonl.xz", int(args.max_mb * 1e6))
    tok = train_bpe(texts, args.vocab_size, control_tokens())
    write_tokenizer(tok, out)
    from kolibri_trt.tokenizer import KolibriTokenizer
    kt = KolibriTokenizer.from_pretrained(out)
    sample = "Grüß Gott! def f(x):\n    return x ** 2  # Quadrat"
    if kt.decode(kt.encode(sample)) != sample:
        raise RuntimeError("the trained tokenizer does not round-trip text")
    print(f"wrote {out}: {kt.vocab_size} ids; {len(kt.encode(sample))} tokens for {sample!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
