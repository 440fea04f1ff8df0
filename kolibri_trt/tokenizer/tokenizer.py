"""Kolibri-1 tokenizer: a thin wrapper over a Hugging Face ``tokenizers.Tokenizer``.

Loads the checkpoint-layout files ``tokenizer.json`` and (optional) ``tokenizer_config.json``,
encodes plain text the way mistral-common's Tekkenizer does (special-token names inside text
are ordinary text), renders chat templates with jinja2 as Hugging Face does, and streams
detokenized text with :class:`IncrementalDetokenizer`.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from .tekken import BOS_TOKEN, CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, bytes_to_unicode, write_files_atomically

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
ROLES = ("system", "user", "assistant")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _token_name(value: Any, field: str, path: Path) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, {"content": ...} or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{path}: field {field!r} must be a string, {{'content': str}} or null")


def _read_config(path: Path) -> dict[str, Any]:
    """Parse tokenizer_config.json; {} if it does not exist.  Raises ValueError if malformed."""
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    template = config.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{path}: field 'chat_template' must be a string (named templates are not supported)")
    return config


def _validate_messages(messages: Any, add_generation_prompt: bool) -> None:
    """Raise ValueError naming the offending field if ``messages`` is not a valid chat."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError("messages: expected a non-empty list of {'role', 'content'} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}]: expected a dict, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role: unknown role {role!r}, expected one of {ROLES}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content: expected a string, got {type(content).__name__}")
        if role == "system" and i != 0:
            raise ValueError(f"messages[{i}].role: a 'system' message is only allowed first")
    if messages[0]["role"] == "system" and not any(m["role"] == "user" for m in messages):
        raise ValueError("messages[0].role: a 'system' message needs a 'user' message after it")
    if add_generation_prompt and messages[-1]["role"] != "user":
        raise ValueError(
            f"messages[{len(messages) - 1}].role: add_generation_prompt=True needs the last "
            f"message to be from the user, got {messages[-1]['role']!r}"
        )


