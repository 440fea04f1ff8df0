#!/usr/bin/env python3
"""H200 check and timing of the drafter's kernel path (DrafterPlugin + DrafterRunner + CUDA
graphs, `spec/plugin_drafter_proposer.py`), in one call.

    python3 bench/gpu_runtime.py --make-engines engines/gpu-small   # here: the same engines
    python3 bench/gpu_drafter.py --engines engines/gpu-small --out DIR   # on the GPU machine

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
ring rows) bucket, graphs vs eager, dense vs sdpa attention; one full `propose_batch` round
at the mini engine's drafter shape (checkpoints/kolibri-mini, random weights) with 1 and 8
streams: wall ms, CUDA-event ms of the round, the device time of its graphs replayed back to
back (wall - that = the host's share), `observe` ms per step, and the drafts readback (pinned
copy + event vs `.tolist()`). Results: DIR/gpu_drafter.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402  (repository on sys.path; plugins/ by path)

from kolibri_trt import LLM, SamplingParams  # noqa: E402
from kolibri_trt.drafter import DrafterTarget  # noqa: E402
from kolibri_trt.runtime.plugin_loader import load_plugin_drafter  # noqa: E402
from kolibri_trt.prompts import load_prompts  # noqa: E402
from kolibri_trt.runtime.engine_loader import Manifest, load_drafter, load_target  # noqa: E402
from kolibri_trt.spec.drafter_proposer import DrafterProposer  # noqa: E402
from kolibri_trt.spec.metrics import SpecMetrics  # noqa: E402
from kolibri_trt.spec.plugin_drafter_proposer import (PluginDrafterProposer,  # noqa: E402
                                                      install_plugin_drafter)

from drafter_rounds import compare, drive  # noqa: E402

PROMPTS = ROOT.parent / "shared" / "data" / "prompts"
RESULTS: dict = {"checks": {}, "parity": {}, "timings": [], "release_shape": [],
                 "mini_round": []}
DEVICE = ["cuda"]
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


def check_graphs(engine: Path) -> None:
    """A round replayed twice == eager (bits); the drive with graphs == without (bits)."""
    m, _, dev_target = _targets(engine)
    model = load_plugin_drafter(engine, m, dev_target, DEVICE[0])
    use = DEVICE[0] != "cpu"
    runs = []
    for graphs in (use, False):
        prop = PluginDrafterProposer(model, 2, 8, use_graphs=graphs)
        rounds = []
        for i, (_, _, d, lg) in enumerate(drive(None, prop, rounds=6, seed=7, lengths=LENGTHS)):
            rounds.append((d.clone(), lg.clone()))
            if graphs and i == 2:
                runner = prop.runner
                key = runner.last_key
                s = d.shape[0]
                graph, (gd, gl) = runner.graphs[key]
                graph.replay()
                again = (gd[:s].clone(), gl[:s].clone())
                ed, el = runner._round_step(key[1], key[2])
                check("round graph replayed twice == first replay, same bits",
                      torch.equal(again[0], d) and torch.equal(again[1], lg))
                check("round graph == the same padded round eager, same bits",
                      torch.equal(ed[:s], d) and torch.equal(el[:s], lg),
                      f"max |diff| {(el[:s] - lg).abs().max().item():.3g}")
        runs.append(rounds)
        if graphs:
            check("graphs captured", len(prop.runner.graphs) > 0,
                  f"{len(prop.runner.graphs)} graphs: {sorted(prop.runner.graphs)}")
    same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(*runs))
    check("drive with CUDA graphs == eager, same bits", same and len(runs[0]) == len(runs[1]))


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


def random_release_drafter(device, attn: str = "dense", seed: int = 0, small: bool = False,
                          cfg=None, vocab: int = 131072):
    """A DrafterPlugin of the release config (`DrafterConfig()` defaults; or cfg) with random
    weights, quantized here as the build does (block FP8 body, NVFP4 head); target vocab
    `vocab`. small: hidden 256, 2 heads, draft vocab 2000 (the CPU dry run of this code)."""
    from kolibri_trt.builder.quantize import quantize_block_fp8, quantize_nvfp4
    from kolibri_trt.drafter import DrafterConfig, KolibriBlockDrafter
    from kolibri_trt.drafter.plugin_drafter import DrafterPlugin
    from kolibri_trt.engine_format import drafter_weight_group
    cfg = cfg or DrafterConfig()
    if small:
        cfg = DrafterConfig(hidden_size=256, target_hidden_size=256, num_attention_heads=2,
                            num_key_value_heads=2, intermediate_size=512, predecessor_rank=64,
                            spine_rank=64, draft_vocab_size=2000)
        vocab = 4000
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape in KolibriBlockDrafter.expected_shapes(cfg).items():
        if drafter_weight_group(name) == "body":
            w = torch.randn(shape, generator=g, device=device) / shape[-1] ** 0.5
            q, s = quantize_block_fp8(w)
            tensors[name], tensors[name[:-len("weight")] + "weight_scale"] = q, s
        elif name == "mask_embedding":
            tensors[name] = torch.randn(shape, generator=g, device=device).to(torch.bfloat16)
        else:
            tensors[name] = (1 + 0.1 * torch.randn(shape, generator=g, device=device)
                             ).to(torch.bfloat16)
    head = torch.randn(cfg.draft_vocab_size, cfg.hidden_size, generator=g,
                       device=device) / cfg.hidden_size ** 0.5
    w, s, s2 = quantize_nvfp4(head)
    tensors.update({"lm_head.weight": w, "lm_head.weight_scale": s, "lm_head.weight_scale_2": s2})
    embed = torch.randn(vocab, cfg.hidden_size, generator=g, device=device).to(torch.bfloat16)
    target = DrafterTarget(embed, torch.empty(vocab, cfg.hidden_size, device="meta"), 50)
    draft_vocab = torch.randperm(vocab, generator=g, device=device)[:cfg.draft_vocab_size]
    return DrafterPlugin.from_tensors(cfg, tensors, {"body": "block_fp8", "head": "nvfp4"},
                                      target, draft_vocab.sort().values, attn=attn)


def release_shape_timing(attns: list[str], iters: int) -> None:
    """Round time of the release-shape drafter per (streams, anchor) with graphs and eager."""
    from kolibri_trt.spec.drafter_runner import DrafterRunner
    dev = DEVICE[0]
    base = random_release_drafter(dev, small=dev == "cpu")
    c = base.config
    for attn in attns:
        model = copy.copy(base)
        model.attn = attn
        for graphs in ((True, False) if dev != "cpu" else (False,)):
            runner = DrafterRunner(model, 2, 16, use_graphs=graphs)
            ring = runner.ring
            for layer in range(c.num_hidden_layers):
                ring.k[layer].normal_()
                ring.v[layer].normal_()
            for s in (1, 4, 16) if dev != "cpu" else (1, 4):
                for anchor in (200, 2500):
                    r = ring.size
                    pos = torch.arange(anchor - c.context_window, anchor, device=dev)
                    ring.pos.fill_(-1)
                    ring.pos[:s, pos % r] = pos
                    taps = torch.randn(s, c.num_taps, c.target_hidden_size, device=dev,
                                       dtype=torch.bfloat16)
                    args = ([taps], s, None, ([5] * s, list(range(s)), [anchor] * s,
                                              list(range(s))))
                    runner.step(*args)
                    torch.cuda.synchronize() if dev != "cpu" else None
                    n = iters if graphs else max(3, iters // 10)
                    t0 = time.perf_counter()
                    for _ in range(n):
                        d, _ = runner.step(*args)
                        runner.read_drafts(d)
                    ms = (time.perf_counter() - t0) / n * 1e3
                    row = {"attn": attn, "graphs": graphs, "streams": s, "anchor": anchor,
                           "ring_rows": runner.length_bucket(anchor), "ms_per_round": ms}
                    RESULTS["release_shape"].append(row)
                    print(f"  release shape: {attn:<5} {'graphs' if graphs else 'eager ':<6} "
                          f"S={s:<3} anchor {anchor:<5} L={row['ring_rows']:<5} "
                          f"{ms:7.3f} ms/round (depth 2)", flush=True)
            del runner
        torch.cuda.empty_cache() if dev != "cpu" else None


def _ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1e3, 4)


def _per_call_ms(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return round((time.perf_counter() - t0) / n * 1e3, 4)


def _mini_drafter(dev):
    """A DrafterPlugin of the mini engine's drafter config and target vocab, random weights."""
    from kolibri_trt.drafter import DrafterConfig
    mini = ROOT / "checkpoints" / "kolibri-mini"
    vocab = json.loads((mini / "target" / "config.json").read_text())["vocab_size"]
    return random_release_drafter(dev, cfg=DrafterConfig.from_json(mini / "drafter"), vocab=vocab)


