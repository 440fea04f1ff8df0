#!/usr/bin/env python3
"""Acceptance of the block drafter on prompts no checkpoint trained on, through a built engine:

    python tools/eval_acceptance.py --engine engines/mini [--per-category 2] [--skip 0] [--humaneval 2]
        [--max-tokens 96] [--temperatures 0 0.8] [--template raw|chat] [--device cpu] [--drafter-depth N]
        [--drafter-attention dense|sdpa|kernel] [--sampler fused|torch]
        [--drafter-gate always|adaptive] [--drafts-on-device auto|on|off]
        [--drafter-chain auto|on|off] [--draft-sampling coupled|greedy]
        [--drafter-stream own|current] [--repeats R] [--streams N]
        [--isolated K [--isolated-modes copy copy+drafter]]
        [--prompts-dir DIR] [--json out.json]

Prompts: Spec-Bench's translation (German), mt_bench (chat), rag and summarization
categories and HumanEval (`shared/data/prompts`), one stream at a time (--streams N: a
category's prompts N at a time, as a server batches them).
1. End to end with `kolibri_trt.LLM`, for speculative = off, copy, drafter, copy+drafter,
   greedy and sampled: decode tokens/s per category (after the first token; the JSON also
   has tokens/s over the whole wall time; medians of --repeats runs; with --streams N > 1
   the table shows tokens/s over the wall time of the category's batch), tau (tokens per target
   pass), per-position acceptance, by source the target passes, copy drafts accepted /
   proposed and drafter rounds with their drafts accepted per round (copy+drafter: the
   drafter's acceptance where copy drafting missed), and the number of requests whose
   tokens differ from "off" (must be 0).
2. On the target's own output of step 1 (greedy, and sampled with the same seed), the
   seed's acceptance figures: for every anchor of the generated part, one drafter pass (the
   engine's target taps and drafter weights, dequantized, predecessor = the drafter's own
   previous draft as served) is compared with the tokens the target produced: accepted
   tokens per round of 3 and of 4 drafts (the leading matches, capped) and position 1-4
   agreement (each row's draft equals the target's token, whatever the rows before did).
3. With --isolated K: the decode speeds again with one engine per process (a server's case),
   K rounds, each later mode also relative to the first mode's process of the same round
   (`eval_isolated.py`: the machine's host speed differs from process to process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import gpu_env  # noqa: E402,F401
import eval_isolated  # noqa: E402
import fast_drafter  # noqa: E402

from kolibri_trt import LLM, SamplingParams, sampling  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402
from kolibri_trt.runtime.engine_args import DRAFTS_ON_DEVICE  # noqa: E402
from kolibri_trt.spec import plugin_drafter_proposer  # noqa: E402
from kolibri_trt.spec.metrics import SpecMetrics  # noqa: E402

PROMPTS = ROOT.parent / "shared" / "data" / "prompts"
CATEGORIES = ("translation", "mt_bench", "rag", "summarization")
MODES = ("off", "copy", "drafter", "copy+drafter")
ROUNDS = (3, 4)
SAMPLED_SEED = 1


def load_eval_prompts(args) -> list:
    """--per-category prompts of each category after its first --skip (file order), then
    --humaneval HumanEval prompts."""
    out = load_prompts(args.prompts_dir / "spec_bench_question.jsonl",
                       per_category=args.skip + args.per_category,
                       categories=tuple(args.categories))
    seen: dict[str, int] = {}
    kept = []
    for p in out:
        seen[p.category] = seen.get(p.category, 0) + 1
        if seen[p.category] > args.skip:
            kept.append(p)
    out = kept
    if args.humaneval:
        out += load_prompts(args.prompts_dir / "human_eval.jsonl.gz", limit=args.humaneval)
    return out


def prompt_ids(llm, prompt, template: str) -> list[int]:
    if template == "chat":
        return llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
    return llm.tokenizer.encode(prompt.text, add_bos=True)


def run_modes(args, modes, prompts, temps) -> dict:
    """Generate every prompt (one stream) per temperature and mode; timings and metrics per
    mode, temperature and category. The modes take turns (one engine each, all loaded first)
    prompt by prompt, starting with a different mode each time (rotated order): the host's
    speed on the H200 machine drifts by up to 2x within a call (the same pure-Python step
    setup measured 0.039 and 0.089 ms, bench/results/h200-2026-11-30e/), so every mode must
    see every phase alike. A repeat of a category is every prompt once per mode."""
    llms = {m: LLM(args.engine, speculative=m, max_num_seqs=args.streams,
                   max_model_len=args.max_model_len, device=args.device,
                   drafter_depth=args.drafter_depth, drafter_attention=args.drafter_attention,
                   drafter_gate=args.drafter_gate, cpu_affinity=args.cpu_affinity,
                   draft_sampling=args.draft_sampling,
                   drafts_on_device=DRAFTS_ON_DEVICE[args.drafts_on_device],
                   drafter_chain=DRAFTS_ON_DEVICE[args.drafter_chain])
            for m in modes}
    first = next(iter(llms.values()))
    out: dict = {m: {} for m in modes}
    for temp in temps:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=temp,
                                seed=SAMPLED_SEED, ignore_eos=True)
        warm = prompts[:1] if args.device == "cpu" else prompts   # GPU: compile every shape
        for llm in llms.values():
            llm.generate([prompt_ids(llm, p, args.template) for p in warm],
                         SamplingParams(max_tokens=2))
        for m in modes:
            out[m][temp] = {}
        turn = 0
        for cat in dict.fromkeys(p.category for p in prompts):
            ids = [prompt_ids(first, p, args.template) for p in prompts if p.category == cat]
            runs: dict = {m: [[] for _ in range(args.repeats)] for m in modes}
            batches = [[one] for one in ids] if args.streams == 1 else [ids]
            for r in range(args.repeats):
                for batch in batches:
                    order = modes[turn % len(modes):] + modes[:turn % len(modes)]
                    turn += 1
                    for m in order:
                        runs[m][r].append(timed_run(llms[m], batch, params))
            for m in modes:
                out[m][temp][cat] = summarize_runs([merge_runs(x) for x in runs[m]], ids)
    return out


def timed_run(llm, ids: list[list[int]], params) -> tuple:
    """Generate prompts once (the LLM's max_num_seqs at a time): (outputs, tokens, wall
    seconds, decode tokens, decode seconds from `RequestMetrics`; 0 when the prompts ran
    together: their decode times overlap)."""
    t0 = time.perf_counter()
    res = llm.generate(ids, params)
    dt = time.perf_counter() - t0
    dec_n = sum(r.metrics.num_generated_tokens - 1 for r in res)
    dec_t = 0.0 if len(ids) > 1 and llm.engine.args.max_num_seqs > 1 else sum(
        r.metrics.total_time_s - r.metrics.time_to_first_token_s for r in res)
    return res, sum(len(r.token_ids) for r in res), dt, dec_n, dec_t


def merge_runs(parts: list[tuple]) -> tuple:
    """`timed_run`s of single prompts (one repeat of a category) -> (outputs in prompt order,
    tokens/s over the summed wall time, decode tokens/s over the summed decode time or None)."""
    res = [r for part in parts for r in part[0]]
    tokens, wall, dec_n, dec_t = (sum(p[i] for p in parts) for i in range(1, 5))
    return res, tokens / wall, dec_n / dec_t if dec_t > 0 else None


def summarize_runs(runs: list[tuple], ids: list[list[int]]) -> dict:
    """Runs (`merge_runs`) of one mode and category: the speeds are the medians over the runs,
    the tokens and metrics those of the first run (every run gives the same tokens: greedy, or
    keyed sampling)."""
    res = runs[0][0]
    m = SpecMetrics()
    for r in res:
        m.merge(r.metrics.spec)
    decode = [d for _, _, d in runs if d is not None]
    return {"tokens_per_s": statistics.median(t for _, t, _ in runs),
            "decode_tokens_per_s": statistics.median(decode) if decode else None,
            "decode_tokens_per_s_runs": decode,
            "tau": m.acceptance_length,
            "per_position": [round(x, 3) for x in m.acceptance_rate_per_position],
            "target_passes": m.target_passes,
            "drafter_rounds": m.proposed["drafter_row0"],
            "accepted": dict(m.accepted), "proposed": dict(m.proposed),
            "prompt_ids": ids, "token_ids": [r.token_ids for r in res]}


@torch.no_grad()
def teacher_forced(target, drafter, prompt: list[int], output: list[int],
                   keyed: tuple[float, int] | None = None) -> list[list[bool]]:
    """Per anchor of the generated part: [row j's draft == the target's token] for the rows
    whose token exists. prompt/output: token ids; keyed: (temperature, seed) of a sampled
    output whose drafts the engine picks coupled (draft_sampling "coupled"), else None."""
    seq = torch.tensor(prompt + output, dtype=torch.long)
    _, taps = target(seq[None], tap_layers=drafter.config.target_layer_ids)
    n, first = len(seq), len(prompt) - 1
    x = fast_drafter.block_states(drafter, taps.float(), torch.cat([seq[1:], seq[-1:]])[None])
    keys = None if keyed is None else (keyed[0], sampling.seed_key(keyed[1]), len(prompt) - 2)
    _, drafts = fast_drafter.block_logits(drafter, x, None, keys)
    rows = []
    for p in range(first, n - 2):
        rows.append([bool(drafts[0, p, j] == seq[p + 2 + j])
                     for j in range(drafter.config.block_size) if p + 2 + j < n])
    return rows


def acceptance(rows: list[list[bool]], block: int) -> dict:
    """Accepted per round of k drafts (leading matches capped at k, anchors with k tokens
    ahead) and per-position agreement."""
    out = {}
    for k in ROUNDS:
        full = [r for r in rows if len(r) >= k]
        lead = [next((i for i, ok in enumerate(r[:k]) if not ok), k) for r in full]
        out[f"accepted_per_round_{k}"] = round(sum(lead) / len(lead), 3) if lead else None
    out["agreement"] = [round(sum(r[j] for r in rows if len(r) > j)
                              / max(1, sum(len(r) > j for r in rows)), 3) for j in range(block)]
    return out


def offline_acceptance(args, results) -> dict:
    """Step 2 on the engine's dequantized fp32 models, per temperature and category."""
    from kolibri_trt.runtime.engine_loader import Manifest, load_drafter, load_target
    manifest = Manifest.read(args.engine)
    target, _, _ = load_target(args.engine, manifest, "cpu")
    target = target.float()
    drafter = load_drafter(args.engine, manifest, target, "cpu").float()
    drafter.head_slice = drafter.head_slice.float()
    out = {}
    for temp, cats in results["off"].items():
        for cat, r in cats.items():
            keyed = (float(temp), SAMPLED_SEED) if float(temp) > 0 \
                and args.draft_sampling == "coupled" else None
            rows = [x for p, o in zip(r["prompt_ids"], r["token_ids"])
                    for x in teacher_forced(target, drafter, p, o, keyed)]
            out.setdefault(str(temp), {})[cat] = acceptance(rows, drafter.config.block_size)
    return out


