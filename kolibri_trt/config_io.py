"""Typed reading of `config.json`-style files, with errors that name the file and the field.

Used by `KolibriConfig` and `DrafterConfig`; both are frozen dataclasses checked on load.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import CheckpointError


def read_json(path: str | Path) -> Any:
    """Parse a JSON file.

    Raises:
        CheckpointError: the file is missing or is not valid JSON (names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON ({exc})") from None


def write_texts_atomic(directory: str | Path, files: dict[str, str]) -> None:
    """Write `{name: text}` (UTF-8) into `directory`: every file goes to a temporary file
    first and all are renamed only once all were written, so a failure leaves none of them.

    The files are left readable by everyone (0644), like any other build output.
    """
    directory = Path(directory)
    temps: dict[str, str] = {}
    try:
        for name, text in files.items():
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
            temps[name] = tmp
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
        for name, tmp in temps.items():
            os.replace(tmp, directory / name)
    finally:
        for tmp in temps.values():
            Path(tmp).unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write one text file with `write_texts_atomic` (never half-written)."""
    path = Path(path)
    write_texts_atomic(path.parent, {path.name: text})


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write `obj` as indented JSON with `write_text_atomic`."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


class FieldReader:
    """Pulls typed fields out of a parsed JSON object; every error names file and field."""

    def __init__(self, data: Any, path: str | Path | None):
        self.path = path
        if not isinstance(data, dict):
            raise CheckpointError(path, f"top level must be a JSON object, got {type(data).__name__}")
        self.data = data

    def error(self, field: str, message: str) -> CheckpointError:
        return CheckpointError(self.path, message, field=field)

    def get(self, field: str, default: Any = ...) -> Any:
        if field not in self.data:
            if default is ...:
                raise self.error(field, "missing")
            return default
        return self.data[field]

    def int(self, field: str, default: Any = ..., minimum: int | None = 1) -> int:
        value = self.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(field, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(field, f"must be >= {minimum}, got {value}")
        return value

    def float(self, field: str, default: Any = ..., positive: bool = True) -> float:
        value = self.get(field, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(field, f"must be a number, got {value!r}")
        if positive and not value > 0:
            raise self.error(field, f"must be > 0, got {value}")
        return float(value)

    def bool(self, field: str, default: Any = ...) -> bool:
        value = self.get(field, default)
        if not isinstance(value, bool):
            raise self.error(field, f"must be true or false, got {value!r}")
        return value

    def str(self, field: str, default: Any = ..., choices: tuple[str, ...] | None = None) -> str:
        value = self.get(field, default)
        if not isinstance(value, str):
            raise self.error(field, f"must be a string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.error(field, f"must be one of {list(choices)}, got {value!r}")
        return value

    def int_list(self, field: str, default: Any = ..., minimum: int | None = 0) -> tuple[int, ...]:
        value = self.get(field, default)
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(field, f"must be a list of integers, got {value!r}")
        if minimum is not None and any(v < minimum for v in value):
            raise self.error(field, f"entries must be >= {minimum}, got {value}")
        return tuple(value)
