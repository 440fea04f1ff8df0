#!/usr/bin/env python3
"""Tensor parallelism on GPUs: TP1 against TP2 (NCCL) on the kernel path, graphs and eager.

    python3 bench/tp_check.py --make-engines engines/tp-small        # here, on CPU: 2 engines
    python3 bench/tp_check.py --engines engines/tp-small --prompts-file P.jsonl --out DIR
    python3 bench/tp_check.py --engine engines/h100 --engine-tp2 engines/h100-tp2 --out DIR

--make-engines builds, from one random checkpoint of the scaled-down default shape with vocab
2000 (10 layers, hidden 256, 4 / 2 heads of 128, 8 experts; FP8 body, NVFP4 head, rotated-INT4
full-layer KV, a block drafter), an unsharded engine DIR/tp1 and the same engine sharded with
`--tp 2`, DIR/tp2 (~16 MB each), and copies the Spec-Bench prompts to DIR/prompts.jsonl.
It needs ModelOpt (this machine). The check needs only torch, triton, safetensors, tokenizers
(the repository need not be installed: it is put on sys.path, plugins/ imported by path).

Four configurations run one after the other, `model_impl="plugins"`: TP1 and TP2 (ranks on
cuda:0 and cuda:1, NCCL), each with CUDA graphs (the TP2 all-reduces captured in the graphs)
and with `enforce_eager=True`. Measured for each:
- greedy tokens (speculative copy+drafter) on the prompts: outputs identical to TP1-graphs',
  and the summed token prefix up to the first difference (TP2 is not bit-exact: the bf16
  partial sums round differently, tests/test_tensor_parallel.py); graphs against eager of the
  same TP must be identical (padded eager and graph replay give the same bits);
- teacher-forced top-1 agreement of TP2 with TP1 over prompt + TP1's continuation (scoring
  runs eagerly, so it is measured once per TP size), and mean |logit difference|;
- decode tokens/s at 1 and 16 streams (speculative off; each stream's prompt cut to
  --decode-context tokens; timed from the step after every stream has finished its prefill,
  after an identical warm-up run that captures the graphs).
Prints a table; writes DIR/tp_check.json. --device cpu: a dry run (gloo, torch references).
Exit status 1 when a configuration failed or graphs and eager disagree.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402

PROMPTS = ROOT.parent / "shared" / "data" / "prompts" / "spec_bench_question.jsonl"
CONFIGS = (("tp1-graphs", 1, False), ("tp1-eager", 1, True), ("tp2-eager", 2, True),
           ("tp2-graphs", 2, False))   # tp2-graphs: refused on CUDA unless --tp2-graphs
KV = "hadamard-int4"


def make_engines(out: Path) -> None:
    """DIR/tp1 and DIR/tp2 from one checkpoint (build.py's code), DIR/prompts.jsonl."""
    from kolibri_trt.fixtures import random_target, tiny_target_config
    from runtime_engines import VOCAB, write_engine
    model = random_target(tiny_target_config(vocab_size=VOCAB), seed=31)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for tp in (1, 2):
            built = write_engine(work, model, weights="fp8-nvfp4", kv_cache=KV, tp_size=tp)
            shutil.rmtree(out / f"tp{tp}", ignore_errors=True)
            shutil.move(str(built), str(out / f"tp{tp}"))
    if PROMPTS.is_file():
        shutil.copy(PROMPTS, out / "prompts.jsonl")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"built {out}/tp1, {out}/tp2 ({size / 2**20:.1f} MiB with the prompts)")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_tokens_per_s(llm: LLM, prompts: list[list[int]], streams: int, max_tokens: int,
                        device: str) -> float:
    """Tokens committed per second once all `streams` requests are decoding (prompts cycled)."""
    eng = llm.engine
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i in range(streams):
        eng.add_request(prompts[i % len(prompts)], params)
    sched = eng.scheduler
    while sched.waiting or any(s.num_pending != 1 for s in sched.running):
        eng.step()                               # prefills (and a few first tokens)
    _sync(device)
    t0, n = time.perf_counter(), 0
    while eng.has_unfinished():
        n += sum(len(s.new_token_ids) for s in eng.step())
    _sync(device)
    return n / (time.perf_counter() - t0)


