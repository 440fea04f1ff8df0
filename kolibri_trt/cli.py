"""`kolibri-trt` command line: fixtures and the reference generation loop.

    kolibri-trt make-fixtures [--out DIR] [--seed N] [--force]
    kolibri-trt reference-generate --model DIR (--prompt TEXT | --prompts-file JSONL)
        [--per-category N] [--limit N] [--max-tokens N] [--temperature T] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .fixtures import DEFAULT_DIR


def _make_fixtures(args: argparse.Namespace) -> int:
    from .fixtures import make_fixtures

    t0 = time.perf_counter()
    target, drafter = make_fixtures(args.out, seed=args.seed, force=args.force)
    print(f"wrote {target} and {drafter} in {time.perf_counter() - t0:.1f} s")
    return 0


def _prompts(args: argparse.Namespace) -> list:
    from .prompts import Prompt, load_prompts

    if args.prompt is not None:
        return [Prompt("cli", "custom", args.prompt)]
    return load_prompts(args.prompts_file, per_category=args.per_category, limit=args.limit)


def _reference_generate(args: argparse.Namespace) -> int:
    import torch

    from .model.reference import KolibriForCausalLM
    from .reference_generate import reference_generate
    from .sampling import SamplingParams
    from .tokenizer import KolibriTokenizer

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed)
    model = KolibriForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    tok = KolibriTokenizer.from_pretrained(args.model)
    total_tokens, total_time = 0, 0.0
    for p in _prompts(args):
        ids = tok.apply_chat_template([{"role": "user", "content": p.text}])
        t0 = time.perf_counter()
        out = reference_generate(model, ids, params)
        dt = time.perf_counter() - t0
        total_tokens, total_time = total_tokens + len(out.token_ids), total_time + dt
        head = p.text[:70].replace("\n", " ")
        print(f"[{p.category}] {head!r} ({len(ids)} prompt tokens)")
        print(f"  -> {tok.decode(out.token_ids)!r}")
        print(f"     {len(out.token_ids)} tokens, finish_reason={out.finish_reason}, "
              f"{len(out.token_ids) / dt:.1f} tokens/s")
    if total_time:
        print(f"reference loop (no KV cache): {total_tokens} tokens in {total_time:.1f} s, "
              f"{total_tokens / total_time:.1f} tokens/s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kolibri-trt", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    fx = sub.add_parser("make-fixtures", help="write the scaled-down default target + drafter")
    fx.add_argument("--out", type=Path, default=DEFAULT_DIR)
    fx.add_argument("--seed", type=int, default=0)
    fx.add_argument("--force", action="store_true", help="replace an existing folder")
    fx.set_defaults(func=_make_fixtures)

    rg = sub.add_parser("reference-generate", help="plain reference loop (no cache, no drafts)")
    rg.add_argument("--model", type=Path, required=True, help="Kolibri-1 checkpoint folder")
    src = rg.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompts-file", type=Path, help="Spec-Bench / HumanEval JSONL(.gz)")
    rg.add_argument("--per-category", type=int, default=None)
    rg.add_argument("--limit", type=int, default=None)
    rg.add_argument("--max-tokens", type=int, default=16)
    rg.add_argument("--temperature", type=float, default=0.0)
    rg.add_argument("--seed", type=int, default=0)
    rg.set_defaults(func=_reference_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"kolibri-trt {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