def report(results, offline, streams: int = 1) -> None:
    """The tables of the module docstring; streams > 1: tokens/s over the batches' wall
    time instead of decode tokens/s."""
    speed, label = ("decode_tokens_per_s", "decode tok/s (tau)") if streams == 1 else \
        ("tokens_per_s", f"tok/s over the wall time, {streams} streams (tau)")
    for temp, cats in offline.items():
        print(f"\n== temperature {temp}: drafter acceptance on the target's own output")
        print(f"{'category':<15}{'round 3':>9}{'round 4':>9}   position 1/2/3/4 agreement")
        for cat, a in cats.items():
            print(f"{cat:<15}{a['accepted_per_round_3']!s:>9}{a['accepted_per_round_4']!s:>9}"
                  f"   {' / '.join(f'{x:.3f}' for x in a['agreement'])}")
        print(f"{'category':<15}" + "".join(f"{m:>14}" for m in MODES) + "   " + label)
        for cat in cats:
            cells = []
            for m in MODES:
                r = results[m][float(temp)][cat]
                tau = f"{r['tau']:.2f}" if r["tau"] else "-"
                cells.append(f"{r[speed] or 0:7.1f} ({tau})")
            print(f"{cat:<15}" + "".join(f"{c:>14}" for c in cells))
        print("by source (first run): target passes; copy accepted/proposed; drafter rounds, "
              "drafts accepted per round")
        for cat in cats:
            cells = []
            for m in MODES[1:]:
                r = results[m][float(temp)][cat]
                acc_d = r["accepted"]["drafter_row0"] + r["accepted"]["drafter_rows1+"]
                per = f"{acc_d / r['drafter_rounds']:.2f}" if r["drafter_rounds"] else "-"
                cells.append(f"{m} {r['target_passes']}; {r['accepted']['copy']}/"
                             f"{r['proposed']['copy']}; {r['drafter_rounds']}, {per}")
            print(f"{cat:<15}" + " | ".join(cells))


