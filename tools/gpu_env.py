"""Make `kolibri_trt` importable where the project is not pip-installed (the GPU machine runs
it from the working tree with PYTHONPATH=. and can install nothing).

Import this module before `kolibri_trt`. It
- maps `kolibri_trt_plugins` onto ./plugins when the package is not installed, as
  `bench/gpu_check.py` does (the runtime imports it);
- nothing for `mistral_common`: `kolibri_trt.tokenizer.tekken` imports it only when it
  converts the Tekken file, which the training tools never do.
Nothing changes where both are installed (the CPU machine, CI).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _map_plugins() -> None:
    try:
        import kolibri_trt_plugins  # noqa: F401
        return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(
        "kolibri_trt_plugins", ROOT / "plugins" / "__init__.py",
        submodule_search_locations=[str(ROOT / "plugins")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kolibri_trt_plugins"] = mod
    spec.loader.exec_module(mod)


_map_plugins()