def _device_and_readback(runner, keys: list[tuple], streams: int, iters: int, ev) -> dict:
    """The round's graphs (keys: commit, round) replayed back to back: device ms per round;
    reading its drafts back: `read_drafts` (pinned + event) vs `.tolist()` ms, GPU idle."""
    graphs = [runner.graphs[k][0] for k in keys]
    drafts = runner.graphs[keys[-1]][1][0][:streams]
    torch.cuda.synchronize()
    ev[0].record()
    for _ in range(iters):
        for graph in graphs:
            graph.replay()
    ev[1].record()
    ev[1].synchronize()
    return {"device_ms": round(ev[0].elapsed_time(ev[1]) / iters, 4),
            "read_pinned_ms": _per_call_ms(lambda: runner.read_drafts(drafts), iters),
            "tolist_ms": _per_call_ms(lambda: drafts.tolist(), iters)}


def _decode_step(prop, tokens: dict, step: torch.Tensor, k: int, ev) -> tuple:
    """One round of every stream, then each commits k drafts + 1 (taps: views of `step`).
    Returns (wall s of propose_batch, CUDA-event s from its start to its end, observe s)."""
    if ev:
        torch.cuda.synchronize()
        ev[0].record()
    t0 = time.perf_counter()
    out = prop.propose_batch(list(tokens.items()))
    t1 = time.perf_counter()
    if ev:
        ev[1].record()
        ev[1].synchronize()
    for i, rid in enumerate(tokens):
        prop.observe(rid, len(tokens[rid]) - 1, step[i * (k + 1):(i + 1) * (k + 1)])
    t2 = time.perf_counter()
    for rid in tokens:
        tokens[rid] += out[rid][:k] + [7]
    return t1 - t0, ev[0].elapsed_time(ev[1]) / 1e3 if ev else t1 - t0, t2 - t1


