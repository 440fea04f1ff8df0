"""Make `kolibri_trt` importable where the project is not pip-installed (the GPU machine runs
it from the working tree with PYTHONPATH=. and can install nothing).

Import this module before `kolibri_trt`. It
- maps `kolibri_trt_plugins` onto ./plugins when the package is not installed, through
  `bench/standalone.py` as the bench scripts do (the runtime imports it);
- nothing for `mistral_common`: `kolibri_trt.tokenizer.tekken` imports it only when it
  converts the Tekken file, which the training tools never do.
Nothing changes where both are installed (the CPU machine, CI).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (maps kolibri_trt_plugins onto ./plugins if needed)
