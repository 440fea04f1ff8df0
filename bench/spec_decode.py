"""Speculative decoding benchmark: tokens/s, acceptance length and per-position acceptance for
speculative = off / copy / drafter / copy+drafter at 1 and 4 streams, on Spec-Bench prompts,
and the number of requests whose tokens differ from speculative="off" (must be 0).

    python bench/spec_decode.py --engine engines/gb10 [--streams 1 4] [--max-tokens 64]
        [--per-category 1] [--temperature 0] [--json out.json] [--device cuda]

Streams: prompts are served `streams` at a time (max_num_seqs = streams); tokens/s counts
generated tokens over wall time for the whole set. Numbers are what this machine measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import standalone  # noqa: F401  (plain checkouts: plugins/ as kolibri_trt_plugins)

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.prompts import load_prompts
from kolibri_trt.spec.metrics import SOURCES, SpecMetrics

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1].parent / "shared/data/prompts"


def run(engine: Path, mode: str, streams: int, prompts: list, params: SamplingParams,
        **llm_options) -> dict:
    """One (mode, streams) run over `prompts`; llm_options go to `LLM` (device, ...)."""
    llm = LLM(engine, speculative=mode, max_num_seqs=streams, **llm_options)
    ids = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p.text}])
           for p in prompts]
    # warm-up: on a GPU the timed generate itself once, so that Triton compiles every shape
    # its steps meet before the timing. A warm-up of 2 tokens per prompt batched the prefills
    # otherwise and left kernels to compile inside the timed run: 2.1 s in one step, 128
    # against 1,950 tokens/s at 8 streams (bench/runtime_stalls.py,
    # bench/results/h200-2026-12-02c/rs/). On CPU one prompt, 2 tokens.
    if str(llm_options.get("device", "cpu")) == "cpu":
        llm.generate(ids[:1], SamplingParams(max_tokens=2))
    else:
        llm.generate(ids, params)
    llm.engine.stats = SpecMetrics()
    t0 = time.perf_counter()
    outs = llm.generate(ids, params)
    dt = time.perf_counter() - t0
    n = sum(len(o.token_ids) for o in outs)
    by_cat: dict[str, SpecMetrics] = {}
    for p, o in zip(prompts, outs):
        by_cat.setdefault(p.category, SpecMetrics()).merge(o.metrics.spec)
    s = llm.engine.stats
    return {"mode": mode, "streams": streams, "tokens": n, "seconds": dt, "tokens_per_s": n / dt,
            "tau": s.acceptance_length, "per_position": s.acceptance_rate_per_position,
            "accepted": dict(s.accepted), "proposed": dict(s.proposed),
            "tau_by_category": {c: m.acceptance_length for c, m in by_cat.items()},
            "token_ids": [o.token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--prompts-file", type=Path,
                    default=DEFAULT_PROMPTS / "spec_bench_question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--modes", nargs="+", default=["off", "copy", "drafter", "copy+drafter"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cpu", help="cpu | cuda[:N]")
    ap.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs")
    args = ap.parse_args()
    prompts = load_prompts(args.prompts_file, per_category=args.per_category, limit=args.limit)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed, ignore_eos=True)
    opts = {"device": args.device, "enforce_eager": args.enforce_eager}
    rows = [run(args.engine, m, s, prompts, params, **opts)
            for s in args.streams for m in args.modes]
    print(f"{len(prompts)} prompts ({', '.join(sorted({p.category for p in prompts}))}), "
          f"{args.max_tokens} tokens each, temperature {args.temperature}")
    print(f"{'mode':<14}{'streams':>8}{'tok/s':>9}{'tau':>7}  {'mismatch':>8}  "
          f"accepted/proposed ({', '.join(SOURCES)}); acceptance by position 1..")
    for r in rows:
        off = next(x for x in rows if x["mode"] == "off" and x["streams"] == r["streams"])
        bad = sum(a != b for a, b in zip(r["token_ids"], off["token_ids"]))
        acc = " ".join(f"{r['accepted'][s]}/{r['proposed'][s]}" for s in SOURCES)
        pos = " ".join(f"{x:.2f}" for x in r["per_position"][:8])
        tau = f"{r['tau']:.2f}" if r["tau"] else "-"
        print(f"{r['mode']:<14}{r['streams']:>8}{r['tokens_per_s']:>9.1f}{tau:>7}  {bad:>8}  "
              f"{acc}; {pos}")
        r["mismatches_vs_off"] = bad
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "token_ids"}
                                         for r in rows], indent=2))


if __name__ == "__main__":
    main()