def _llm(engine: Path, tp: int, eager: bool, speculative: str, args) -> LLM:
    return LLM(engine, speculative=speculative, device=args.device, tensor_parallel_size=tp,
               model_impl="plugins", enforce_eager=eager, max_num_seqs=max(args.streams),
               max_model_len=args.max_model_len,
               tp_cuda_graphs=args.tp2_graphs and tp > 1 and not eager)


def measure(engine: Path, tp: int, eager: bool, prompts, score_seqs, args) -> dict:
    """Greedy tokens (copy+drafter), teacher-forced logits of `score_seqs` (token id lists;
    "self": prompt + this run's tokens; None: no scoring) and decode tokens/s per stream count
    for one configuration."""
    out: dict = {"tp": tp, "enforce_eager": eager,
                 "cuda_graphs": args.device.startswith("cuda") and not eager}
    t0 = time.perf_counter()
    with _llm(engine, tp, eager, "copy+drafter", args) as llm:
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        out["token_ids"] = [o.token_ids for o in llm.generate(prompts, params)]
        out["spec_proposed"] = dict(llm.engine.stats.proposed)
        out["spec_accepted"] = dict(llm.engine.stats.accepted)
        if score_seqs == "self":
            score_seqs = [p + t for p, t in zip(prompts, out["token_ids"])]
        if score_seqs is not None:
            out["scores"] = [llm.engine.score(s).cpu() for s in score_seqs]
    decode = [p[:args.decode_context] for p in prompts]
    with _llm(engine, tp, eager, "off", args) as llm:
        rates = {}
        for s in args.streams:
            decode_tokens_per_s(llm, decode, s, args.decode_tokens, args.device)   # warm-up
            rates[s] = decode_tokens_per_s(llm, decode, s, args.decode_tokens, args.device)
    out["decode_tokens_per_s"] = rates
    out["seconds"] = time.perf_counter() - t0
    return out


def _prefix(a: list[list[int]], b: list[list[int]]) -> float:
    same = total = 0
    for x, y in zip(a, b):
        same += next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
        total += len(x)
    return same / max(total, 1)


def compare(results: dict) -> dict:
    """Per configuration: identical outputs and token prefix against tp1-graphs (and against
    the other mode of the same TP), top-1 and mean |dlogit| of its scores against TP1's."""
    ref = results.get("tp1-graphs")
    rows = {}
    for name, r in results.items():
        if "error" in r or ref is None or "error" in ref:
            rows[name] = {"error": r.get("error", "tp1-graphs failed")}
            continue
        twin = results.get(name.replace("graphs", "eager") if "graphs" in name
                           else name.replace("eager", "graphs"), {})
        row = {"identical": sum(a == b for a, b in zip(r["token_ids"], ref["token_ids"])),
               "prompts": len(ref["token_ids"]),
               "token_prefix": _prefix(ref["token_ids"], r["token_ids"]),
               "graphs_eq_eager": ("token_ids" in twin
                                   and twin["token_ids"] == r["token_ids"]),
               "decode_tokens_per_s": r["decode_tokens_per_s"]}
        if "scores" in r:
            a, b = torch.cat(ref["scores"]), torch.cat(r["scores"])
            row["top1"] = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
            row["mean_abs_dlogit"] = (a - b).abs().mean().item()
            row["scored_rows"] = int(a.shape[0])
        rows[name] = row
    return rows


