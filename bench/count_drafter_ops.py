#!/usr/bin/env python3
"""What one drafter round (`DrafterRunner`'s commit and round steps) launches (CPU, no GPU).

    python3 bench/count_drafter_ops.py [--engine DIR] [--weights fp8-nvfp4|bf16]
        [--depth 1] [--streams 1 8] [--commit 8] [--length 256] [--attn dense] [--where]
        [--out FILE.json]

The drafter: the `DrafterPlugin` of --engine (an engine folder), or without it of the default
engine (`build.py --target h200`: the embedded kolibri-mini pair, --weights) built into a
temporary folder (about 12 s). `DrafterRunner` (no graphs) runs one real round first (the
ring holds context rows, the static index buffers hold the round's inputs), then each of its
two graphed steps, `_commit_step(N_b)` and `_round_step(S_b, L)` (exactly the code one CUDA
graph each captures; the round as serving runs it, without logits), is counted with
`bench/count_step_ops.py`'s method and helpers:
(a) kolibri_plugins op calls; (b) glue: outermost aten ops outside every plugin op, "launch"
when they run a kernel on CUDA; (c) from a second pass on the simulated CUDA path
(`count_step_ops.simulated_cuda_path`: every plugin takes its CUDA branch on CPU tensors and
`launch` records the kernel name): the aten ops inside the plugins' CUDA bodies, and the
Triton launches. Estimated launches of a step = Triton + launching glue (b) + launching (c).

Not counted (outside the graphs, once per round whatever the drafter does): the index upload,
the graph replays, the drafts copy back (`drafter_runner.py`).
--where adds, per step, the launching glue grouped by the project function that issued it
(profiler stack tracing). Limits: those of count_step_ops (launch flags from op names; memsets
or copies outside aten are not seen).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from count_step_ops import (_launches, _outermost_op, _owner, _total, classify,  # noqa: E402
                            simulated_cuda_path)

from kolibri_trt.runtime.engine_loader import Manifest  # noqa: E402
from kolibri_trt.runtime.plugin_loader import load_plugin_drafter, load_plugin_target  # noqa
from kolibri_trt.spec.drafter_runner import DrafterRunner  # noqa: E402

SOURCE_DIRS = ("kolibri_trt/drafter/", "kolibri_trt/spec/", "kolibri_trt/model/")


# ============================================================================ drafter
def default_engine(weights: str) -> Path:
    """The default engine (`build.py --target h200 --weights W`) in a temporary folder."""
    out = Path(tempfile.mkdtemp(prefix="count_drafter_ops-")) / "engine"
    subprocess.run([sys.executable, str(ROOT / "build.py"), "--target", "h200", "--out",
                    str(out), "--weights", weights, "--no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def load_drafter(engine: Path, attn: str):
    """The engine's `DrafterPlugin` on CPU (the target only lends its embedding)."""
    m = Manifest.read(engine)
    _, target, _ = load_plugin_target(engine, m, "cpu")
    return load_plugin_drafter(engine, m, target, "cpu", attn=attn)


