"""Prompt sets for demos, tests and benchmarks: Spec-Bench and HumanEval JSONL (optionally gzipped).

Spec-Bench records are `{"question_id", "category", "turns": [...]}` (the first turn is the
prompt); its eight MT-Bench categories (writing, roleplay, ...) form the group "mt_bench", as
Spec-Bench reports them. HumanEval records are `{"task_id", "prompt", ...}` (category
"humaneval"). A record with only `{"prompt": ...}` is accepted too (category "custom").
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")


@dataclass(frozen=True)
class Prompt:
    """One prompt: `id` as in the source file, `category` (Spec-Bench group), `text`."""

    id: str
    category: str
    text: str


def _record_to_prompt(rec: dict, where: str) -> Prompt:
    if "turns" in rec:
        turns = rec["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{where}: field 'turns' must be a non-empty list of strings")
        cat = rec.get("category", "custom")
        return Prompt(str(rec.get("question_id", where)), "mt_bench" if cat in MT_BENCH else cat,
                      turns[0])
    if isinstance(rec.get("prompt"), str):
        cat = "humaneval" if "task_id" in rec else rec.get("category", "custom")
        return Prompt(str(rec.get("task_id", where)), cat, rec["prompt"])
    raise ValueError(f"{where}: record needs 'turns' (Spec-Bench) or 'prompt' (string)")


def load_prompts(path: str | Path, per_category: int | None = None,
                 categories: tuple[str, ...] | None = None, limit: int | None = None
                 ) -> list[Prompt]:
    """Read prompts in file order.

    per_category: keep at most this many of each category; categories: keep only these;
    limit: at most this many in all.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: a line is not JSON or not a known record shape (names file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    out: list[Prompt] = []
    seen: dict[str, int] = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{n}: each line must be a JSON object")
            p = _record_to_prompt(rec, f"{path}:{n}")
            if categories is not None and p.category not in categories:
                continue
            if per_category is not None and seen.get(p.category, 0) >= per_category:
                continue
            seen[p.category] = seen.get(p.category, 0) + 1
            out.append(p)
            if limit is not None and len(out) >= limit:
                break
    return out
