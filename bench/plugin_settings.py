"""--set MODULE.NAME=VALUE for the bench scripts (gpu_check.py, fullsize.py): a plugin module's
setting, e.g. ``moe_experts.ALIGN_TOKENS=64``, for one run (A/B runs, checks of variants)."""

from __future__ import annotations

import ast
import importlib


def apply_settings(pairs: list[str]) -> None:
    """--set MODULE.NAME=VALUE: a plugin module's setting (kolibri_trt_plugins.MODULE.NAME, which
    must exist) to a Python literal, before any check runs. SystemExit naming the bad pair."""
    for pair in pairs:
        target, _, text = pair.partition("=")
        module, _, name = target.rpartition(".")
        try:
            mod = importlib.import_module(f"kolibri_trt_plugins.{module}")
            if not name or not hasattr(mod, name):
                raise AttributeError(name)
            setattr(mod, name, ast.literal_eval(text))
        except (ImportError, AttributeError, ValueError, SyntaxError) as exc:
            raise SystemExit(f"--set {pair!r}: {exc!r}") from None
        print(f"setting {module}.{name} = {getattr(mod, name)!r}", flush=True)
