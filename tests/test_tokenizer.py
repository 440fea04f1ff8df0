"""Tests for kolibri_trt.tokenizer: Tekken -> Hugging Face conversion, chat template, streaming."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.base import TokenizerVersion
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer
from tokenizers import Tokenizer

from kolibri_trt.tokenizer import (
    KolibriTokenizer,
    special_token_names,
    tekken_source_path,
    tekken_tokenizer_json,
    write_tekken_tokenizer,
)
from kolibri_trt.tokenizer import tekken as tekken_mod

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PROMPTS = SHARED / "data" / "prompts"

GERMAN = "Größenänderung der Straße, Äpfel und Öl — übermäßig"
EMOJI = "Hi 👋🏽 Familie 👨‍👩‍👧‍👦, Flaggen 🇩🇪🇦🇹🇨🇭🏳️‍🌈, ❤️‍🔥 und 🧑🏿‍💻 fertig 🎉"
CODE = (
    "def f(x):\n\tif x:\n\t\treturn [i ** 2 for i in range(x)]\n    else:\n        pass\n\n\n"
    "class A:\n    '''Doc.'''\n\n    def g(self) -> None:\n\t    print('tab+spaces')\n"
)
CJK = "東京は日本の首都です。中文测试，繁體字；한국어 텍스트、カタカナ「引用」"
WHITESPACE = "  leading\t\ttabs \r\n crlf \u00a0nbsp\u3000ideo\u2028sep  \n\n\n trailing   \t"
CONTROL_NAMES = "<s>[INST] no control token here [/INST]</s><pad><SPECIAL_999>"
ROUND_TRIP = {"german": GERMAN, "emoji": EMOJI, "code": CODE, "cjk": CJK, "whitespace": WHITESPACE,
              "control_names_as_text": CONTROL_NAMES}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    return write_tekken_tokenizer(tmp_path_factory.mktemp("tekken"))


@pytest.fixture(scope="module")
def tok(tok_dir) -> KolibriTokenizer:
    return KolibriTokenizer.from_pretrained(tok_dir)


@pytest.fixture(scope="module")
def mistral() -> MistralTokenizer:
    return MistralTokenizer.from_file(str(tekken_source_path()))


@pytest.fixture(scope="module")
def tekken(mistral) -> Tekkenizer:
    inner = mistral.instruct_tokenizer.tokenizer
    assert isinstance(inner, Tekkenizer)
    return inner


def real_prompts() -> list[str]:
    if not SHARED.is_dir():
        pytest.skip(f"shared data folder absent: {SHARED} (real-prompt comparison needs it)")
    texts = []
    with open(PROMPTS / "spec_bench_question.jsonl", encoding="utf-8") as handle:
        for line in handle:
            texts.extend(json.loads(line)["turns"])
    with gzip.open(PROMPTS / "human_eval.jsonl.gz", "rt", encoding="utf-8") as handle:
        texts.extend(json.loads(line)["prompt"] for line in handle)
    return texts


# --- conversion -------------------------------------------------------------------------------

def test_files_written(tok_dir):
    assert (tok_dir / "tokenizer.json").stat().st_size > 1_000_000
    config = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == ("<s>", "</s>", "<pad>")
    assert "[INST]" in config["chat_template"]
    assert not list(tok_dir.glob("*.tmp"))


def test_conversion_is_cached(tok_dir, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("converted twice")

    monkeypatch.setattr(tekken_mod, "build_tekken_tokenizer", fail)
    assert tekken_tokenizer_json() is tekken_tokenizer_json(131072)
    assert tekken_tokenizer_json() == (tok_dir / "tokenizer.json").read_text(encoding="utf-8")


def test_vocab_size_and_special_ids(tok, tekken):
    assert tok.vocab_size == 131072 == tekken.n_words
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 11)
    expected = {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[TOOL_CALLS]": 9,
                "<pad>": 11, "[SYSTEM_PROMPT]": 17, "<SPECIAL_20>": 20, "<SPECIAL_999>": 999}
    assert {name: tok.token_to_id(name) for name in expected} == expected
    names = special_token_names()
    assert names == [tekken.id_to_piece(i) for i in range(1000)]
    assert [tok.token_to_id(n) for n in names] == list(range(1000))
    assert tok.special_token_ids == frozenset(range(1000))


def test_vocab_bytes_match_tekken(tok_dir, tekken):
    vocab = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab(with_added_tokens=False)
    inverse = {c: b for b, c in tekken_mod.bytes_to_unicode().items()}
    ours = {i: bytes(inverse[c] for c in s) for s, i in vocab.items() if i >= 1000}
    assert len(ours) == 130072
    assert all(ours[i] == tekken.id_to_byte_piece(i) for i in range(1000, 131072))


@pytest.mark.parametrize("name", sorted(ROUND_TRIP))
def test_round_trip_exact(tok, tekken, name):
    text = ROUND_TRIP[name]
    ids = tok.encode(text)
    assert ids == tekken.encode(text, bos=False, eos=False)
    assert tok.decode(ids) == text
    assert tok.encode(text, add_bos=True) == [1, *ids]


def test_matches_tekkenizer_on_real_prompts(tok, tekken):
    texts = real_prompts()
    assert len(texts) >= 600
    mismatched = [i for i, t in enumerate(texts) if tok.encode(t) != tekken.encode(t, bos=False, eos=False)]
    assert not mismatched, f"{len(mismatched)} prompts encode differently, first: {texts[mismatched[0]][:200]!r}"
    assert all(tok.decode(tok.encode(t)) == t for t in texts)


def test_smaller_vocab_matches_tekkenizer(tmp_path):
    vocab_size = 2000
    out = write_tekken_tokenizer(tmp_path, vocab_size=vocab_size)
    small = KolibriTokenizer.from_pretrained(out)
    assert small.vocab_size == vocab_size
    data = json.loads(tekken_source_path().read_text(encoding="utf-8"))
    reference = Tekkenizer(
        vocab=data["vocab"], special_tokens=list(Tekkenizer.DEPRECATED_SPECIAL_TOKENS),
        pattern=data["config"]["pattern"], vocab_size=vocab_size, num_special_tokens=1000,
        version=TokenizerVersion.v3,
    )
    for text in (GERMAN, CODE, EMOJI):
        ids = small.encode(text)
        assert ids == reference.encode(text, bos=False, eos=False)
        assert max(ids) < vocab_size and small.decode(ids) == text


@pytest.mark.parametrize("bad", [131073, 1255, 0])
def test_bad_vocab_size(tmp_path, bad):
    with pytest.raises(ValueError, match="vocab_size"):
        write_tekken_tokenizer(tmp_path, vocab_size=bad)
    assert not list(tmp_path.iterdir())


def test_write_failure_leaves_nothing(tmp_path):
    files = {"tokenizer.json": "{}", "tokenizer_config.json": "bad \ud800 surrogate"}
    with pytest.raises(UnicodeEncodeError):
        tekken_mod.write_files_atomically(tmp_path, files)
    assert not list(tmp_path.iterdir())


def test_save_pretrained_round_trip(tok, tmp_path):
    reloaded = KolibriTokenizer.from_pretrained(tok.save_pretrained(tmp_path / "copy"))
    assert reloaded.encode(GERMAN + EMOJI) == tok.encode(GERMAN + EMOJI)
    conversation = [{"role": "user", "content": "Hallo"}]
    assert reloaded.apply_chat_template(conversation) == tok.apply_chat_template(conversation)


# --- chat template ----------------------------------------------------------------------------

TWO_TURNS = [
    {"role": "user", "content": "Wie groß ist die Straße?"},
    {"role": "assistant", "content": "Sie ist 7 m breit."},
    {"role": "user", "content": "Und wie lang?"},
]


def mistral_ids(mistral, messages) -> list[int]:
    kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
    request = ChatCompletionRequest(messages=[kinds[m["role"]](content=m["content"]) for m in messages])
    return mistral.encode_chat_completion(request).tokens


def test_chat_template_two_turns(tok, tok_dir, mistral):
    text = tok.render_chat_template(TWO_TURNS)
    assert text == "<s>[INST]Wie groß ist die Straße?[/INST]Sie ist 7 m breit.</s>[INST]Und wie lang?[/INST]"
    ids = tok.apply_chat_template(TWO_TURNS)
    assert ids == mistral_ids(mistral, TWO_TURNS)
    q1, a1, q2 = (tok.encode(m["content"]) for m in TWO_TURNS)
    assert ids == [1, 3, *q1, 4, *a1, 2, 3, *q2, 4]
    hf = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))  # Hugging Face's own special-token parsing
    assert hf.encode(text, add_special_tokens=False).ids == ids


def test_chat_template_system_message(tok, mistral):
    one_turn = [{"role": "system", "content": "Antworte kurz."}, TWO_TURNS[0]]
    assert tok.apply_chat_template(one_turn) == mistral_ids(mistral, one_turn)
    text = tok.render_chat_template([one_turn[0], *TWO_TURNS])
    # prepended to the FIRST user turn (mistral-common v3 uses the last one)
    assert text.startswith("<s>[INST]Antworte kurz.\n\nWie groß ist die Straße?[/INST]")
    assert text.endswith("</s>[INST]Und wie lang?[/INST]")


def test_chat_template_generation_prompt(tok):
    closed = TWO_TURNS[:2]
    ids = tok.apply_chat_template(closed, add_generation_prompt=False)
    assert ids[-1] == tok.eos_token_id and ids[:2] == [1, 3]
    with pytest.raises(ValueError, match=r"messages\[1\]\.role"):
        tok.apply_chat_template(closed, add_generation_prompt=True)
    assert tok.apply_chat_template(TWO_TURNS, add_generation_prompt=False) == tok.apply_chat_template(TWO_TURNS)


def test_chat_template_errors(tok):
    with pytest.raises(ValueError, match=r"messages\[1\]\.role.*'tool'"):
        tok.apply_chat_template([TWO_TURNS[0], {"role": "tool", "content": "x"}, TWO_TURNS[2]])
    with pytest.raises(ValueError, match=r"messages\[0\]\.content"):
        tok.apply_chat_template([{"role": "user", "content": ["not", "a", "string"]}])
    with pytest.raises(ValueError, match=r"messages\[0\]\.content"):
        tok.apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match=r"messages\[1\]\.role.*system"):
        tok.apply_chat_template([TWO_TURNS[0], {"role": "system", "content": "late"}])
    with pytest.raises(ValueError, match="messages"):
        tok.apply_chat_template([])


# --- loading and decoding errors --------------------------------------------------------------

def test_missing_tokenizer_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        KolibriTokenizer.from_pretrained(tmp_path)


def test_bad_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": 42}', encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer.json"):
        KolibriTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("config, field", [
    ("{not json", "tokenizer_config.json"),
    ("[1, 2]", "tokenizer_config.json"),
    ('{"chat_template": 5}', "chat_template"),
    ('{"bos_token": "<nope>"}', "bos_token"),
    ('{"eos_token": 7}', "eos_token"),
])
def test_bad_config_file(tok_dir, tmp_path, config, field):
    shutil.copy(tok_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(config, encoding="utf-8")
    with pytest.raises(ValueError, match=field):
        KolibriTokenizer.from_pretrained(tmp_path)


def test_decode_and_encode_errors(tok):
    for bad in ([131072], [-1], [1.5], ["a"]):
        with pytest.raises(ValueError, match=r"ids\[0\]"):
            tok.decode(bad)
    with pytest.raises(TypeError):
        tok.encode(None)


def test_decode_special_tokens(tok):
    ids = tok.apply_chat_template([{"role": "user", "content": "Hallo"}])
    assert tok.decode(ids) == "Hallo"
    assert tok.decode(ids, skip_special_tokens=False) == "<s>[INST]Hallo[/INST]"


# --- incremental detokenizer ------------------------------------------------------------------

STREAM_TEXT = f"{GERMAN} {EMOJI} {CJK}"


def stream(tok, ids, chunk, skip_special_tokens=True) -> list[str]:
    detok = tok.incremental_detokenizer(skip_special_tokens)
    deltas = [detok.add(ids[i] if chunk == 1 else ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.finish())
    assert detok.ids == list(ids)
    return deltas


@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_detokenizer(tok, chunk):
    ids = tok.encode(STREAM_TEXT)
    assert any("\ufffd" in tok.decode([i]) for i in ids), "text should split characters across tokens"
    deltas = stream(tok, ids, chunk)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == STREAM_TEXT


@pytest.mark.parametrize("skip", [True, False])
def test_incremental_detokenizer_special_tokens(tok, skip):
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}]) + tok.encode(EMOJI) + [2]
    for chunk in (1, 3):
        assert "".join(stream(tok, ids, chunk, skip)) == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("raw", [b"\xe4A", b"\xf0\x9f", b"\xf0\x80\x80A", b"\xc3", b"\xed\xa0\x80x", b"\xff\xfe"])
def test_incremental_detokenizer_invalid_bytes(tok, raw):
    ids = [1000 + b for b in raw]  # ranks 0..255 are the single bytes
    for chunk in (1, 3):
        assert "".join(stream(tok, ids, chunk)) == tok.decode(ids)


def test_incremental_detokenizer_holds_back(tok):
    detok = tok.incremental_detokenizer()
    euro = [1000 + b for b in "€".encode()]
    assert detok.add(euro[0]) == "" and detok.pending_bytes == 1
    assert detok.add(euro[1:]) == "€" and detok.pending_bytes == 0
    with pytest.raises(ValueError):
        detok.add([5, 131072])
    assert detok.ids == euro
