"""The README opens with exactly two commands, and CI runs the second one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    head = text.split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", head, flags=re.S)]


def test_readme_opens_with_two_commands_and_ci_runs_the_tests():
    commands = _opening_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert "pytest" in commands[1] and "torch==2.13.0" in commands[0]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_every_package_is_listed_in_pyproject():
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "kolibri_trt").rglob("__init__.py")}
    assert found | {"kolibri_trt_plugins"} == listed