def prepared_runner(model, depth: int, streams: int, commit: int, length: int | None,
                    seed: int) -> tuple[DrafterRunner, int, int, int]:
    """A runner after one real round of `streams` streams, each committing ceil(commit /
    streams) rows first (anchors past them). Returns (runner, N_b, S_b, L) of that round."""
    c = model.config
    runner = DrafterRunner(model, depth, max(streams, 1), use_graphs=False,
                           length_buckets=() if length is None else (length,))
    g = torch.Generator().manual_seed(seed)
    per = -(-commit // streams)
    rows = streams * (per + 1)
    taps = (torch.randn(rows, c.num_taps, c.target_hidden_size, generator=g) * 3
            ).to(torch.bfloat16)
    com, rnd = ([], [], [], []), ([], [], [], [])
    for s in range(streams):
        base = s * (per + 1)
        for i in range(per):
            for f, v in zip(com, (11 + i, s, i, base + i)):
                f.append(v)
        for f, v in zip(rnd, (5, s, per, base + per)):
            f.append(v)
    runner.history[:rows].copy_(taps)      # rows 0 .. rows - 1 of the taps history
    runner.step(com, rnd)
    n_b, s_b = runner.commit_buckets()[0], 1
    while n_b < len(com[0]):
        n_b *= 2
    while s_b < streams:
        s_b *= 2
    return runner, n_b, s_b, runner.length_bucket(per)


# ============================================================================ counting
def events(fn, stacks: bool = False):
    with profile(activities=[ProfilerActivity.CPU], with_stack=stacks) as prof:
        fn()
    return prof.events()


def _site(e) -> str:
    """The innermost project function around e (a Python event of the profiler's stack
    tracing: "drafter/plugin_drafter.py(LINE): NAME", LINE where the function starts)."""
    p = e.cpu_parent
    while p is not None:
        for d in SOURCE_DIRS:
            if d in p.name:
                return p.name[p.name.index(d) + len("kolibri_trt/"):]
        p = p.cpu_parent
    return "?"


def glue_sites(evts) -> dict:
    """Launching glue outside plugin ops (count_step_ops's (b)) by project function."""
    out = Counter()
    for e in evts:
        owner = _owner(e)
        if (e.name.startswith("aten::") and _outermost_op(e) is None
                and (owner is None or not owner.name.startswith("aten::")) and _launches(e)):
            out[f"{_site(e)}  {e.name}"] += 1
    return dict(out)


def count(fn, where: bool) -> dict:
    """count_step_ops's two passes over fn (one graphed step)."""
    fn()                                                   # warm-up
    ref = classify(events(fn))
    sites = glue_sites(events(fn, stacks=True)) if where else {}
    with simulated_cuda_path() as launched:
        sim = classify(events(fn))
    sim["triton_launches"] = dict(Counter(launched))
    sums = dict(op_calls=_total(ref["ops"]), triton=len(launched),
                glue_outside=_total(ref["glue_outside"]),
                glue_outside_launching=_total(ref["glue_outside_launching"]),
                glue_inside_cuda_launching=_total(sim["glue_inside_launching"]))
    sums["launches"] = (sums["triton"] + sums["glue_outside_launching"]
                        + sums["glue_inside_cuda_launching"])
    return dict(totals=sums, cpu=ref, simulated_cuda=sim, sites=sites,
                outside_same_in_both=ref["glue_outside"] == sim["glue_outside"])


def count_round(model, depth: int, streams: int, commit: int, length: int | None,
                where: bool, seed: int) -> dict:
    runner, n_b, s_b, length = prepared_runner(model, depth, streams, commit, length, seed)
    return {f"commit N_b={n_b}": count(lambda: runner._commit_step(n_b), where),
            f"propose S_b={s_b} L={length}": count(lambda: runner._round_step(s_b, length),
                                                  where)}


# ============================================================================ report
def print_table(title: str, steps: dict) -> None:
    """One column per step: Triton kernels, launching glue (b), launching CUDA-body ops (c)."""
    names = list(steps)
    rows: dict[tuple[str, str], list[int]] = {}
    for k, r in enumerate(steps.values()):
        for kind, d in (("triton", r["simulated_cuda"]["triton_launches"]),
                        ("glue", r["cpu"]["glue_outside_launching"]),
                        ("in-op", r["simulated_cuda"]["glue_inside_launching"])):
            for name, n in d.items():
                rows.setdefault((kind, name), [0] * len(names))[k] += n
    w = max([14] + [len(n) + 2 for n in names])
    print(f"\n== {title}")
    print(f"{'kind':<7}{'op / kernel':<46}" + "".join(f"{n:>{w}}" for n in names))
    order = {"triton": 0, "in-op": 1, "glue": 2}
    for (kind, name), ns in sorted(rows.items(), key=lambda kv: (order[kv[0][0]], -sum(kv[1]),
                                                                 kv[0][1])):
        print(f"{kind:<7}{name:<46}" + "".join(f"{n:>{w}}" for n in ns))
    for key, label in (("triton", "Triton launches"), ("glue_outside_launching",
                       "launching glue (b)"), ("glue_inside_cuda_launching",
                       "launching in-op (c)"), ("glue_outside", "all glue ops (b)"),
                       ("op_calls", "plugin op calls"), ("launches", "EST. LAUNCHES")):
        print(f"{'total':<7}{label:<46}" + "".join(f"{r['totals'][key]:>{w}}"
                                                   for r in steps.values()))
    both = sum(r["totals"]["launches"] for r in steps.values())
    print(f"{'total':<7}{'commit + propose':<46}{both:>{w}}")
    for name, r in steps.items():
        if not r["outside_same_in_both"]:
            print(f"NOTE {name}: glue outside ops differs between the CPU and simulated passes")
        if r["sites"]:
            print(f"\n   launching glue of {name} by project function:")
            for site, n in sorted(r["sites"].items(), key=lambda kv: (-kv[1], kv[0])):
                print(f"     {n:4d}  {site}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", type=Path, help="engine folder (default: build the default)")
    p.add_argument("--weights", default="fp8-nvfp4", help="weights of the default build")
    p.add_argument("--attn", default="dense", choices=("dense", "sdpa", "kernel"))
    p.add_argument("--depth", type=int, nargs="+", default=[1])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    p.add_argument("--commit", type=int, default=8, help="context rows committed (all streams)")
    p.add_argument("--length", type=int, default=256, help="ring rows attended (0: all R)")
    p.add_argument("--where", action="store_true", help="launching glue by project function")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the counts as JSON here")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    engine = args.engine or default_engine(args.weights)
    model = load_drafter(engine, args.attn)
    if args.engine is None:
        shutil.rmtree(engine.parent)              # the tensors are loaded: the build can go
    c = model.config
    print(f"drafter of {engine}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, heads "
          f"{c.num_attention_heads}/{c.num_key_value_heads}, draft vocab {c.draft_vocab_size}, "
          f"block {c.block_size}; attn {args.attn}")
    runs = {}
    for depth in args.depth:
        for s in args.streams:
            title = f"depth {depth}, {s} stream(s), {args.commit} rows committed"
            runs[title] = count_round(model, depth, s, args.commit, args.length or None,
                                      args.where, args.seed)
            print_table(title, runs[title])
    if args.out:
        Path(args.out).write_text(json.dumps(dict(engine=str(engine), runs=runs), indent=1))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