def parser() -> argparse.ArgumentParser:
    """The command line of this script."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES),
                    help="the Spec-Bench categories to run (default: all four)")
    ap.add_argument("--skip", type=int, default=0, metavar="N",
                    help="leave out the first N prompts of each category (held-out prompts: "
                         "the earlier runs chose settings on the first ones)")
    ap.add_argument("--humaneval", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--template", choices=("raw", "chat"), default="raw")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--drafter-attention", default="kernel", choices=["dense", "sdpa", "kernel"],
                    help="the drafter's ring attention on the kernel path (EngineArgs)")
    ap.add_argument("--cpu-affinity", default=None, metavar="CPUS",
                    help="EngineArgs.cpu_affinity: gpu-local or a CPU list (default: as it is)")
    ap.add_argument("--drafter-gate", default="always", choices=["always", "adaptive"],
                    help="when a copy miss gets a drafter round (EngineArgs.drafter_gate)")
    ap.add_argument("--draft-sampling", default="coupled", choices=["coupled", "greedy"],
                    help="how the drafter picks a sampled stream's drafts "
                         "(EngineArgs.draft_sampling); also the offline acceptance's picks")
    ap.add_argument("--drafts-on-device", default="auto",
                    choices=list(DRAFTS_ON_DEVICE),
                    help="leave the drafter's drafts on the device until verification "
                         "(EngineArgs.drafts_on_device; auto: on with overlapped rounds)")
    ap.add_argument("--drafter-chain", default="auto", choices=list(DRAFTS_ON_DEVICE),
                    help="enqueue the next drafter round while a step is verified "
                         "(EngineArgs.drafter_chain; auto: on with drafts on the device)")
    ap.add_argument("--drafter-stream", choices=("own", "current"), default="current",
                    help="drafter rounds on a CUDA stream of their own or on the current one "
                         "(spec/plugin_drafter_proposer.py, OWN_STREAM)")
    ap.add_argument("--sampler", choices=("fused", "torch"), default="fused",
                    help="sampled rows through the fused kernel (kolibri_trt.sampling."
                         "FUSED_SAMPLER, the default) or the torch ops")
    ap.add_argument("--drafter-depth", type=int, default=None,
                    help="drafter passes per round (default: the drafter's serving_defaults)")
    ap.add_argument("--prompts-dir", type=Path, default=PROMPTS,
                    help="folder with spec_bench_question.jsonl and human_eval.jsonl.gz")
    ap.add_argument("--repeats", type=int, default=1,
                    help="time each category this many times; report the median speed")
    ap.add_argument("--streams", type=int, default=1, metavar="N",
                    help="serve a category's prompts N at a time (max_num_seqs = N); N > 1 "
                         "reports tokens/s over each batch's wall time")
    ap.add_argument("--isolated", type=int, default=0, metavar="K",
                    help="also time --isolated-modes with one engine per process, K rounds")
    ap.add_argument("--isolated-modes", nargs="+", choices=MODES,
                    default=["copy", "copy+drafter"])
    ap.add_argument("--one-mode", choices=MODES,
                    help="(internal, --isolated) time this mode alone; --json gets its speeds")
    ap.add_argument("--json", type=Path)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.skip < 0:
        ap.error(f"--skip: must be >= 0, got {args.skip}")
    if args.repeats < 1:
        ap.error(f"--repeats: must be >= 1, got {args.repeats}")
    if args.isolated < 0:
        ap.error(f"--isolated: must be >= 0, got {args.isolated}")
    if args.streams < 1:
        ap.error(f"--streams: must be >= 1, got {args.streams}")
    if args.streams > 1 and args.isolated:
        ap.error("--isolated: times one stream at a time (leave --streams at 1)")
    if args.one_mode and not args.json:
        ap.error("--one-mode needs --json")
    sampling.FUSED_SAMPLER = args.sampler == "fused"
    plugin_drafter_proposer.OWN_STREAM = args.drafter_stream == "own"
    prompts = load_eval_prompts(args)
    if args.one_mode:
        one = run_modes(args, (args.one_mode,), prompts, args.temperatures)[args.one_mode]
        args.json.write_text(json.dumps(eval_isolated.speeds(one)))
        return 0
    results = run_modes(args, MODES, prompts, args.temperatures)
    for m in MODES:
        for temp, cats in results[m].items():
            for cat, r in cats.items():
                off = results["off"][temp][cat]["token_ids"]
                r["mismatches_vs_off"] = sum(a != b for a, b in zip(r["token_ids"], off))
    offline = offline_acceptance(args, results)
    report(results, offline, args.streams)
    bad = sum(r["mismatches_vs_off"] for m in MODES for c in results[m].values()
              for r in c.values())
    print(f"\nrequests that differ from speculative='off': {bad} (must be 0)")
    isolated = None
    if args.isolated:
        isolated = eval_isolated.run(args, args.isolated_modes, args.isolated)
        eval_isolated.report(isolated)
    if args.json:
        slim = {m: {str(t): {c: {k: v for k, v in r.items() if k not in ("prompt_ids",
                                                                         "token_ids")}
                             for c, r in cats.items()} for t, cats in res.items()}
                for m, res in results.items()}
        args.json.write_text(json.dumps({"end_to_end": slim, "acceptance": offline,
                                         "isolated": isolated}, indent=1))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
