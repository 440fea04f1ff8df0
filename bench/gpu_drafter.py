#!/usr/bin/env python3
"""H200 check and timing of the drafter's kernel path (DrafterPlugin + DrafterRunner + CUDA
graphs, `spec/plugin_drafter_proposer.py`), in one call.

    python3 bench/gpu_runtime.py --make-engines engines/gpu-small   # here: the same engines
    python3 bench/gpu_drafter.py --engines engines/gpu-small --out DIR   # on the GPU machine
    python3 bench/gpu_drafter.py --engine engines/mini-h200 --only parity graphs round  # or one

Uses `engine-fp8-nvfp4-fp8` of that folder (the small target with `runtime_engines.small_drafter`:
block-FP8 body, NVFP4 head, context window 32). Checks (exit 1 if one fails):
- drafts on the GPU (graphs) == the CPU reference drafter (`DrafterProposer`, weights
  dequantized to fp32) over rounds of random taps, several streams, contexts longer than the
  window, depth 2: drafts may differ only at near ties (reference gap <= TIE_TOL), logits
  within LOGIT_TOL on rows up to a stream's first difference; per attention impl;
- a round's CUDA graph replayed twice == the same round eager, bit for bit; the whole drive
  with graphs == without graphs, bit for bit;
- speculative "drafter" / "copy+drafter" with the new proposer give the tokens of "off".
Timings: tokens/s of off, drafter and copy+drafter with the old proposer (reference modules)
and the new one, at 1 and 8 streams; the round time of a release-shape drafter (H 2560, 20
heads, context window 2048, draft vocab 60614; random weights quantized here) per (streams,
ring rows) bucket, graphs vs eager, per attention impl (dense, sdpa, kernel: the
ring_attention plugin); one full `propose_batch` round
at the mini engine's drafter shape (checkpoints/kolibri-mini, random weights) with 1 and 8
streams: wall ms, CUDA-event ms of the round, the device time of its graphs replayed back to
back (wall - that = the host's share), `observe` ms per step, and the drafts readback (pinned
copy + event vs `.tolist()`). Results: DIR/gpu_drafter.json. The two timing steps (release,
round) and the shared DEVICE / RESULTS are in gpu_drafter_timing.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402  (repository on sys.path; plugins/ by path)
from drafter_rounds import compare, drive  # noqa: E402
from gpu_drafter_timing import DEVICE, RESULTS, mini_round_timing, release_shape_timing  # noqa: E402

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from kolibri_trt.drafter import DrafterTarget  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402
from kolibri_trt.runtime.engine_loader import Manifest, load_drafter, load_target  # noqa: E402
from kolibri_trt.runtime.plugin_loader import load_plugin_drafter  # noqa: E402
from kolibri_trt.spec.drafter_proposer import DrafterProposer  # noqa: E402
from kolibri_trt.spec.metrics import SpecMetrics  # noqa: E402
from kolibri_trt.spec.plugin_drafter_proposer import (  # noqa: E402
    PluginDrafterProposer,
    install_plugin_drafter,
)

PROMPTS = ROOT.parent / "shared" / "data" / "prompts"
LOGIT_TOL = 0.2     # as tests/test_plugin_drafter.py (CPU: 0.06-0.08 measured)
TIE_TOL = 0.2
MIN_AGREEMENT = 0.85
LENGTHS = (1, 5, 31, 33, 80)   # around and beyond context_window 32


def check(name: str, ok: bool, detail: str = "") -> None:
    standalone.record(RESULTS, name, ok, detail)


def _targets(engine: Path):
    m = Manifest.read(engine)
    cpu_target, _, _ = load_target(engine, m, "cpu")
    t = DrafterTarget.of(cpu_target)
    dev = DrafterTarget(t.embed_tokens.to(DEVICE[0]), t.lm_head, t.num_hidden_layers)
    return m, cpu_target, dev


def check_parity(engine: Path, attn: str) -> None:
    """CPU reference drafter vs the GPU path through graphs, random-taps rounds."""
    m, cpu_target, dev_target = _targets(engine)
    ref = DrafterProposer(load_drafter(engine, m, cpu_target, "cpu"), 2)
    new = PluginDrafterProposer(load_plugin_drafter(engine, m, dev_target, DEVICE[0], attn=attn),
                                2, 8, use_graphs=DEVICE[0] != "cpu")
    equal = total = 0
    worst = gap = 0.0
    for seed in range(3):
        ref.streams.clear()
        for rid in list(new.streams):
            new.reset(rid)
        for rnd in drive(ref, new, rounds=6, seed=seed, lengths=LENGTHS):
            e, t, w, g = compare(*rnd, ref.drafter.draft_vocab)
            equal, total, worst, gap = equal + e, total + t, max(worst, w), max(gap, g)
    RESULTS["parity"][attn] = {"equal": equal, "total": total, "max_logit_diff": worst,
                               "max_gap_at_difference": gap}
    check(f"{attn}: drafts GPU == CPU reference up to near ties",
          worst <= LOGIT_TOL and gap <= TIE_TOL and equal >= MIN_AGREEMENT * total,
          f"{equal}/{total} equal, max |logit diff| {worst:.3g}, largest reference gap at a "
          f"difference {gap:.3g}")


def check_graphs(engine: Path, attn: str) -> None:
    """A round replayed twice == eager (bits); the drive with graphs == without (bits)."""
    m, _, dev_target = _targets(engine)
    model = load_plugin_drafter(engine, m, dev_target, DEVICE[0], attn=attn)
    use = DEVICE[0] != "cpu"
    runs = []
    for graphs in (use, False):
        prop = PluginDrafterProposer(model, 2, 8, use_graphs=graphs)
        rounds = []
        for i, (_, _, d, lg) in enumerate(drive(None, prop, rounds=6, seed=7, lengths=LENGTHS)):
            rounds.append((d.clone(), lg.clone()))
            if graphs and i == 2:
                runner = prop.runner
                key = runner.last_graph     # ("round", S_b, L, logits) or ("step", N_b, ...)
                s = d.shape[0]
                graph, (gd, gl) = runner.graphs[key]
                graph.replay()
                again = (gd[:s].clone(), gl[:s].clone())
                eager = runner._both_steps if key[0] == "step" else runner._round_step
                ed, el = eager(*key[1:])
                check(f"{attn}: round graph replayed twice == first replay, same bits",
                      torch.equal(again[0], d) and torch.equal(again[1], lg))
                check(f"{attn}: round graph == the same padded round eager, same bits",
                      torch.equal(ed[:s], d) and torch.equal(el[:s], lg),
                      f"max |diff| {(el[:s] - lg).abs().max().item():.3g}")
        runs.append(rounds)
        if graphs:
            check(f"{attn}: graphs captured", len(prop.runner.graphs) > 0,
                  f"{len(prop.runner.graphs)} graphs: {sorted(prop.runner.graphs)}")
    same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(*runs))
    check(f"{attn}: drive with CUDA graphs == eager, same bits",
          same and len(runs[0]) == len(runs[1]))


def _run(engine: Path, mode: str, streams: int, ids: list, params, new: bool, attn: str,
         eager: bool = False) -> dict:
    llm = LLM(engine, speculative=mode, max_num_seqs=streams, device=DEVICE[0],
              model_impl="plugins", enforce_eager=eager)
    capture = 0.0
    if new and "drafter" in mode:
        t0 = time.perf_counter()
        install_plugin_drafter(llm.engine, attn=attn)
        capture = time.perf_counter() - t0
    elif "drafter" in mode and isinstance(llm.engine.speculator.drafter, PluginDrafterProposer):
        _install_reference_drafter(llm.engine)   # engine.py already builds the new one
    llm.generate(ids[:1], SamplingParams(max_tokens=2))           # warm-up
    llm.engine.stats = SpecMetrics()
    t0 = time.perf_counter()
    outs = llm.generate(ids, params)
    dt = time.perf_counter() - t0
    n = sum(len(o.token_ids) for o in outs)
    s = llm.engine.stats
    return {"mode": mode, "proposer": ("new-" + attn) if new else "old", "streams": streams,
            "eager": eager, "tokens": n, "seconds": dt, "tokens_per_s": n / dt,
            "tau": s.acceptance_length, "proposed": dict(s.proposed),
            "accepted": dict(s.accepted), "install_and_capture_s": capture,
            "token_ids": [o.token_ids for o in outs]}


def _install_reference_drafter(engine) -> None:
    """The old proposer (reference modules) in an engine that built the new one."""
    spec, cfg = engine.speculator, engine.config
    target = DrafterTarget(spec.drafter.drafter.embed_tokens,
                           torch.empty(cfg.vocab_size, 0, device="meta"), cfg.num_hidden_layers)
    drafter = load_drafter(engine.manifest.path.parent, engine.manifest, target, engine.device)
    spec.drafter = DrafterProposer(drafter, spec.drafter.depth)


def lossless_and_speed(engine: Path, prompts, max_tokens: int, attns: list[str],
                       with_old: bool) -> None:
    from kolibri_trt.engine_format import TARGET_DIR
    from kolibri_trt.tokenizer import KolibriTokenizer
    tok = KolibriTokenizer.from_pretrained(engine / TARGET_DIR)
    ids = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in prompts]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for streams in (1, 8):
        rows = [_run(engine, "off", streams, ids, params, False, "dense")]
        for mode in ("drafter", "copy+drafter"):
            if with_old:
                rows.append(_run(engine, mode, streams, ids, params, False, "dense"))
            for attn in attns:
                rows.append(_run(engine, mode, streams, ids, params, True, attn))
        rows.append(_run(engine, "drafter", streams, ids, params, True, attns[0], eager=True))
        worst = standalone.mark_mismatches(rows)
        for r in rows:
            bad = r["mismatches_vs_off"]
            label = f"{r['mode']} {r['proposer'] if r['mode'] != 'off' else ''}" \
                    f"{' eager' if r['eager'] else ''}"
            print(f"  streams={streams} {label:<28} {r['tokens_per_s']:8.1f} tok/s  "
                  f"tau {r['tau'] or 0:.2f}  mismatches {bad}  "
                  f"(install+capture {r['install_and_capture_s']:.2f} s)", flush=True)
            RESULTS["timings"].append({k: v for k, v in r.items() if k != "token_ids"})
        check(f"streams={streams}: every mode and proposer == off", worst == 0,
              f"worst {worst} of {len(prompts)} requests differ")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=Path, default=None,
                    help="gpu_runtime's engine folder: its engine-fp8-nvfp4-fp8 is used")
    ap.add_argument("--engine", type=Path, default=None,
                    help="one engine folder instead (e.g. build.py --target h200's)")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda", help="cpu: dry run on the torch references")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS / "spec_bench_question.jsonl")
    ap.add_argument("--attn", nargs="+", default=["dense", "sdpa", "kernel"])
    ap.add_argument("--no-old", action="store_true", help="skip the old proposer's timings")
    ap.add_argument("--release-iters", type=int, default=50, help="0: skip the release shape")
    ap.add_argument("--round-iters", type=int, default=200,
                    help="propose_batch rounds timed at the mini shape (0: skip)")
    ap.add_argument("--only", nargs="+", default=None,
                    help="steps to run: parity graphs speed release round")
    args = ap.parse_args()
    if (args.engine is None) == (args.engines is None):
        ap.error("give exactly one of --engines and --engine")
    DEVICE[0] = args.device
    prompts = load_prompts(args.prompts_file, per_category=args.per_category)[:args.limit]
    engine = args.engine or args.engines / "engine-fp8-nvfp4-fp8"
    steps = [(f"parity {a}", "parity", lambda a=a: check_parity(engine, a)) for a in args.attn]
    steps += [(f"graphs {a}", "graphs", lambda a=a: check_graphs(engine, a)) for a in args.attn]
    if args.release_iters:
        steps.append(("release", "release",
                      lambda: release_shape_timing(args.attn, args.release_iters)))
    if args.round_iters:
        steps.append(("mini round", "round", lambda: mini_round_timing(args.round_iters)))
    steps.append(("speed", "speed", lambda: lossless_and_speed(
        engine, prompts, args.max_tokens, args.attn, not args.no_old)))
    if DEVICE[0] != "cpu":
        print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    chosen = [(name, fn) for name, kind, fn in steps if not args.only or kind in args.only]
    return standalone.run_steps(chosen, RESULTS, args.out / "gpu_drafter.json")

if __name__ == "__main__":
    sys.exit(main())
