#!/usr/bin/env python3
"""H200 check and timing of the runtime's kernel path (PluginModel + CUDA graphs), in one call.

    python3 bench/gpu_runtime.py --make-engines engines/gpu-small   # here: builds 2 engines
    python3 bench/gpu_runtime.py --engines engines/gpu-small --out DIR   # on the GPU machine
    python3 bench/gpu_runtime.py --engine engines/mini-h200 --out DIR    # or one built engine

The engines have the scaled-down default's shape (kolibri-1.md §Scaled-down: 10 layers, hidden
256, 4/2 heads of 128, 8 experts) with vocab 2000, random weights, FP8 body + NVFP4 head, and
the full layers' KV in rotated INT4 or FP8. Checks (exit 1 if one fails):
- fp8_kv_write on the GPU equals its torch reference bit for bit (rounding, skipped slots);
- a bucketed decode + verification step: CUDA graph replayed twice, the same padded step
  eager, and the step unpadded all give the same logits bits;
- the GPU kernel path agrees with the CPU dequantizing reference (top-1, KL; printed);
- greedy and sampled tokens are identical for speculative off / copy / drafter / copy+drafter
  at 1 and 8 streams, and with CUDA graphs vs eager; copy+drafter also with the drafts read
  on the host before the target pass (drafts_on_device=False), with the drafter's rounds
  launched after each step instead of chained to its verification (drafter_chain=False), and
  eager.
Timings: tokens/s per mode and stream count, graphs vs eager. Results: DIR/gpu_runtime.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402  (repository on sys.path; plugins/ by path)

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402
from plugin_settings import apply_settings  # noqa: E402

PROMPTS = ROOT.parent / "shared" / "data" / "prompts"
KV_FORMATS = ("hadamard-int4", "fp8")
RESULTS: dict = {"checks": {}, "timings": [], "agreement": {}}
DEVICE = ["cuda"]   # --device cpu: a dry run of this script on the kernels' torch references
PLUGIN_OPTIONS: dict = {}   # EngineArgs for the kernel-path engines (--lm-head-kernel)


def check(name: str, ok: bool, detail: str = "") -> None:
    standalone.record(RESULTS, name, ok, detail)


def make_engines(out: Path) -> None:
    """Build the two engines with build.py's code (here, where ModelOpt is installed)."""
    from kolibri_trt.fixtures import random_target, tiny_target_config
    from runtime_engines import VOCAB, write_engine
    model = random_target(tiny_target_config(vocab_size=VOCAB), seed=31)
    for kv in KV_FORMATS:
        print("built", write_engine(out, model, weights="fp8-nvfp4", kv_cache=kv))


def check_kv_write() -> None:
    from kolibri_trt_plugins import fp8_kv_write
    g = torch.Generator().manual_seed(0)
    k = torch.randn(37, 2, 128, generator=g).to(torch.bfloat16) * 5
    v = torch.randn(37, 2, 128, generator=g).to(torch.bfloat16)
    slots = torch.randperm(64, generator=g)[:37]
    slots[::4] = -1
    ks, vs = torch.tensor([0.37]), torch.tensor([1.0])
    ref = [torch.zeros(4, 16, 2, 128, dtype=torch.float8_e4m3fn) for _ in range(2)]
    fp8_kv_write(k, v, slots, *ref, ks, vs)
    dev = DEVICE[0]
    gpu = [torch.zeros(4, 16, 2, 128, dtype=torch.float8_e4m3fn, device=dev) for _ in range(2)]
    fp8_kv_write(k.to(dev), v.to(dev), slots.to(dev), *gpu, ks.to(dev), vs.to(dev))
    same = all(torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8))
               for a, b in zip(ref, gpu))
    check("fp8_kv_write GPU == reference", same)


