"""Errors raised when a checkpoint, config or engine does not follow `shared/spec/`."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint file contradicts the spec (`shared/spec/kolibri-1.md`, `block-drafter.md`).

    The message always names the file and, where one is at fault, the tensor or the config
    field, e.g. ``/ckpt/config.json: field 'layer_types': has 9 entries, num_hidden_layers is 10``
    or ``/ckpt/model.safetensors: tensor 'lm_head.weight': shape (8, 4), expected (16, 4)``.

    Attributes:
        path: the file at fault (str), or None when no single file is.
        field: the config field at fault, or None.
        tensor: the tensor name at fault, or None.
    """

    def __init__(self, path: str | Path | None, message: str, *, field: str | None = None,
                 tensor: str | None = None):
        self.path = None if path is None else str(path)
        self.field = field
        self.tensor = tensor
        where = self.path or "<checkpoint>"
        what = ""
        if field is not None:
            what = f"field {field!r}: "
        elif tensor is not None:
            what = f"tensor {tensor!r}: "
        super().__init__(f"{where}: {what}{message}")