class KolibriTokenizer:
    """Tokenizer for Kolibri-1 checkpoints.

    Plain-text :meth:`encode` treats special-token names (``<s>``, ``[INST]`` ...) in the text
    as ordinary text, exactly like mistral-common's ``Tekkenizer.encode``; only the chat
    template's control tokens become special ids (:meth:`apply_chat_template`).
    """

    def __init__(self, tokenizer: Tokenizer, config: Mapping[str, Any] | None = None, source: str = "<memory>"):
        """Wrap ``tokenizer`` (taken over: its ``encode_special_tokens`` flag is set to True).

        ``config`` is the parsed tokenizer_config.json (or None); ``source`` names it in errors.

        Raises:
            ValueError: if a configured bos/eos/pad token is not in the vocabulary, or no
                bos/eos token can be found.
        """
        self._tok = tokenizer
        self._tok.encode_special_tokens = True  # text is text, as in Tekkenizer
        self._config = dict(config or {})
        self._chat_template = self._config.get("chat_template") or CHAT_TEMPLATE
        self._bos_id = self._special_id("bos_token", BOS_TOKEN, source, required=True)
        self._eos_id = self._special_id("eos_token", EOS_TOKEN, source, required=True)
        self._pad_id = self._special_id("pad_token", PAD_TOKEN, source, required=False)
        specials = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        self._special_ids = {content: i for i, content in specials.items()}
        self._special_id_set = frozenset(specials)
        alternatives = sorted(self._special_ids, key=len, reverse=True)
        self._special_re = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")") if alternatives else None
        self._id_bytes: dict[int, bytes] = {}
        self._template: jinja2.Template | None = None

    def _special_id(self, field: str, default: str, source: str, required: bool) -> int | None:
        name = _token_name(self._config.get(field, default), field, Path(source))
        token_id = None if name is None else self._tok.token_to_id(name)
        if name is not None and token_id is None:
            raise ValueError(f"{source}: {field} {name!r} is not in the vocabulary")
        if required and token_id is None:
            raise ValueError(f"{source}: {field} is required")
        return token_id

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "KolibriTokenizer":
        """Load ``<path>/tokenizer.json`` and, if present, ``<path>/tokenizer_config.json``.

        Raises:
            FileNotFoundError: if ``<path>/tokenizer.json`` does not exist.
            ValueError: if either file cannot be parsed, or names unknown special tokens.
        """
        directory = Path(path)
        tok_path, config_path = directory / TOKENIZER_FILE, directory / CONFIG_FILE
        if not tok_path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {tok_path}")
        config = _read_config(config_path)
        try:
            tokenizer = Tokenizer.from_file(str(tok_path))
        except Exception as exc:  # tokenizers raises a bare Exception for bad files
            raise ValueError(f"{tok_path}: not a valid Hugging Face tokenizer.json ({exc})") from exc
        return cls(tokenizer, config, source=str(config_path if config else tok_path))

    @property
    def bos_token_id(self) -> int:
        """Id of the beginning-of-sequence token (``<s>`` = 1 for Tekken)."""
        return self._bos_id

    @property
    def eos_token_id(self) -> int:
        """Id of the end-of-sequence token (``</s>`` = 2 for Tekken)."""
        return self._eos_id

    @property
    def pad_token_id(self) -> int | None:
        """Id of the padding token (``<pad>`` = 11 for Tekken), or None if there is none."""
        return self._pad_id

    @property
    def vocab_size(self) -> int:
        """Total number of ids, special tokens included (131,072 for Tekken)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of all special (control) tokens."""
        return self._special_id_set

    def token_to_id(self, token: str) -> int | None:
        """Id of ``token`` (a vocabulary string, e.g. ``"[INST]"``), or None if absent."""
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Encode ``text`` to ids; special-token names in ``text`` are encoded as plain text.

        Raises:
            TypeError: if ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self._bos_id, *ids] if add_bos else ids

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = list(ids)
        size = self.vocab_size
        for i, token_id in enumerate(ids):
            if isinstance(token_id, bool) or not isinstance(token_id, Integral) or not 0 <= token_id < size:
                raise ValueError(f"ids[{i}]: {token_id!r} is not a token id in [0, {size})")
        return [int(t) for t in ids]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Decode ids to text; invalid UTF-8 (e.g. a cut-off character) becomes U+FFFD.

        Raises:
            ValueError: if an id is not an int in [0, vocab_size).
        """
        return self._tok.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)

    def render_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render the chat template to a string, as Hugging Face does (sandboxed jinja2).

        ``messages`` is a list of ``{"role": "system"|"user"|"assistant", "content": str}``; a
        system message may only come first.

        Raises:
            ValueError: naming the bad field (``messages[i].role`` / ``messages[i].content``), or
                if the template itself raises.
        """
        _validate_messages(messages, add_generation_prompt)
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception
            self._template = env.from_string(self._chat_template)
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                bos_token=self._tok.id_to_token(self._bos_id),
                eos_token=self._tok.id_to_token(self._eos_id),
                add_generation_prompt=add_generation_prompt,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from exc

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Render the chat template and encode it; control-token names become special ids.

        Like Hugging Face, special-token names are recognised anywhere in the rendered string,
        including inside message contents (mistral-common would encode those as plain text).

        Returns:
            Token ids, starting with ``bos_token_id``; with ``add_generation_prompt`` they end
            with ``[/INST]`` (id 4), where the assistant's answer begins.

        Raises:
            ValueError: as :meth:`render_chat_template`.
        """
        text = self.render_chat_template(messages, add_generation_prompt)
        if self._special_re is None:
            return self.encode(text)
        ids: list[int] = []
        for i, piece in enumerate(self._special_re.split(text)):
            if i % 2:
                ids.append(self._special_ids[piece])
            elif piece:
                ids.extend(self._tok.encode(piece, add_special_tokens=False).ids)
        return ids

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``path`` (atomically).

        Returns:
            ``Path(path)``.

        Raises:
            OSError: if the files cannot be written.
        """
        config = {"bos_token": self._tok.id_to_token(self._bos_id), "eos_token": self._tok.id_to_token(self._eos_id)}
        config = {**self._config, **config, "chat_template": self._chat_template}
        if self._pad_id is not None:
            config["pad_token"] = self._tok.id_to_token(self._pad_id)
        out = Path(path)
        write_files_atomically(out, {
            TOKENIZER_FILE: self._tok.to_str(pretty=False),
            CONFIG_FILE: json.dumps(config, indent=2, ensure_ascii=False) + "\n",
        })
        return out

    def token_bytes(self, token_id: int, skip_special_tokens: bool = True) -> bytes:
        """The bytes ``token_id`` decodes to (byte-level vocabularies); b"" for a skipped special.

        Raises:
            ValueError: if ``token_id`` is not a valid id.
        """
        if token_id in self._id_bytes:
            data = self._id_bytes[token_id]
        else:
            self._check_ids([token_id])
            token = self._tok.id_to_token(token_id)
            inverse = _unicode_to_bytes()
            try:
                data = bytes(inverse[c] for c in token)
            except KeyError:  # not byte-level spelled: the ByteLevel decoder keeps its UTF-8
                data = token.encode("utf-8")
            self._id_bytes[token_id] = data
        return b"" if skip_special_tokens and token_id in self._special_id_set else data

    def incremental_detokenizer(self, skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
        """A new :class:`IncrementalDetokenizer` for one generated sequence."""
        return IncrementalDetokenizer(self, skip_special_tokens)


@functools.lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


class IncrementalDetokenizer:
    """Streaming detokenizer for one sequence of generated ids.

    :meth:`add` takes one id or several and returns only the newly completed text.  Bytes of a
    character split across tokens are held back until the character completes, so a delta never
    contains a U+FFFD caused by such a split.  After :meth:`finish`, the concatenation of all
    deltas equals ``tokenizer.decode(all_ids, skip_special_tokens)``; bytes that are invalid
    UTF-8 for good are emitted as U+FFFD, as ``decode`` does.  Requires a byte-level BPE
    vocabulary (as Tekken's).
    """

    def __init__(self, tokenizer: KolibriTokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.ids: list[int] = []

    def add(self, ids: int | Iterable[int]) -> str:
        """Feed one id or an iterable of ids; return the text completed by them (maybe "").

        Raises:
            ValueError: if an id is not valid (nothing is consumed then).
        """
        batch = [ids] if isinstance(ids, Integral) else list(ids)
        data = b"".join(self._tokenizer.token_bytes(i, self._skip) for i in batch)
        self.ids.extend(int(i) for i in batch)
        return self._decoder.decode(data)

    def finish(self) -> str:
        """Flush held-back bytes at the end of the sequence (U+FFFD for an unfinished character)."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending_bytes(self) -> int:
        """Number of bytes held back, waiting for the rest of a character."""
        return len(self._decoder.getstate()[0])