def check_capture_all(eng, tag: str) -> None:
    """Graphs were captured at engine start-up, and capturing all buckets again writes
    nothing into the KV cache (the steps are all padding)."""
    from kolibri_trt.runtime.cuda_graphs import PluginRunner
    runner, g = eng.runner, eng.cache.geometry
    check(f"{tag}: graphs captured at start-up", len(runner.graphs) > 0,
          f"{len(runner.graphs)} graphs")
    snapshot = [{k: v.clone() for k, v in c.items()} for c in runner.caches]
    fresh = PluginRunner(runner.model, runner.caches, eng.args.max_num_seqs,
                         eng.args.max_model_len, runner.max_q_len, g.block_size)
    n = fresh.capture_all()
    same = all(torch.equal(a[k].reshape(-1).view(torch.uint8),
                           c[k].reshape(-1).view(torch.uint8))
               for a, c in zip(snapshot, runner.caches) for k in a)
    check(f"{tag}: capture_all ({n} graphs) leaves the KV cache untouched", same)


def check_graph_step(engine: Path, tag: str) -> None:
    """Prefill 3 prompts, then one decode + verification step through the bucket's graph."""
    from kolibri_trt.runtime.batch import build_metadata
    from kolibri_trt.runtime.cuda_graphs import PluginRunner
    from kolibri_trt.runtime.scheduler import ScheduledSeq
    llm = LLM(engine, speculative="off", device=DEVICE[0], model_impl="plugins",
              **PLUGIN_OPTIONS)
    eng = llm.engine
    for p in ("Guten Morgen!", "def add(a, b):", "The capital of France is"):
        eng.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True))
    while len(eng.scheduler.running) < 3 or any(s.num_pending != 1
                                                for s in eng.scheduler.running):
        eng.step()
    seqs = list(eng.scheduler.running)
    for s in seqs:
        eng.scheduler.blocks.grow(s, s.num_computed + 4)
    g = eng.cache.geometry
    meta = build_metadata([ScheduledSeq(s, s.num_computed, 1) for s in seqs], g.block_size,
                          g.ring_blocks, {seqs[1].request_id: [5, 6, 7]})
    runner = eng.runner
    if DEVICE[0] != "cpu":   # no CUDA graphs in a CPU dry run
        check_capture_all(eng, tag)
    first, _ = runner.forward(meta)
    second, _ = runner.forward(meta)
    eager = PluginRunner(runner.model, runner.caches, eng.args.max_num_seqs,
                         eng.args.max_model_len, runner.max_q_len, g.block_size,
                         use_graphs=False).forward(meta)[0]
    plain = runner.model.forward(build_metadata([ScheduledSeq(s, s.num_computed, 1)
                                                 for s in seqs], g.block_size, g.ring_blocks,
                                                {seqs[1].request_id: [5, 6, 7]}, device=DEVICE[0]),
                                 runner.caches, max(meta.seq_lens_host), max(meta.q_lens))[0]
    check(f"{tag}: graph replayed twice, same bits", torch.equal(first, second))
    check(f"{tag}: graph == padded eager, same bits", torch.equal(first, eager))
    check(f"{tag}: padded == unpadded (batch invariance), same bits", torch.equal(first, plain),
          f"max |diff| {(first - plain).abs().max().item():.3g}")


def check_agreement(engine: Path, tag: str, prompts) -> None:
    cpu = LLM(engine, speculative="off")
    gpu = LLM(engine, speculative="off", device=DEVICE[0], model_impl="plugins",
              **PLUGIN_OPTIONS)
    ref, got = [], []
    for p in prompts[:4]:
        ids = cpu.tokenizer.apply_chat_template([{"role": "user", "content": p.text}])
        out = cpu.generate(ids, SamplingParams(max_tokens=24, ignore_eos=True))[0]
        seq = out.prompt_token_ids + out.token_ids
        ref.append(cpu.engine.score(seq))
        got.append(gpu.engine.score(seq).cpu())
    ref, got = torch.cat(ref), torch.cat(got)
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    kl = (ref.softmax(-1) * (ref.log_softmax(-1) - got.log_softmax(-1))).sum(-1).mean().item()
    RESULTS["agreement"][tag] = {"top1": top1, "kl": kl, "rows": int(ref.shape[0])}
    print(f"{tag}: GPU kernel path vs CPU reference: top-1 {top1:.4f}, KL {kl:.5f} "
          f"over {ref.shape[0]} rows", flush=True)


