"""Convert mistral-common's Tekken tokenizer into Hugging Face ``tokenizers`` files.

Kolibri-1 uses the Tekken vocabulary shipped in the mistral-common wheel
(``mistral_common/data/tekken_240911.json``): 1,000 special tokens (ids 0..999) followed by
the first 130,072 byte-level BPE ranks (id = rank + 1000), 131,072 ids in all.  This module
turns it into the checkpoint-layout files ``tokenizer.json`` and ``tokenizer_config.json``.

Conversion scheme (the usual tiktoken -> Hugging Face recipe):

* vocab: every rank's bytes, spelled through the GPT-2 bytes-to-unicode map, at id rank + 1000;
  the special tokens occupy ids 0..999 with mistral-common's names.
* merges: for every multi-byte token, each split into two pieces that are both in the vocab,
  ordered by the merged token's rank, then the left and right pieces' ranks.  The BPE model
  has ``ignore_merges`` set, which mirrors tiktoken's shortcut of taking a whole pre-token that
  is itself in the vocab.
* pre-tokenizer: ``Split`` on Tekken's regex (behaviour "isolated"), then
  ``ByteLevel(add_prefix_space=False, use_regex=False)``; decoder: ``ByteLevel``.
* post-processor: prepends ``<s>`` when a Hugging Face caller asks for special tokens, like
  Mistral's own Hugging Face tokenizer files.
"""

from __future__ import annotations

import base64
import functools
import importlib.resources
import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from ..config_io import write_texts_atomic

TEKKEN_FILE = "tekken_240911.json"
NUM_SPECIAL_TOKENS = 1000
MAX_VOCAB_SIZE = 131072
MIN_VOCAB_SIZE = NUM_SPECIAL_TOKENS + 256
MODEL_MAX_LENGTH = 262144  # max_position_embeddings of Kolibri-1

BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, PAD_TOKEN = "<s>", "</s>", "<unk>", "<pad>"

# Mistral's instruct format for Tekken (v3): <s>[INST]user[/INST]assistant</s>[INST]...[/INST]
# A leading system message is prepended, followed by a blank line, to the FIRST user turn
# (mistral-common's v3 encoder puts it in the LAST user turn instead; the first turn keeps the
# prompt prefix stable across turns, which prefix caching relies on).
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = none %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- if add_generation_prompt and loop_messages and loop_messages[-1]['role'] != 'user' %}"
    "{{- raise_exception('add_generation_prompt needs the last message to be from the user') }}"
    "{%- endif %}"
    "{{- bos_token }}"
    "{%- set ns = namespace(system_pending=system_message is not none) %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if ns.system_pending %}"
    "{{- '[INST]' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- set ns.system_pending = false %}"
    "{%- else %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- message['content'] + eos_token }}"
    "{%- else %}"
    "{{- raise_exception('Unknown role: ' + message['role']) }}"
    "{%- endif %}"
    "{%- endfor %}"
)


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """Return the GPT-2 byte-level map: each byte 0..255 to one printable unicode character.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100 onwards, in
    byte order.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def byte_level_string(data: bytes) -> str:
    """Spell ``data`` in the byte-level alphabet of :func:`bytes_to_unicode`."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in data)


def tekken_source_path() -> Path:
    """Return the path of the Tekken JSON inside the installed mistral-common wheel.

    Raises:
        FileNotFoundError: if mistral-common does not ship ``data/tekken_240911.json``.
    """
    path = Path(str(importlib.resources.files("mistral_common") / "data" / TEKKEN_FILE))
    if not path.is_file():
        raise FileNotFoundError(f"Tekken tokenizer not found in mistral-common: {path}")
    return path


def special_token_names(num_special: int = NUM_SPECIAL_TOKENS) -> list[str]:
    """Return the names of the special tokens 0..num_special-1, as mistral-common names them.

    The defined ones come from ``Tekkenizer.DEPRECATED_SPECIAL_TOKENS`` (the list mistral-common
    uses for v3 Tekken files, which carry none), the rest are ``<SPECIAL_{id}>`` fillers.
    """
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # conversion time only

    defined = sorted(Tekkenizer.DEPRECATED_SPECIAL_TOKENS, key=lambda t: t["rank"])
    names = [str(getattr(t["token_str"], "value", t["token_str"])) for t in defined]
    if [t["rank"] for t in defined] != list(range(len(defined))):
        raise ValueError("mistral-common's special tokens are not numbered 0..n-1")
    names += [Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i) for i in range(len(names), num_special)]
    return names[:num_special]


