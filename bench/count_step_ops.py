#!/usr/bin/env python3
"""What one `PluginModel.forward` step dispatches besides the plugin kernels (CPU, no GPU needed).

    python3 bench/count_step_ops.py [--out FILE.json] [--layers 5 10] [--seed 0]

Builds the synthetic target of `bench/fullsize.py --tiny` (`fs_common.tiny_config`, layer
count changed by --layers; 4 sliding + 1 full layer per 5) on CPU with KV caches of random
data (`fs_steps.make_cache`), and runs under torch.profiler (CPU activity) one forward for
each step of STEPS: decode 1 x 1 token, decode 4 x 1 token, verification 1 x (1 + 4) tokens.

Counted per forward, from the profiler's event tree:
(a) `kolibri_plugins::*` op calls: the ones `PluginModel` makes, and the nested ones (an op
    that calls another op inside its own body, e.g. the paged attention's `attn_combine`).
(b) glue: the outermost aten ops that run OUTSIDE every kolibri_plugins op (the model's own
    torch code and the public wrappers' code around `torch.ops.kolibri_plugins.*`), by name.
    Each is a dispatcher call on the GPU path too; "launch" marks those that run a kernel
    there (the op or an op below it does more than views, allocation or no-op casts).
(c) what the custom ops' CUDA bodies (`_launch`, the code that runs on CUDA tensors between
    the op's entry and its Triton launches) add. On CPU a custom op runs its torch `_ref`
    body instead, whose aten ops are the reference maths, not GPU work: they are never
    counted. (c) therefore comes from a second pass, "simulated CUDA path": every plugin
    module's `kernel_path` answers "triton" and `launch` records the kernel's name instead of
    running it, so the CUDA bodies run on CPU tensors exactly as they would on the GPU (their
    outputs are uninitialised: the pass counts, its values are meaningless). The aten ops
    inside kolibri_plugins ops in that pass are (c); the recorded launches are the Triton
    kernels one CUDA step launches. Estimated launches per CUDA forward = Triton launches +
    launching glue of (b) + launching ops of (c).

Every step runs with all_rows=True, as PluginRunner's CUDA-graph steps do. Two layer counts
(--layers, default 5 and 10) separate per-step glue from per-layer glue: per layer =
difference / layer difference; "x50" extrapolates to the 50 layers of Kolibri-1.

Table columns: ops = (a) made by the model; nested = (a) inside other ops, CUDA path;
triton = Triton launches; glue_out / glue_out_L = (b), all / launching; glue_in / glue_in_L
= (c), all / launching; aten_calls = aten dispatches at any depth, inside and outside the ops,
CUDA path (host work per step); launches = the estimated kernel launches of one CUDA forward.
Limits: the launch flags come from op names (a CPU-only decomposition can differ from CUDA's
in the ops below an outermost op, not in the outermost ops); Triton's own host work and
memsets/copies a CUDA kernel body might issue outside aten are not seen.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)

from fs_common import Bench, build_engine, tiny_config  # noqa: E402
from fs_steps import make_cache, step_meta  # noqa: E402

from kolibri_trt.config import FULL, SLIDING  # noqa: E402

STEPS = (("decode 1x1", 1, 1), ("decode 4x1", 4, 1), ("verify 1x(1+4)", 1, 5))
SEQ_LEN = 40            # context of every stream (the tiny window is 32: the ring wraps)
FULL_LAYERS = 50        # Kolibri-1's layer count, for the extrapolation
OP_PREFIX = "kolibri_plugins::"
# aten ops that never launch a kernel on CUDA (views, allocation, metadata, no-op casts)
NO_KERNEL = frozenset("aten::" + n for n in (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "slice", "select", "as_strided",
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach",
    "alias", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "split", "unbind",
    "narrow", "to", "contiguous", "resolve_conj", "resolve_neg", "result_type", "lift_fresh",
    "view_as", "expand_as", "chunk"))


# ============================================================================ model and steps
def make_bench(layers: int, seed: int) -> Bench:
    """`fullsize.py --tiny`'s bench (CPU, block 16) with a `layers`-layer tiny config and its
    synthetic engine built (`fs_common.build_engine`)."""
    args = types.SimpleNamespace(device="cpu", tiny=True, block_size=16, seed=seed,
                                 out=tempfile.mkdtemp(prefix="count_step_ops-"),
                                 parts=["count"], budget=1e9)
    b = Bench(args)
    b.cfg = dataclasses.replace(tiny_config(), num_hidden_layers=layers, layer_types=tuple(
        FULL if i % 5 == 4 else SLIDING for i in range(layers)))
    build_engine(b)
    return b


@contextlib.contextmanager
def simulated_cuda_path():
    """Every loaded kolibri_trt_plugins module takes its CUDA branch on CPU tensors; `launch`
    only appends the kernel's name to the yielded list (nothing runs: outputs stay
    uninitialised)."""
    from kolibri_trt_plugins import _common

    launched: list[str] = []

    def record(kernel, grid, *args, **kwargs):
        launched.append(getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel)))

    patched, originals = [], {a: getattr(_common, a) for a in ("kernel_path", "launch")}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("kolibri_trt_plugins.") or mod is None:
            continue
        for attr, new in (("kernel_path", lambda t, what: "triton"), ("launch", record)):
            if getattr(mod, attr, None) is originals[attr]:
                patched.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, new)
    try:
        yield launched
    finally:
        for mod, attr, old in reversed(patched):
            setattr(mod, attr, old)


def forward_events(b: Bench, cache, meta, all_rows: bool):
    """The profiler's CPU events of one `PluginModel.forward` (all rows' logits if all_rows)."""
    seq, q = max(meta.seq_lens_host), max(meta.q_lens)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        b.model.forward(meta, cache.layers, seq, q, all_rows=all_rows)
    return prof.events()


# ============================================================================ classification
def _launches(e) -> bool:
    """True if the op or an op below it runs a kernel on CUDA (not a view/alloc/no-op)."""
    return e.name not in NO_KERNEL or any(_launches(c) for c in e.cpu_children)


def _owner(e):
    """The nearest enclosing op event (aten:: or kolibri_plugins::), or None."""
    p = e.cpu_parent
    while p is not None and not p.name.startswith(("aten::", OP_PREFIX)):
        p = p.cpu_parent
    return p


def _outermost_op(e):
    """The outermost kolibri_plugins op around e, or None."""
    found, p = None, e.cpu_parent
    while p is not None:
        if p.name.startswith(OP_PREFIX):
            found = p
        p = p.cpu_parent
    return found


def classify(events) -> dict:
    """(a) op calls, (b) glue outside ops, (c) aten ops inside ops (each: {name: count}) and
    the launching subsets of (b) and (c) (see the module docstring)."""
    ops, nested = Counter(), Counter()
    outside, outside_launch, inside, inside_launch = Counter(), Counter(), Counter(), Counter()
    calls = Counter()                                 # aten dispatches at any depth
    for e in events:
        owner, top = _owner(e), _outermost_op(e)
        if e.name.startswith("aten::"):
            calls["outside" if top is None else "inside"] += 1
        if e.name.startswith(OP_PREFIX):
            (ops if top is None else nested)[e.name[len(OP_PREFIX):]] += 1
        elif not e.name.startswith("aten::") or (owner is not None
                                                 and owner.name.startswith("aten::")):
            continue                                  # not an op, or below another aten op
        elif top is None:
            outside[e.name] += 1
            outside_launch[e.name] += _launches(e)
        else:
            key = f"{top.name[len(OP_PREFIX):]}/{e.name}"
            inside[key] += 1
            inside_launch[key] += _launches(e)
    return dict(ops=dict(ops), nested_ops=dict(nested), aten_dispatches=dict(calls),
                glue_outside=dict(outside),
                glue_outside_launching={k: v for k, v in outside_launch.items() if v},
                glue_inside=dict(inside),
                glue_inside_launching={k: v for k, v in inside_launch.items() if v})


def _total(counts: dict) -> int:
    return sum(counts.values())


def count_step(b: Bench, cache, streams: int, q: int) -> dict:
    """Both passes of one step: the CPU run (a, b) and the simulated CUDA path (a, b, c and
    the Triton launches); totals per forward."""
    meta = step_meta(b, cache, streams, q, SEQ_LEN)
    all_rows = True                     # as PluginRunner's graph steps (decode, verification)
    b.model.forward(meta, cache.layers, SEQ_LEN, q, all_rows=all_rows)   # warm-up
    ref = classify(forward_events(b, cache, meta, all_rows))
    with simulated_cuda_path() as launched:
        sim = classify(forward_events(b, cache, meta, all_rows))
    sim["triton_launches"] = dict(Counter(launched))
    sums = dict(op_calls=_total(ref["ops"]), nested_op_calls_cuda=_total(sim["nested_ops"]),
                glue_outside=_total(ref["glue_outside"]),
                glue_outside_launching=_total(ref["glue_outside_launching"]),
                glue_inside_cuda=_total(sim["glue_inside"]),
                glue_inside_cuda_launching=_total(sim["glue_inside_launching"]),
                aten_dispatches_cuda=sum(sim["aten_dispatches"].values()),
                triton_launches=len(launched))
    sums["cuda_launches_est"] = (sums["triton_launches"] + sums["glue_outside_launching"]
                                 + sums["glue_inside_cuda_launching"])
    return dict(streams=streams, q=q, seq_len=SEQ_LEN, all_rows=all_rows, totals=sums,
                cpu=ref, simulated_cuda=sim,
                outside_same_in_both=ref["glue_outside"] == sim["glue_outside"])


# ============================================================================ report
def per_layer(runs: dict) -> dict:
    """{step: {total: (per step, per layer, at 50 layers)}} from the first two layer counts."""
    (l1, r1), (l2, r2) = list(runs.items())[:2]
    out = {}
    for step in r1:
        t1, t2 = r1[step]["totals"], r2[step]["totals"]
        out[step] = {}
        for k in t1:
            slope = (t2[k] - t1[k]) / (l2 - l1)
            const = t1[k] - slope * l1
            out[step][k] = dict(per_step=const, per_layer=slope,
                                at_50_layers=const + slope * FULL_LAYERS)
    return out


def print_report(runs: dict, scaling: dict | None) -> None:
    """Totals table per layer count and step, then the glue ops of the first layer count."""
    keys = ("op_calls", "nested_op_calls_cuda", "triton_launches", "glue_outside",
            "glue_outside_launching", "glue_inside_cuda", "glue_inside_cuda_launching",
            "aten_dispatches_cuda", "cuda_launches_est")
    heads = ("ops", "nested", "triton", "glue_out", "glue_out_L", "glue_in", "glue_in_L",
             "aten_calls", "launches")
    print(f"{'layers':>6} {'step':<16}" + "".join(f"{k:>11}" for k in heads))
    for layers, steps in runs.items():
        for step, r in steps.items():
            print(f"{layers:>6} {step:<16}" + "".join(f"{r['totals'][k]:>11}" for k in keys))
    if scaling:
        for step, d in scaling.items():
            print(f"{'x50':>6} {step:<16}" + "".join(f"{d[k]['at_50_layers']:>11.0f}"
                                                      for k in keys))
            print(f"{'/layer':>6} {step:<16}" + "".join(f"{d[k]['per_layer']:>11.1f}"
                                                        for k in keys))
    layers, steps = next(iter(runs.items()))
    for step, r in steps.items():
        print(f"\n== {step}, {layers} layers: kolibri_plugins ops {r['cpu']['ops']}")
        print(f"   nested on the CUDA path: {r['simulated_cuda']['nested_ops']}")
        print(f"   Triton launches: {r['simulated_cuda']['triton_launches']}")
        for title, d, launching in (
                ("glue outside ops (b)", r["cpu"]["glue_outside"],
                 r["cpu"]["glue_outside_launching"]),
                ("inside ops, CUDA bodies (c)", r["simulated_cuda"]["glue_inside"],
                 r["simulated_cuda"]["glue_inside_launching"])):
            print(f"   {title}:")
            for name, n in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])):
                print(f"     {n:5d}  {name}{'  [launch]' if launching.get(name) else ''}")
        if not r["outside_same_in_both"]:
            print("   NOTE: glue outside ops differs between the CPU and simulated passes")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="write the counts as JSON here")
    p.add_argument("--layers", type=int, nargs="+", default=[5, 10],
                   help="layer counts to build (two or more: per-layer slope)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    runs = {}
    for layers in args.layers:
        b = make_bench(layers, args.seed)
        cache = make_cache(b, "hadamard-int4", max(s for _, s, _ in STEPS), SEQ_LEN + 8)
        runs[layers] = {name: count_step(b, cache, s, q) for name, s, q in STEPS}
    scaling = per_layer(runs) if len(runs) >= 2 else None
    print_report(runs, scaling)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(runs=runs, scaling=scaling), indent=1))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