# (mode, enforce_eager, drafts_on_device, drafter_chain): the drafter's drafts left on the
# device (the default with graphs; its rounds chained to the verification, drafter_chain
# None) and launched after each step instead (False), read on the host first, and eager
# (rounds on the host path)
VARIANTS = (("off", False, None, None), ("off", True, None, None), ("copy", False, None, None),
            ("drafter", False, None, None), ("copy+drafter", False, None, None),
            ("copy+drafter", False, None, False), ("copy+drafter", False, False, None),
            ("copy+drafter", True, None, None))


def lossless_and_speed(engine: Path, tag: str, prompts, max_tokens: int) -> None:
    from spec_decode import run
    for temp, seed in ((0.0, 0), (0.8, 1), (0.8, 2)):
        params = SamplingParams(max_tokens=max_tokens, temperature=temp, seed=seed,
                                ignore_eos=True)
        for streams in (1, 8):
            rows = []
            for mode, eager, on_device, chain in VARIANTS:
                r = run(engine, mode, streams, prompts, params, device=DEVICE[0],
                        model_impl="plugins", enforce_eager=eager, drafts_on_device=on_device,
                        drafter_chain=chain, **PLUGIN_OPTIONS)
                r.update(engine=tag, temperature=temp, seed=seed, eager=eager,
                         drafts_on_device=on_device, drafter_chain=chain)
                rows.append(r)
            worst = standalone.mark_mismatches(rows)
            for r in rows:
                bad = r["mismatches_vs_off"]
                label = (f"{r['mode']}{' eager' if r['eager'] else ''}"
                         f"{' host drafts' if r['drafts_on_device'] is False else ''}"
                         f"{' unchained' if r['drafter_chain'] is False else ''}")
                print(f"  {tag} T={temp} seed={seed} streams={streams} {label:<16} "
                      f"{r['tokens_per_s']:8.1f} tok/s  tau {r['tau'] or 0:.2f}  "
                      f"mismatches {bad}", flush=True)
                RESULTS["timings"].append({k: v for k, v in r.items() if k != "token_ids"})
            check(f"{tag}: T={temp} seed={seed} streams={streams}: all modes == off", worst == 0,
                  f"worst {worst} of {len(prompts)} requests differ")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--make-engines", type=Path)
    ap.add_argument("--engines", type=Path)
    ap.add_argument("--engine", type=Path, default=None,
                    help="one engine folder instead of --engines' two (e.g. build.py's)")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda", help="cpu: dry run on the torch references")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS / "spec_bench_question.jsonl")
    ap.add_argument("--lm-head-kernel", default="auto", choices=("auto", "mma", "wgmma"),
                    help="EngineArgs.lm_head_kernel of every kernel-path engine (default auto, "
                         "EngineArgs' default)")
    ap.add_argument("--attention-linear-kernel", default="mma", choices=("mma", "wgmma"),
                    help="EngineArgs.attention_linear_kernel of every kernel-path engine")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                    help="a plugin module setting for this run, e.g. _wgmma_gluon.ONE_LAUNCH_ROWS=64")
    args = ap.parse_args()
    apply_settings(args.set)
    DEVICE[0] = args.device
    PLUGIN_OPTIONS.update(lm_head_kernel=args.lm_head_kernel,
                          attention_linear_kernel=args.attention_linear_kernel)
    if args.make_engines:
        make_engines(args.make_engines)
        return 0
    prompts = load_prompts(args.prompts_file, per_category=args.per_category)[:args.limit]
    steps = [("kv_write", check_kv_write)]
    pairs = [(args.engines / f"engine-fp8-nvfp4-{kv}", kv) for kv in KV_FORMATS] \
        if args.engine is None else [(args.engine, args.engine.name)]
    for engine, kv in pairs:
        steps += [(f"{kv} graph", lambda e=engine, t=kv: check_graph_step(e, t)),
                  (f"{kv} agreement", lambda e=engine, t=kv: check_agreement(e, t, prompts)),
                  (f"{kv} lossless", lambda e=engine, t=kv: lossless_and_speed(
                      e, t, prompts, args.max_tokens))]
    return standalone.run_steps(steps, RESULTS, args.out / "gpu_runtime.json")

if __name__ == "__main__":
    sys.exit(main())