def print_table(rows: dict, streams: list[int]) -> None:
    head = f"{'config':<12}{'identical':>10}{'prefix':>8}{'top-1':>8}{'|dlogit|':>10}" + \
        "".join(f"{f'tok/s@{s}':>12}" for s in streams) + "  graphs==eager"
    print(head)
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<12}  FAILED: {r['error'].strip().splitlines()[-1]}")
            continue
        top1 = f"{r['top1']:.4f}" if "top1" in r else "-"
        dl = f"{r['mean_abs_dlogit']:.2e}" if "mean_abs_dlogit" in r else "-"
        rates = "".join(f"{r['decode_tokens_per_s'][s]:>12.1f}" for s in streams)
        print(f"{name:<12}{r['identical']:>5}/{r['prompts']:<4}{r['token_prefix']:>8.3f}"
              f"{top1:>8}{dl:>10}{rates}  {r['graphs_eq_eager']}")


def _write(args, rows: dict, results: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": args.device, "torch": torch.__version__,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "args": {k: str(v) for k, v in vars(args).items()}}
    saved = {n: {k: v for k, v in r.items() if k != "scores"} for n, r in results.items()}
    (args.out / "tp_check.json").write_text(json.dumps(
        {"meta": meta, "comparison": rows, "results": saved}, indent=1))


def run_all(args) -> int:
    prompts_src = load_prompts(args.prompts_file, per_category=args.per_category,
                               limit=args.limit)
    from kolibri_trt.tokenizer import KolibriTokenizer
    engines = {1: args.engine or args.engines / "tp1", 2: args.engine_tp2 or args.engines / "tp2"}
    tok = KolibriTokenizer.from_pretrained(engines[1] / "target")
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}])
               for p in prompts_src]
    results: dict = {}
    for name, tp, eager in CONFIGS:
        print(f"== {name}", flush=True)
        ref = results.get("tp1-graphs", {}).get("token_ids")
        score = ("self" if name == "tp1-graphs" else None if eager or ref is None
                 else [p + t for p, t in zip(prompts, ref)])
        try:
            results[name] = measure(engines[tp], tp, eager, prompts, score, args)
        except Exception:                       # noqa: BLE001 - recorded, the others still run
            results[name] = {"error": traceback.format_exc()}
            print(results[name]["error"], flush=True)
        rows = compare(results)
        _write(args, rows, results)             # after each configuration (a run cut short)
    print(f"{len(prompts)} prompts, {args.max_tokens} greedy tokens each (copy+drafter); "
          f"decode: {args.decode_tokens} tokens after a {args.decode_context}-token context")
    print_table(rows, args.streams)
    print(f"wrote {args.out / 'tp_check.json'}")
    bad = [n for n, r in rows.items() if "error" in r or not r["graphs_eq_eager"]]
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--make-engines", type=Path, help="build DIR/tp1, DIR/tp2 and stop")
    ap.add_argument("--engines", type=Path, help="folder with tp1/ and tp2/ (--make-engines)")
    ap.add_argument("--engine", type=Path, help="the unsharded engine (instead of DIR/tp1)")
    ap.add_argument("--engine-tp2", type=Path, help="its `--tp 2` build (instead of DIR/tp2)")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--device", default="cuda", help="cuda (ranks on cuda:0, cuda:1) | cpu")
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    ap.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--decode-context", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--tp2-graphs", action="store_true",
                    help="try TP2 with CUDA graphs (EngineArgs.tp_cuda_graphs, experimental); "
                    "run it under `timeout`: a hang is what it tests for")
    args = ap.parse_args()
    if args.make_engines:
        make_engines(args.make_engines)
        return 0
    if args.engines is None and (args.engine is None or args.engine_tp2 is None):
        ap.error("--engines DIR, or --engine and --engine-tp2, is required")
    if args.device.startswith("cuda") and torch.cuda.device_count() < 2:
        ap.error(f"--device {args.device}: TP2 needs 2 CUDA devices, torch sees "
                 f"{torch.cuda.device_count()}")
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