def mini_round_timing(iters: int, prefill: int = 300, warmup: int = 5) -> None:
    """`propose_batch` rounds at the mini drafter's shape (serving depth, 8 ring slots) in
    steady decoding (`_decode_step`, k cycling 0 .. depth*B), 1 and 8 streams: median wall and
    CUDA-event ms of a round, `observe` ms of a step; on CUDA `_device_and_readback`."""
    dev = DEVICE[0]
    cuda = dev != "cpu"
    model = _mini_drafter(dev)
    c = model.config
    depth, nd = c.serving_defaults.depth, c.serving_defaults.depth * c.block_size
    g = torch.Generator(device=dev).manual_seed(1)
    pool = torch.randn(prefill + 8 * (nd + 1), c.num_taps, c.target_hidden_size, generator=g,
                       device=dev).to(torch.bfloat16)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
    for streams in (1, 8):
        prop = PluginDrafterProposer(model, depth, 8, use_graphs=cuda)
        captured = prop.capture_all() if cuda else 0
        keys, real = [], prop.runner._replay
        prop.runner._replay = lambda key, fn: (keys.append(key), real(key, fn))[1]
        tokens = {f"s{i}": list(range(100 + i, 101 + i + prefill)) for i in range(streams)}
        for rid in tokens:
            prop.observe(rid, 0, pool[:prefill])
        times = [_decode_step(prop, tokens, pool[:streams * (it % (nd + 1) + 1)],
                              it % (nd + 1), ev) for it in range(warmup + iters)][warmup:]
        wall, span, obs = zip(*times)
        row = {"streams": streams, "depth": depth, "prefill": prefill, "graphs": captured,
               "keys": [list(k) for k in keys[-2:]], "wall_ms": _ms(wall),
               "event_ms": _ms(span), "observe_ms": _ms(obs)}
        if cuda:
            row.update(_device_and_readback(prop.runner, keys[-2:], streams, iters, ev))
            row["host_ms"] = round(row["wall_ms"] - row["device_ms"], 4)
        RESULTS["mini_round"].append(row)
        print(f"  mini round: S={streams} {json.dumps(row)}", flush=True)
        del prop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda", help="cpu: dry run on the torch references")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    ap.add_argument("--prompts-file", type=Path, default=PROMPTS / "spec_bench_question.jsonl")
    ap.add_argument("--attn", nargs="+", default=["dense", "sdpa"])
    ap.add_argument("--no-old", action="store_true", help="skip the old proposer's timings")
    ap.add_argument("--release-iters", type=int, default=50, help="0: skip the release shape")
    ap.add_argument("--round-iters", type=int, default=200,
                    help="propose_batch rounds timed at the mini shape (0: skip)")
    ap.add_argument("--only", nargs="+", default=None,
                    help="steps to run: parity graphs speed release round")
    args = ap.parse_args()
    DEVICE[0] = args.device
    prompts = load_prompts(args.prompts_file, per_category=args.per_category)[:args.limit]
    engine = args.engines / "engine-fp8-nvfp4-fp8"
    steps = [(f"parity {a}", "parity", lambda a=a: check_parity(engine, a)) for a in args.attn]
    steps.append(("graphs", "graphs", lambda: check_graphs(engine)))
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
