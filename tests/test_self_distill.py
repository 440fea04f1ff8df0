"""Self-distillation data (`tools/gen_self_distill.py`) and its use by the drafter trainer
(`tools/train_drafter.py --generated`): prompts from corpus documents, the token stream's
layout, the held-out tail, and batches that mix generated and corpus windows."""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import gen_self_distill as gsd  # noqa: E402
import generated_stream as gs  # noqa: E402

from kolibri_trt.tokenizer import KolibriTokenizer  # noqa: E402

MINI_TOKENIZER = ROOT / "checkpoints" / "kolibri-mini" / "target"
DOCS = [{"lang": "de", "source": "t", "text": "Der Hund läuft schnell nach Hause. Die Katze "
         "schläft auf dem warmen Sofa. Am Abend regnet es in der ganzen Stadt."},
        {"lang": "en", "source": "t", "text": "The cache keeps four bits per value. Every key "
         "is rotated before it is stored. The scale and offset follow the codes."},
        {"lang": "code", "source": "t", "text": "def f(x):\n    return x + 1\n\nprint(f(2))\n"}]


@pytest.fixture(scope="module")
def tok():
    return KolibriTokenizer.from_pretrained(MINI_TOKENIZER)


def test_prompts_wrap_sentences_or_take_a_prefix(tok):
    rng = np.random.default_rng(0)
    for doc in DOCS:
        wrapped = tok.decode(gsd.make_prompt(doc, True, rng, tok)[1:])
        kinds = gsd.CODE_INSTRUCTIONS if doc["lang"] == "code" else gsd.INSTRUCTIONS[doc["lang"]]
        assert any(wrapped.startswith(k.split("{}")[0]) for k in kinds), wrapped
        plain = gsd.make_prompt(doc, False, rng, tok)
        full = tok.encode(doc["text"].strip(), add_bos=True)
        assert plain[0] == tok.bos_token_id and plain == full[:len(plain)]
        assert len(plain) <= gsd.PREFIX_TOKENS[1]
    sents = tok.decode(gsd.make_prompt(DOCS[0], True, np.random.default_rng(3), tok)[1:])
    assert any(s in sents for s in ("Hund", "Katze", "Abend"))


def test_generated_stream_layout_on_cpu(built_engine, tmp_path):
    corpus = tmp_path / "train.jsonl.xz"
    with lzma.open(corpus, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in DOCS)
    out = tmp_path / "gen" / "train.npy"
    assert gsd.main(["--engine", str(built_engine), "--device", "cpu", "--corpus", str(corpus),
                     "--out", str(out), "--samples", "3", "--chunk", "2", "--max-tokens", "5",
                     "--max-num-seqs", "2", "--kv-cache-gib", "0.02"]) == 0
    arr = np.load(out)
    meta = json.loads(out.with_suffix(".json").read_text())
    assert (meta["samples"], meta["generated_tokens"], meta["tokens"]) == (3, 15, arr.size)
    cfg = json.loads((Path(built_engine) / "target" / "config.json").read_text())
    bos, eos = cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)
    eos = eos[0] if isinstance(eos, list) else eos
    assert arr[0] == bos and arr[-1] == eos
    assert (arr == bos).sum() == 3 and (arr == eos).sum() >= 3   # one <s> per sample
    assert not out.with_suffix(".tmp.npy").exists()


def test_missing_corpus_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="--corpus"):
        gsd.load_docs(tmp_path / "nope.jsonl.xz")


def test_batches_mix_generated_and_corpus_windows(tmp_path):
    corpus = np.arange(0, 500, dtype=np.uint16)            # ids < 1000
    gen = np.arange(1000, 1400, dtype=np.uint16)          # ids >= 1000
    args = SimpleNamespace(seq_len=7, batch_size=4, seed=0, generated_fraction=0.75,
                           generated=None)
    b = gs.train_batch(corpus, gen, 3, args)
    assert b.shape == (4, 8)
    assert (b[:1] < 1000).all() and (b[1:] >= 1000).all()
    assert (b[:, 1:] - b[:, :-1] == 1).all()               # contiguous windows
    assert b.equal(gs.train_batch(corpus, gen, 3, args))
    assert not b.equal(gs.train_batch(corpus, gen, 4, args))
    only_corpus = gs.train_batch(corpus, None, 3, args)
    assert (only_corpus < 1000).all() and only_corpus.shape == (4, 8)
    np.save(tmp_path / "g.npy", gen)
    args.generated = tmp_path / "g.npy"
    fit, held = gs.load_generated(args)
    assert len(held) == round(len(gen) * gs.GENERATED_HOLDOUT)
    assert np.array_equal(np.concatenate([fit, held]), gen)
    args.generated_fraction = 1.5
    with pytest.raises(ValueError, match="--generated-fraction"):
        gs.load_generated(args)
    args.generated, args.generated_fraction = tmp_path / "missing.npy", 0.5
    with pytest.raises(FileNotFoundError, match="--generated"):
        gs.load_generated(args)
    np.save(tmp_path / "short.npy", gen[:100])      # held-out tail: 5 tokens < one window
    args.generated = tmp_path / "short.npy"
    with pytest.raises(ValueError, match="held-out 5% needs one window"):
        gs.load_generated(args)
    args.generated, args.generated_fraction = None, 0.5
    with pytest.raises(ValueError, match="only with --generated"):
        gs.load_generated(args)
    args.generated_fraction = None
    assert gs.load_generated(args) == (None, None)
