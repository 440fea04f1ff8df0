#!/usr/bin/env python3
"""Full-size Kolibri-1 on one H200 (issue 8): a synthetic engine made on the GPU, then timings.

    python3 bench/fullsize.py --out DIR [--parts decode,verify,kv,drafter,profile] [--budget 480]
    python3 bench/fullsize.py --tiny --out DIR          # CPU dry run (kernels' torch references)

On the H200 (torch + Triton only; the repository need not be pip-installed), in two calls:
    python3 bench/fullsize.py --out $OUT --parts decode,verify
    python3 bench/fullsize.py --out $OUT --parts kv,drafter
Each call makes the engine again (~1 min with Triton compiles counted elsewhere); --budget
(seconds from start) stops starting new measurements so a call ends before its time limit,
with everything measured so far written.

The engine: `kolibri_trt/builder/synthetic.py` (random weights of the spec's exact shapes, made
and quantized layer by layer on the device into the fp8-nvfp4 engine tensors, FP8 sliding KV +
rotated INT4 full-layer KV; one copy of the ~78 GB of weights for every part). KV caches are
filled with random but valid data for the context (INT4 codes + fp16 scale/offset, FP8 values
N(0, 1)) instead of running prefill; each step's `StepMetadata` is built directly (random block
placement in the full layers, a per-stream ring in the sliding layers) and
`PluginModel.forward` is captured in our own CUDA graph (exact shapes, no bucket padding).

Parts (each writes DIR/fullsize-<parts joined by _>.json as it goes, and a PNG per figure if matplotlib
imports):
- decode:  one decode step (the whole target forward, all rows' logits) at 1/4/16/64 streams x
           contexts 1k/8k/32k: CUDA-graph median, eager median, floor = bytes that must be read /
           4.14e12 B/s (attention + o_proj of every layer, router + the distinct routed experts
           the step selected (counted) + shared expert, LM head, embedding rows, norms, the KV
           bytes the queries can see); per-kernel-class attribution (each class of every layer
           alone in one graph behind an L2 flush).
- verify:  1 + k tokens per stream (k = 0..8) vs the 1-token step, at 1 and 16 streams.
- kv:      rotated INT4 vs FP8 full-layer KV: sessions that fit at 64k / 256k in the memory left
           after the weights (bytes per token, sliding ring included) and decode tokens/s at full
           memory (largest batch that fits, capped by --kv-max-streams).
- drafter: one block-drafter pass as plugin ops in a graph (no drafter kernel path exists yet):
           block-FP8 body (fp8_gemv with [N, K/64] scales), FP8 paged attention over its own
           context cache (2048 rows + the 4 block rows, causal), the NVFP4 head slice
           (60614 x 2560) once per block row; at 1 and 4 streams, against the target step.
- profile: torch.profiler over eager decode steps (1 and 64 streams at 8k): the kernels by
           device time, naming what the attribution's 'rest' is made of.
CUDA graphs vs eager: every timed step of decode / verify / drafter is also timed eagerly.
Aims (reported, not asserted): step <= 1.25x floor at 1 stream, <= 1.5x at 64; INT4 >= +85 %
sessions at 64k; 4-token verification <= 1.15x a 1-token step at 1 stream.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import standalone  # noqa: E402,F401  (repository on sys.path; plugins/ by path)
from fs_common import AIMS, BW, Bench, build_engine, log  # noqa: E402
from plugin_settings import apply_settings  # noqa: E402
from fs_parts import part_decode, part_kv, part_verify  # noqa: E402
from fs_profile import part_profile  # noqa: E402
from fs_drafter import part_drafter  # noqa: E402
from fs_figures import figures  # noqa: E402


# =============================================================================== summary
def summary(b: Bench) -> None:
    """The headline numbers again, compactly, at the end of the output."""
    r = b.results
    log("== summary")
    for x in r.get("decode", {}).get("rows", []):
        att = x.get("attribution", {})
        top = max((c for c in att if c != "rest"), key=lambda c: att[c]["ms"], default=None)
        aim = f" aim {x['aim_ratio']}x {'met' if x['aim_met'] else 'NOT met'}" \
            if "aim_ratio" in x else ""
        log(f"decode {x['streams']:3d} x {x['seq_len']:6d}: {x['graph_ms']:8.3f} ms graph, "
            f"{x.get('eager_ms', float('nan')):8.3f} ms eager, floor {x['floor_ms']:7.3f} ms, "
            f"{x['ratio']:5.2f}x floor{aim}" + (f"; largest class {top} "
                                                 f"{att[top]['ms']:.3f} ms" if top else ""))
    for x in r.get("verify", {}).get("rows", []):
        if "vs_1token" in x:
            aim = f" (aim {x['aim_ratio']}x: {'met' if x['aim_met'] else 'NOT met'})" \
                if "aim_ratio" in x else ""
            log(f"verify {x['streams']:3d} x (1+{x['k']}): {x['graph_ms']:8.3f} ms, "
                f"{x['vs_1token']:.3f}x the 1-token step{aim}")
    for ctx, x in r.get("kv", {}).get("contexts", {}).items():
        i4, f8 = x["hadamard-int4"], x["fp8"]
        tps = lambda d: d.get("decode", {}).get("tokens_per_s", float("nan"))  # noqa: E731
        aim = f" (aim +{100 * x['aim_gain']:.0f} %: {'met' if x['aim_met'] else 'NOT met'})" \
            if "aim_gain" in x else ""
        label = f"{int(ctx) // 1024}k" if int(ctx) >= 1024 else ctx
        log(f"kv {label}: sessions INT4 {i4['sessions']} / FP8 {f8['sessions']} "
            f"({100 * x['int4_sessions_gain']:+.1f} %){aim}; full-memory decode INT4 "
            f"{tps(i4):.0f} tok/s, FP8 {tps(f8):.0f} tok/s (cap {b.args.kv_max_streams} streams)")
    for x in r.get("drafter", {}).get("rows", []):
        log(f"drafter {x['streams']} stream(s): pass {x['pass_graph_ms']:.3f} ms = "
            f"{x['pass_vs_target_step']:.3f}x the target decode step "
            f"({x['target_step_ms']:.3f} ms at {x['target_context']}); depth-2 round "
            f"{x['depth2_round_ms']:.3f} ms")
    for e in r.get("errors", []):
        log(f"error in {e['part']}: {e['error']}")


# =============================================================================== main
PARTS = {"decode": part_decode, "verify": part_verify, "kv": part_kv, "drafter": part_drafter,
         "profile": part_profile}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSON and the PNGs")
    p.add_argument("--parts", default="decode,verify,kv,drafter",
                   help="comma list of " + ", ".join(PARTS) + " (or 'all')")
    p.add_argument("--tiny", action="store_true",
                   help="dry run: a tiny config, device cpu, the kernels' torch references")
    p.add_argument("--device", default=None, help="cuda (default) or cpu (default with --tiny)")
    p.add_argument("--block-size", type=int, default=64,
                   help="KV block size (the attention kernels were tuned at 64; the runtime's "
                        "default is 16: decode adds one 16x32k point at 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=480.0,
                   help="seconds from start after which no new measurement starts")
    p.add_argument("--reserve-gib", type=float, default=4.0,
                   help="memory kept free of KV in the kv part (activations, graph pools)")
    p.add_argument("--kv-max-streams", type=int, default=256,
                   help="cap on the full-memory batch (streams per step)")
    p.add_argument("--kv-budget-mib", type=float, default=6.0,
                   help="cache budget on CPU (--tiny), where free memory is not measured")
    p.add_argument("--no-eager", action="store_true", help="skip the eager timings")
    p.add_argument("--no-attrib", action="store_true", help="skip the per-class attribution")
    p.add_argument("--unfused-norms", action="store_true",
                   help="A/B: o_proj, then add_rms_norm (the model's tensor-parallel path)")
    p.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                   help="a plugin module setting for this run, e.g. moe_experts.ALIGN_TOKENS=64")
    p.add_argument("--lm-head-kernel", default="auto", choices=("auto", "mma", "wgmma"),
                   help="the NVFP4 LM head's kernel (EngineArgs.lm_head_kernel; default auto, "
                        "as the engine's: wgmma on sm_90)")
    p.add_argument("--attention-linear-kernel", default="mma", choices=("mma", "wgmma"),
                   help="the QKV and o_proj GEMVs' kernel (EngineArgs.attention_linear_kernel)")
    args = p.parse_args(argv)
    args.parts = list(PARTS) if args.parts == "all" else [x for x in args.parts.split(",") if x]
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        p.error(f"--parts: unknown {bad}; choose from {list(PARTS)}")
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device (use --tiny for a CPU dry run)")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    b = Bench(args)
    meta = b.results["meta"]
    meta.update(argv=sys.argv[1:], parts=args.parts, device=str(b.dev), tiny=args.tiny,
                torch=torch.__version__, python=platform.python_version(), block_size=b.bs,
                ring_blocks=b.ring, bandwidth_Bps=BW, aims=AIMS, config=b.cfg.to_dict(),
                lm_head_kernel=args.lm_head_kernel,
                attention_linear_kernel=args.attention_linear_kernel,
                started=time.strftime("%Y-%m-%d %H:%M:%S"))
    if b.cuda:
        props = torch.cuda.get_device_properties(b.dev)
        meta.update(gpu=props.name, gpu_total_bytes=props.total_memory)
        try:
            import triton
            meta["triton"] = triton.__version__
        except ImportError:
            meta["triton"] = None
    log(f"fullsize: parts {args.parts} on {b.dev} ({meta.get('gpu', 'cpu')}), budget "
        f"{args.budget:.0f} s, block {b.bs}")
    torch.set_grad_enabled(False)
    apply_settings(args.set)
    status = 0
    try:
        build_engine(b)
        b.model.head = b.model.head.with_kernel(args.lm_head_kernel)
        b.model.use_linear_kernel(args.attention_linear_kernel)
        log(f"LM head kernel: {b.model.head.kernel}, QKV / o_proj kernel: "
            f"{b.model.linear_kernel}")
        if args.unfused_norms:   # the model's own tensor-parallel path, with an identity hook
            b.model.all_reduce = lambda t: t
            log("norms: unfused (o_proj, then add_rms_norm: an identity all-reduce hook)")
        b.save()
        for name in args.parts:
            if not b.enough(15, f"part {name}"):
                continue
            t = time.monotonic()
            log(f"== {name} ({b.elapsed():.0f} s elapsed)")
            try:
                PARTS[name](b)
            except Exception as exc:    # noqa: BLE001 - record, go on with the next part
                status = 1
                tb = traceback.format_exc()
                b.results["errors"].append({"part": name, "error": repr(exc), "traceback": tb})
                log(f"ERROR in part {name}: {exc!r}\n{tb}")
            b.results.setdefault("part_seconds", {})[name] = round(time.monotonic() - t, 1)
            b.free()
            b.save()
    except Exception as exc:            # noqa: BLE001 - the engine build itself failed
        status = 1
        b.results["errors"].append({"part": "engine", "error": repr(exc),
                                    "traceback": traceback.format_exc()})
        log(f"ERROR building the engine: {exc!r}\n{traceback.format_exc()}")
    b.results["figures"] = figures(b)
    try:
        summary(b)
    except Exception as exc:            # noqa: BLE001 - the JSON is what counts
        log(f"(summary failed: {exc!r})")
    meta["total_s"] = round(b.elapsed(), 1)
    path = b.save()
    log(f"wrote {path} ({meta['total_s']} s)" + (" with errors" if status else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
