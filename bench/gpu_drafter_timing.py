"""The timing steps of bench/gpu_drafter.py (`release`: the release-shape drafter's round time
per bucket; `round`: `propose_batch` rounds at the mini engine's drafter shape), and the state
both modules share: DEVICE (gpu_drafter.main() sets DEVICE[0]) and RESULTS (written to
gpu_drafter.json). Both are mutated in place, never rebound, so ``from gpu_drafter_timing
import DEVICE, RESULTS`` sees the run's values. Run through bench/gpu_drafter.py."""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path

import standalone  # noqa: F401  (repository on sys.path; plugins/ by path)
import torch

from kolibri_trt.drafter import DrafterTarget
from kolibri_trt.spec.plugin_drafter_proposer import PluginDrafterProposer

ROOT = Path(__file__).resolve().parents[1]
RESULTS: dict = {"checks": {}, "parity": {}, "timings": [], "release_shape": [],
                 "mini_round": []}
DEVICE = ["cuda"]


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
                    runner.history.normal_()
                    args = (None, ([5] * s, list(range(s)), [anchor] * s,
                                   [runner.history_row(i, anchor) for i in range(s)]))
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


def _mini_drafter(dev, attn: str):
    """A DrafterPlugin of the mini engine's drafter config and target vocab, random weights."""
    from kolibri_trt.drafter import DrafterConfig
    mini = ROOT / "checkpoints" / "kolibri-mini"
    vocab = json.loads((mini / "target" / "config.json").read_text())["vocab_size"]
    return random_release_drafter(dev, attn, cfg=DrafterConfig.from_json(mini / "drafter"),
                                  vocab=vocab)


HOST_PARTS = (("collect", "prop", "_collect"), ("stage_commit", "runner", "_stage_commit"),
              ("stage_round", "runner", "_stage_round"), ("replay", "runner", "_replay"),
              ("start_read", "runner", "start_read"), ("launch", "prop", "launch"))


def _host_timers(prop) -> tuple[dict, callable]:
    """Wrap the host-side pieces of a round (HOST_PARTS) with wall-clock accumulators; returns
    (seconds by part, undo)."""
    acc = dict.fromkeys([k for k, _, _ in HOST_PARTS], 0.0)
    undo = []
    for key, owner, name in HOST_PARTS:
        obj = prop if owner == "prop" else prop.runner
        orig = getattr(obj, name)

        def run(*a, _orig=orig, _key=key, **kw):
            t0 = time.perf_counter()
            try:
                return _orig(*a, **kw)
            finally:
                acc[_key] += time.perf_counter() - t0
        setattr(obj, name, run)
        undo.append(lambda obj=obj, name=name, orig=orig: setattr(obj, name, orig))
    return acc, lambda: [u() for u in undo]


def _kernel_table(graphs: list, iters: int) -> list[dict]:
    """torch.profiler over `iters` back-to-back replays of `graphs`: per kernel, launches and
    device µs per round, the largest first."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            for graph in graphs:
                graph.replay()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = float(getattr(e, "self_device_time_total", 0.0) or
                   getattr(e, "self_cuda_time_total", 0.0))
        if us > 0:
            rows.append({"kernel": e.key[:80], "per_round": round(e.count / iters, 2),
                         "us_per_round": round(us / iters, 2)})
    return sorted(rows, key=lambda r: -r["us_per_round"])


def _device_and_readback(runner, keys: list[tuple], streams: int, iters: int, ev) -> dict:
    """The round's graphs (keys: commit, round; or one merged "step") replayed back to back:
    device ms per round; reading its drafts back: `read_drafts` (pinned + event) vs
    `.tolist()` ms, GPU idle."""
    graphs = [runner.graphs[k][0] for k in keys]
    drafts = runner.graphs[keys[-1]][1][0][:streams]
    each = []
    for part in [graphs] + [[g] for g in graphs]:     # both, then each graph alone
        torch.cuda.synchronize()
        ev[0].record()
        for _ in range(iters):
            for graph in part:
                graph.replay()
        ev[1].record()
        ev[1].synchronize()
        each.append(round(ev[0].elapsed_time(ev[1]) / iters, 4))
    return {"device_ms": each[0], "device_ms_each": each[1:],
            "kernels": _kernel_table(graphs, min(iters, 50)),
            "read_pinned_ms": _per_call_ms(lambda: runner.read_drafts(drafts), iters),
            "tolist_ms": _per_call_ms(lambda: drafts.tolist(), iters)}


def _decode_step(prop, tokens: dict, step: torch.Tensor, k: int, ev) -> tuple:
    """One round of every stream, then each commits k drafts + 1 (taps: rows of `step`,
    written into the taps history by `observe`).
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


def mini_round_timing(iters: int, prefill: int = 300, warmup: int = 5,
                      attn: str = "kernel") -> None:
    """`propose_batch` rounds at the mini drafter's shape (serving depth, 8 ring slots, ring
    attention `attn`) in steady decoding (`_decode_step`, k cycling 0 .. depth*B), 1 and 8
    streams: median wall and CUDA-event ms of a round, `observe` ms of a step, host ms per
    round of the launch's parts (HOST_PARTS); on CUDA `_device_and_readback` (device ms of
    both graphs and of each, the kernels per round)."""
    dev = DEVICE[0]
    cuda = dev != "cpu"
    model = _mini_drafter(dev, attn)
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
        prop.runner._replay = lambda key, fn, parts=(): (keys.append(key),
                                                          real(key, fn, parts))[1]
        tokens = {f"s{i}": list(range(100 + i, 101 + i + prefill)) for i in range(streams)}
        for rid in tokens:
            prop.observe(rid, 0, pool[:prefill])
        times = [_decode_step(prop, tokens, pool[:streams * (it % (nd + 1) + 1)],
                              it % (nd + 1), ev) for it in range(warmup)]
        acc, undo = _host_timers(prop)
        times = [_decode_step(prop, tokens, pool[:streams * (it % (nd + 1) + 1)],
                              it % (nd + 1), ev) for it in range(iters)]
        undo()
        wall, span, obs = zip(*times)
        last = keys[-1:] if keys[-1][0] == "step" else keys[-2:]   # the last round's graphs
        row = {"streams": streams, "depth": depth, "prefill": prefill, "attn": attn,
               "graphs": captured, "keys": [list(k) for k in last], "wall_ms": _ms(wall),
               "event_ms": _ms(span), "observe_ms": _ms(obs),
               "host_parts_ms": {k: round(v * 1e3 / iters, 4) for k, v in acc.items()}}
        if cuda:
            row.update(_device_and_readback(prop.runner, last, streams, iters, ev))
            row["host_ms"] = round(row["wall_ms"] - row["device_ms"], 4)
        RESULTS["mini_round"].append(row)
        kernels = row.pop("kernels", [])
        print(f"  mini round: S={streams} {json.dumps(row)}", flush=True)
        for k in kernels[:25]:
            print(f"    {k['us_per_round']:8.2f} us {k['per_round']:5.1f}x  {k['kernel']}",
                  flush=True)
        row["kernels"] = kernels
        del prop
