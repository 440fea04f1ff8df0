"""`kolibri-trt` command line: generation on an engine, fixtures, the reference loop.

    kolibri-trt generate --engine DIR (--prompt TEXT | --prompts-file JSONL) [--per-category N]
        [--limit N] [--max-tokens N] [--temperature T] [--seed S] [--stream] [--speculative MODE]
        [--max-num-seqs N]
    kolibri-trt serve --engine DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY]
        [--speculative MODE] [--max-num-seqs N] [--max-model-len N] [--kv-cache-memory BYTES]
        [--max-waiting N] [--served-model-name NAME]
    kolibri-trt make-fixtures [--out DIR] [--seed N] [--force]
    kolibri-trt reference-generate --model DIR (--prompt TEXT | --prompts-file JSONL)
        [--per-category N] [--limit N] [--max-tokens N] [--temperature T] [--seed S]
    kolibri-trt triton-repo --engine DIR --out DIR [--speculative MODE] [--max-num-seqs N]
        [--max-model-len N] [--kv-cache-memory BYTES] [--max-waiting N] [--instances N]
        [--model-name NAME] [--force]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import time
from pathlib import Path

from .fixtures import DEFAULT_DIR


def _make_fixtures(args: argparse.Namespace) -> int:
    from .fixtures import make_fixtures

    t0 = time.perf_counter()
    target, drafter = make_fixtures(args.out, seed=args.seed, force=args.force)
    print(f"wrote {target} and {drafter} in {time.perf_counter() - t0:.1f} s")
    return 0


def _prompts(args: argparse.Namespace) -> list:
    from .prompts import Prompt, load_prompts

    if args.prompt is not None:
        return [Prompt("cli", "custom", args.prompt)]
    return load_prompts(args.prompts_file, per_category=args.per_category, limit=args.limit)


def _reference_generate(args: argparse.Namespace) -> int:
    import torch

    from .model.reference import KolibriForCausalLM
    from .reference_generate import reference_generate
    from .sampling import SamplingParams
    from .tokenizer import KolibriTokenizer

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed)
    model = KolibriForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    tok = KolibriTokenizer.from_pretrained(args.model)
    total_tokens, total_time = 0, 0.0
    for p in _prompts(args):
        ids = tok.apply_chat_template([{"role": "user", "content": p.text}])
        t0 = time.perf_counter()
        out = reference_generate(model, ids, params)
        dt = time.perf_counter() - t0
        total_tokens, total_time = total_tokens + len(out.token_ids), total_time + dt
        head = p.text[:70].replace("\n", " ")
        print(f"[{p.category}] {head!r} ({len(ids)} prompt tokens)")
        print(f"  -> {tok.decode(out.token_ids)!r}")
        print(f"     {len(out.token_ids)} tokens, finish_reason={out.finish_reason}, "
              f"{len(out.token_ids) / dt:.1f} tokens/s")
    if total_time:
        print(f"reference loop (no KV cache): {total_tokens} tokens in {total_time:.1f} s, "
              f"{total_tokens / total_time:.1f} tokens/s")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .runtime import LLM
    from .sampling import SamplingParams

    llm = LLM(args.engine, speculative=args.speculative, max_num_seqs=args.max_num_seqs,
              device=args.device, enforce_eager=args.enforce_eager,
              acceptance_method=args.acceptance_method, draft_sampling=args.draft_sampling,
              cpu_affinity=args.cpu_affinity, lm_head_kernel=args.lm_head_kernel,
              attention_linear_kernel=args.attention_linear_kernel)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed)
    prompts = _prompts(args)
    convs = [[{"role": "user", "content": p.text}] for p in prompts]
    ids = [llm.tokenizer.apply_chat_template(c) for c in convs]
    t0 = time.perf_counter()
    if args.stream:
        outs = []
        for p, prompt_ids in zip(prompts, ids):
            print(f"[{p.category}] ", end="", flush=True)
            for delta in llm.stream(prompt_ids, params):
                print(delta, end="", flush=True)
            print()
        n = None
    else:
        outs = llm.generate(ids, params)
        for p, out in zip(prompts, outs):
            print(f"[{p.category}] {p.text[:70].replace(chr(10), ' ')!r}")
            print(f"  -> {out.text!r}")
            print(f"     {len(out.token_ids)} tokens, finish_reason={out.finish_reason}")
        n = sum(len(o.token_ids) for o in outs)
    dt = time.perf_counter() - t0
    if n is not None:
        print(f"{len(prompts)} requests, {n} tokens in {dt:.2f} s: {n / dt:.1f} tokens/s "
              f"(max_num_seqs={args.max_num_seqs}, speculative={args.speculative})")
    else:
        n = llm.engine.stats.tokens
        print(f"{len(prompts)} requests streamed one after another, {n} tokens in {dt:.2f} s: "
              f"{n / dt:.1f} tokens/s (speculative={args.speculative})")
    if args.speculative != "off":
        print(f"speculative decoding: {llm.engine.stats.summary()}")
    return 0


def _triton_repo(args: argparse.Namespace) -> int:
    from .serving.triton_repo import ModelOptions, write_model_repository

    options = ModelOptions(args.engine, speculative=args.speculative,
                           max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                           kv_cache_memory=args.kv_cache_memory, max_waiting=args.max_waiting)
    out = write_model_repository(args.out, options, model_name=args.model_name,
                                 instances=args.instances, force=args.force)
    print(f"wrote {out / args.model_name} (config.pbtxt, 1/model.py) for engine "
          f"{options.engine_dir.resolve()}, speculative={args.speculative}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .runtime.engine import EngineArgs
    from .serving.openai_server import serve

    api_key = args.api_key if args.api_key is not None else os.environ.get("KOLIBRI_TRT_API_KEY")
    if not _is_loopback(args.host) and not api_key:
        print(f"kolibri-trt serve: warning: listening on {args.host} without an API key",
              file=sys.stderr)
    engine_args = EngineArgs(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                             kv_cache_memory=args.kv_cache_memory,
                             cpu_affinity=args.cpu_affinity,
                             lm_head_kernel=args.lm_head_kernel,
                             attention_linear_kernel=args.attention_linear_kernel)
    serve(args.engine, host=args.host, port=args.port, api_key=api_key or None,
          speculative=args.speculative, engine_args=engine_args, max_waiting=args.max_waiting,
          model_name=args.served_model_name)
    return 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _serve_parser(sub) -> None:
    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, "
                        "streaming, /metrics)")
    sv.add_argument("--engine", type=Path, required=True, help="folder written by build.py")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on "
                    "/v1 routes (default: $KOLIBRI_TRT_API_KEY, else no key)")
    sv.add_argument("--speculative", default="copy+drafter",
                    help="off | copy | drafter | copy+drafter")
    sv.add_argument("--max-num-seqs", type=int, default=8)
    sv.add_argument("--max-model-len", type=int, default=4096)
    sv.add_argument("--kv-cache-memory", type=int, default=1 << 30, help="bytes")
    sv.add_argument("--max-waiting", type=int, default=128,
                    help="requests waiting for admission before new ones get 503")
    sv.add_argument("--served-model-name", default=None,
                    help="the `model` requests must name (default: the engine folder's name)")
    _engine_option_args(sv)
    sv.set_defaults(func=_serve)


def _engine_option_args(p) -> None:
    p.add_argument("--cpu-affinity", default=None, metavar="CPUS",
                   help="pin the engine's host thread: gpu-local (the CPUs next to the GPU) or "
                        "a CPU list such as 0-3,8 (default: as it is)")
    p.add_argument("--lm-head-kernel", default="auto", choices=("auto", "mma", "wgmma"),
                   help="the NVFP4 LM head's kernel: mma (nvfp4_gemv), wgmma (nvfp4_wgmma, "
                        "Hopper only; faster from 16 rows) or auto (wgmma on Hopper at one "
                        "rank, else mma; the default)")
    p.add_argument("--attention-linear-kernel", default="mma", choices=("mma", "wgmma"),
                   help="the FP8 QKV and o_proj GEMVs' kernel: mma (fp8_gemv) or wgmma "
                        "(fp8_wgmma, Hopper only; faster from 16 rows)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kolibri-trt", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate with a built engine")
    gen.add_argument("--engine", type=Path, required=True, help="folder written by build.py")
    _prompt_args(gen)
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--speculative", default="copy+drafter",
                     help="off | copy | drafter | copy+drafter")
    gen.add_argument("--max-num-seqs", type=int, default=8)
    gen.add_argument("--device", default="cpu", help="cpu | cuda[:N] (CUDA: plugins/ kernels)")
    gen.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs")
    gen.add_argument("--acceptance-method", default="position-keyed",
                     help="position-keyed | rejection_sampler (sampled drafts)")
    gen.add_argument("--draft-sampling", default="coupled",
                     help="coupled | greedy: how the drafter picks a sampled stream's drafts "
                          "(coupled: with the target sampler's own noise)")
    _engine_option_args(gen)
    gen.set_defaults(func=_generate)
    _serve_parser(sub)

    fx = sub.add_parser("make-fixtures", help="write a scaled-down target + drafter with seeded random "
                        "weights (test fixtures)")
    fx.add_argument("--out", type=Path, default=DEFAULT_DIR)
    fx.add_argument("--seed", type=int, default=0)
    fx.add_argument("--force", action="store_true", help="replace an existing folder")
    fx.set_defaults(func=_make_fixtures)

    rg = sub.add_parser("reference-generate", help="plain reference loop (no cache, no drafts)")
    rg.add_argument("--model", type=Path, required=True, help="Kolibri-1 checkpoint folder")
    _prompt_args(rg)
    rg.set_defaults(func=_reference_generate)

    tr = sub.add_parser("triton-repo", help="write a Triton Inference Server model repository "
                        "(Python backend, streaming) serving a built engine")
    tr.add_argument("--engine", type=Path, required=True, help="folder written by build.py")
    tr.add_argument("--out", type=Path, required=True, help="model repository folder")
    tr.add_argument("--speculative", default="copy+drafter",
                    help="off | copy | drafter | copy+drafter")
    tr.add_argument("--max-num-seqs", type=int, default=8, help="streams decoded together")
    tr.add_argument("--max-model-len", type=int, default=4096)
    tr.add_argument("--kv-cache-memory", type=int, default=1 << 30, help="bytes")
    tr.add_argument("--max-waiting", type=int, default=256,
                    help="queued requests beyond the batch before new ones get UNAVAILABLE")
    tr.add_argument("--instances", type=int, default=1, help="model instances (one engine each)")
    tr.add_argument("--model-name", default="kolibri")
    tr.add_argument("--force", action="store_true", help="replace an existing folder")
    tr.set_defaults(func=_triton_repo)
    return parser


def _prompt_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompts-file", type=Path, help="Spec-Bench / HumanEval JSONL(.gz)")
    p.add_argument("--per-category", type=int, default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, NotImplementedError) as exc:
        print(f"kolibri-trt {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
