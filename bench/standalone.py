"""Run the bench scripts from a plain checkout: the GPU machines here can install nothing.

Importing this module puts the repository root, tests/ and bench/ on sys.path and, when the
package is not installed, maps ``kolibri_trt_plugins`` onto ``./plugins`` (the name
pyproject.toml installs it under). Bench scripts import it before ``kolibri_trt``; bench/ is
``sys.path[0]`` when one of them runs, and spawned worker processes inherit ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

for _path in (ROOT / "bench", ROOT / "tests", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

try:
    import kolibri_trt_plugins  # noqa: F401  (pip-installed: nothing to map)
except ImportError:   # repo not pip-installed
    _spec = importlib.util.spec_from_file_location(
        "kolibri_trt_plugins", ROOT / "plugins" / "__init__.py",
        submodule_search_locations=[str(ROOT / "plugins")])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["kolibri_trt_plugins"] = _mod
    _spec.loader.exec_module(_mod)


def record(results: dict, name: str, ok: bool, detail: str = "") -> None:
    """Store one pass/fail check in results["checks"] and print it."""
    results.setdefault("checks", {})[name] = {"ok": bool(ok), "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)


def run_steps(steps, results: dict, out_file: Path) -> int:
    """Run (name, fn) steps in order. A step that raises is a failed check "<name> ran" (the
    traceback kept); results are rewritten to out_file (JSON) after every step, so a cut-off
    call still returns what it measured. Returns 1 if any check failed, else 0."""
    import json
    import time
    import traceback
    t0 = time.time()
    for name, fn in steps:
        try:
            fn()
        except Exception:
            record(results, f"{name} ran", False, traceback.format_exc()[-3000:])
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(json.dumps(results, indent=1))
    checks = results.get("checks", {})
    failed = [n for n, c in checks.items() if not c["ok"]]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks passed in {time.time() - t0:.0f} s;"
          f" failed: {failed}")
    return 1 if failed else 0


def mark_mismatches(rows: list[dict]) -> int:
    """Set row["mismatches_vs_off"] for every run in `rows`: the requests whose token_ids differ
    from rows[0]'s (the speculative="off" run). Returns the largest count."""
    base = rows[0]["token_ids"]
    for r in rows:
        r["mismatches_vs_off"] = sum(a != b for a, b in zip(r["token_ids"], base))
    return max(r["mismatches_vs_off"] for r in rows)
