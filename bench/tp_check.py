"""Tensor parallelism on GPUs: TP1 against TP2 (NCCL), greedy tokens and decode tokens/s.

    python bench/tp_check.py --engine engines/h100 --engine-tp2 engines/h100-tp2 \
        [--device cuda] [--max-tokens 64] [--streams 1 16] [--json out.json]

--engine is an unsharded build and --engine-tp2 the same checkpoints built with `--tp 2`
(`python build.py --target h100 --tp 2 --out engines/h100-tp2`). Both run the reference
modules (`model_impl="reference"`: the only path that runs sharded so far), so the comparison
is like for like. Printed: how many Spec-Bench prompts give the same greedy tokens under TP1
and TP2 (speculative copy+drafter; all-reduce summation order can flip a rounding, see
tests/test_tensor_parallel.py), and decode tokens/s of each at 1 and 16 streams
(speculative off; generated tokens after the first, over the time after the last first token).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kolibri_trt import LLM, SamplingParams
from kolibri_trt.prompts import load_prompts

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1].parent / "shared/data/prompts"


def decode_tokens_per_s(llm: LLM, prompts: list[str], streams: int, max_tokens: int) -> float:
    """Decode throughput with `streams` requests at once (prompts cycled to fill them)."""
    batch = [prompts[i % len(prompts)] for i in range(streams)]
    llm.generate(batch[:1], SamplingParams(max_tokens=2))            # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(batch, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    wall = time.perf_counter() - t0
    first = max(o.metrics.time_to_first_token_s for o in outs)
    return sum(len(o.token_ids) - 1 for o in outs) / max(wall - first, 1e-9)


def measure(engine: Path, tp: int, prompts: list[str], args) -> dict:
    """Greedy tokens (copy+drafter) and decode tokens/s per stream count for one engine."""
    opts = {"device": args.device, "tensor_parallel_size": tp, "model_impl": "reference",
            "max_num_seqs": max(args.streams)}
    with LLM(engine, speculative="copy+drafter", **opts) as llm:
        tokens = [o.token_ids for o in llm.generate(
            prompts, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))]
    with LLM(engine, speculative="off", **opts) as llm:
        rates = {s: decode_tokens_per_s(llm, prompts, s, args.max_tokens) for s in args.streams}
    return {"tp": tp, "token_ids": tokens, "decode_tokens_per_s": rates}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True, help="unsharded engine (TP1)")
    ap.add_argument("--engine-tp2", type=Path, required=True, help="the `--tp 2` build")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts-file", type=Path,
                    default=DEFAULT_PROMPTS / "spec_bench_question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    prompts = [p.text for p in load_prompts(args.prompts_file, per_category=args.per_category)]
    tp1 = measure(args.engine, 1, prompts, args)
    tp2 = measure(args.engine_tp2, 2, prompts, args)
    same = sum(a == b for a, b in zip(tp1["token_ids"], tp2["token_ids"]))
    print(f"greedy tokens: {same}/{len(prompts)} prompts identical under TP1 and TP2")
    for s in args.streams:
        print(f"decode tokens/s at {s:>2} streams: TP1 {tp1['decode_tokens_per_s'][s]:9.1f}   "
              f"TP2 {tp2['decode_tokens_per_s'][s]:9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"tp1": tp1, "tp2": tp2, "identical": same}, indent=1))


if __name__ == "__main__":
    main()
