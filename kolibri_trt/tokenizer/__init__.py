"""Kolibri-1 tokenizer: Tekken (mistral-common) converted to Hugging Face ``tokenizers`` files."""

from .tekken import (
    CHAT_TEMPLATE,
    MAX_VOCAB_SIZE,
    NUM_SPECIAL_TOKENS,
    build_tekken_tokenizer,
    special_token_names,
    tekken_source_path,
    tekken_tokenizer_json,
    tokenizer_config,
    write_tekken_tokenizer,
)
from .tokenizer import IncrementalDetokenizer, KolibriTokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "MAX_VOCAB_SIZE",
    "NUM_SPECIAL_TOKENS",
    "IncrementalDetokenizer",
    "KolibriTokenizer",
    "build_tekken_tokenizer",
    "special_token_names",
    "tekken_source_path",
    "tekken_tokenizer_json",
    "tokenizer_config",
    "write_tekken_tokenizer",
]
