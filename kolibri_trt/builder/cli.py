"""`python build.py --target gb10|h100|h200|cpu [--model DIR --drafter DIR] [--out DIR]
[--weights fp8-nvfp4|bf16] [--kv-cache hadamard-int4|int4|fp8|bf16] [--tp N] [--force]
[--export-onnx] [--report] [--triton-repo DIR]`: build an engine folder; the engine path is
printed last, on stdout. --triton-repo also writes a Triton Inference Server model repository
serving it; --tp N shards the target for N tensor-parallel ranks."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .recipes import RECIPES_DIR


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="build.py", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--target", required=True,
                   help="build target from build/targets.toml: gb10, h100, h200 or cpu")
    p.add_argument("--model", type=Path, help="Kolibri-1 checkpoint folder (default: the "
                   "embedded trained mini pair, checkpoints/kolibri-mini)")
    p.add_argument("--drafter", type=Path, help="block-drafter checkpoint folder (required "
                   "with --model)")
    p.add_argument("--out", type=Path, help="engine folder (default: engines/<target>)")
    p.add_argument("--weights", help="weight recipe from build/weights.toml: fp8-nvfp4 "
                   "(default) or bf16")
    p.add_argument("--kv-cache", help="KV plan from build/kv-cache.toml: hadamard-int4 "
                   "(default), int4 (no rotation), fp8 or bf16")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism: write the target as N per-rank shards "
                   "(target/rank0 .. rank{N-1}); load with LLM(..., tensor_parallel_size=N)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--export-onnx", action="store_true",
                   help="also write the drafter's one-pass graph to <out>/onnx/")
    p.add_argument("--report", action="store_true",
                   help="print stage timings and a full-size (77B) estimate to stderr")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--triton-repo", type=Path, metavar="DIR",
                   help="also write a Triton Inference Server model repository (model "
                   "'kolibri', Python backend, streaming) for the engine into DIR; "
                   "`kolibri-trt triton-repo` does it for an existing engine with more options")
    p.add_argument("--recipes", type=Path, default=RECIPES_DIR, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the build; exit status 0, or 2 with `build.py: error: ...` on stderr."""
    args = build_parser().parse_args(argv)
    from .engine import BuildOptions, build_engine

    opts = BuildOptions(target=args.target, model=args.model, drafter=args.drafter,
                        out=args.out, weights=args.weights, kv_cache=args.kv_cache,
                        force=args.force, export_onnx=args.export_onnx,
                        progress=not args.no_progress, recipes_dir=args.recipes,
                        tp_size=args.tp)
    if args.triton_repo is not None and args.triton_repo.exists() and not args.force:
        print(f"build.py: error: --triton-repo: output folder {args.triton_repo} exists; pass "
              "--force to replace it", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        out, stats = build_engine(opts)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"build.py: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("build.py: interrupted; nothing was written", file=sys.stderr)
        return 130
    if args.triton_repo is not None:
        from ..serving.triton_repo import ModelOptions, write_model_repository
        try:
            repo = write_model_repository(args.triton_repo, ModelOptions(out), force=args.force)
        except (ValueError, FileNotFoundError, FileExistsError) as exc:
            print(f"build.py: error: --triton-repo: {exc} (the engine {out} was built)",
                  file=sys.stderr)
            return 2
        print(f"wrote Triton model repository {repo}", file=sys.stderr)
    if args.report:
        from .estimate import format_report
        calib = stats.stages.get("calibrate")
        tokens = _calibration_tokens(out)
        print(format_report(stats, tokens) if calib else "no calibration ran", file=sys.stderr)
    print(f"built {out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out)
    return 0


def _calibration_tokens(out: Path) -> int:
    import json
    manifest = json.loads((out / "manifest.json").read_text())
    return (manifest.get("calibration") or {}).get("tokens", 0)