def _load_tekken(path: Path) -> tuple[str, list[bytes]]:
    """Read a Tekken JSON file; return (pre-tokenizer regex, token bytes in rank order).

    Raises:
        ValueError: if the file's layout is not what this converter expects.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    config, vocab = data["config"], data["vocab"]
    expected = {"default_vocab_size": MAX_VOCAB_SIZE, "default_num_special_tokens": NUM_SPECIAL_TOKENS}
    for key, value in expected.items():
        if config.get(key) != value:
            raise ValueError(f"{path}: config.{key} is {config.get(key)!r}, expected {value}")
    if data.get("special_tokens") is not None:
        raise ValueError(f"{path}: carries its own special_tokens; this converter expects v3 (none)")
    ranks = [entry["rank"] for entry in vocab]
    if ranks != list(range(len(vocab))):
        raise ValueError(f"{path}: vocab ranks are not 0..{len(vocab) - 1} in order")
    return config["pattern"], [base64.b64decode(entry["token_bytes"]) for entry in vocab]


def _bpe_merges(token_bytes: list[bytes]) -> list[tuple[str, str]]:
    """Derive BPE merges from ranked tokens (index = rank), as tiktoken -> HF converters do.

    Every split of a multi-byte token into two in-vocab pieces is a merge; merges are ordered
    by the merged token's rank, then the left piece's rank, then the right piece's rank.
    """
    rank_of = {tok: rank for rank, tok in enumerate(token_bytes)}
    found: list[tuple[int, int, int]] = []
    for rank, tok in enumerate(token_bytes):
        for cut in range(1, len(tok)):
            left, right = rank_of.get(tok[:cut]), rank_of.get(tok[cut:])
            if left is not None and right is not None:
                found.append((rank, left, right))
    found.sort()
    spelled = [byte_level_string(tok) for tok in token_bytes]
    return [(spelled[left], spelled[right]) for _, left, right in found]


def _check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size must be in [{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE}] "
            f"({NUM_SPECIAL_TOKENS} special tokens + at least the 256 byte tokens), got {vocab_size}"
        )


def build_tekken_tokenizer(vocab_size: int = MAX_VOCAB_SIZE) -> Tokenizer:
    """Build a fresh ``tokenizers.Tokenizer`` equivalent to Tekken (no caching).

    Args:
        vocab_size: total ids, 1,000 special tokens plus the first ``vocab_size - 1000`` ranks.

    Raises:
        TypeError: if ``vocab_size`` is not an int.
        ValueError: if ``vocab_size`` is outside [1256, 131072], the Tekken file has an
            unexpected layout, or a special-token name collides with a BPE token.
    """
    _check_vocab_size(vocab_size)
    pattern, token_bytes = _load_tekken(tekken_source_path())
    token_bytes = token_bytes[: vocab_size - NUM_SPECIAL_TOKENS]
    if any(token_bytes[b] != bytes([b]) for b in range(256)):
        raise ValueError("Tekken ranks 0..255 are not the 256 single bytes")
    names = special_token_names()
    vocab = {name: i for i, name in enumerate(names)}
    for rank, tok in enumerate(token_bytes):
        spelled = byte_level_string(tok)
        if spelled in vocab:
            raise ValueError(f"BPE rank {rank} ({tok!r}) collides with token {spelled!r}")
        vocab[spelled] = rank + NUM_SPECIAL_TOKENS
    model = models.BPE(vocab=vocab, merges=_bpe_merges(token_bytes), ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, 1)]
    )
    tokenizer.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    return tokenizer


def tekken_tokenizer_json(vocab_size: int = MAX_VOCAB_SIZE) -> str:
    """Return the ``tokenizer.json`` text for Tekken, converting once per process and size.

    The first call for a given ``vocab_size`` takes about 1.3-1.5 s at 131,072 ids (measured on
    2 CPU cores: ~0.2 s reading the Tekken JSON, ~0.6 s deriving the 269,443 merges, ~0.6 s
    building and serialising); later calls return the cached string (microseconds).

    Raises:
        TypeError, ValueError: as :func:`build_tekken_tokenizer`.
    """
    _check_vocab_size(vocab_size)
    return _cached_tokenizer_json(int(vocab_size))


@functools.lru_cache(maxsize=4)
def _cached_tokenizer_json(vocab_size: int) -> str:
    # one positional key per size, so f() and f(131072) share the cache entry
    return build_tekken_tokenizer(vocab_size).to_str(pretty=False)


def tokenizer_config() -> dict:
    """Return the ``tokenizer_config.json`` contents (special tokens and the chat template)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def write_files_atomically(out_dir: Path, files: dict[str, str]) -> None:
    """Write ``{name: text}`` into ``out_dir``: all to temp files first, then rename each.

    Raises:
        OSError: if a file cannot be written or renamed.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    write_texts_atomic(out_dir, files)


def write_tekken_tokenizer(out_dir: str | Path, vocab_size: int = MAX_VOCAB_SIZE) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for Tekken into ``out_dir``.

    The directory is created if needed.  Both files are written to temp files and renamed, so a
    failure leaves no half-written file behind.  Conversion is cached per process (see
    :func:`tekken_tokenizer_json`); ``tokenizer.json`` is 7,340,602 bytes at 131,072 ids.

    Args:
        out_dir: target directory.
        vocab_size: total ids (special + BPE), 1256..131072; default 131072.

    Returns:
        ``Path(out_dir)``, ready for ``KolibriTokenizer.from_pretrained``.

    Raises:
        TypeError, ValueError: for a bad ``vocab_size`` (see :func:`build_tekken_tokenizer`).
        OSError: if the files cannot be written.
    """
    out = Path(out_dir)
    files = {
        "tokenizer.json": tekken_tokenizer_json(vocab_size),
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n",
    }
    write_files_atomically(out, files)
    return out
