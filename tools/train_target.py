#!/usr/bin/env python3
"""Train a mini Kolibri-1 target (the structure of `shared/spec/kolibri-1.md`: sliding and
NoPE full layers 4:1, QK-norm, GQA with head_dim 128, MoE with a shared expert) on the corpus:

    PYTHONPATH=. python tools/train_target.py --corpus corpus --tokenizer corpus/tokenizer \
        --run-dir runs/target --out runs/target/export [--time-budget-s 500] [--steps N]

Resumable: <run-dir>/state (fp32 weights, AdamW moments, step; safetensors + JSON) is written
atomically every --save-every steps and when --time-budget-s runs out, and the next call
continues from it bit for bit (batches are a pure function of seed and step). When the last
step is done (or with --export-every-call) the bf16 checkpoint is written to --out with
`KolibriForCausalLM.save_pretrained` plus the tokenizer files, ready for
`python build.py --model <out> --drafter <drafter>`. The training forward is
`tools/fast_target.py` (same loss as the reference, tested); bf16 autocast on CUDA.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import gpu_env  # noqa: E402,F401  (kolibri_trt_plugins importable from ./plugins)
import fast_target  # noqa: E402
from train_common import (Logger, atomic_dir, batch_at, load_state, run_steps,  # noqa: E402
                          save_state, tokenize_corpus)

from kolibri_trt.config import FULL, SLIDING, KolibriConfig  # noqa: E402
from kolibri_trt.model.reference import KolibriForCausalLM  # noqa: E402

INIT_STD = 0.02
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--corpus", type=Path, default=ROOT / "corpus")
    a("--tokenizer", type=Path, help="default: <corpus>/tokenizer")
    a("--run-dir", type=Path, default=ROOT / "runs" / "target")
    a("--out", type=Path, help="export folder of the bf16 checkpoint (default <run-dir>/export)")
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a("--layers", type=int, default=10)
    a("--hidden", type=int, default=256)
    a("--heads", type=int, default=4)
    a("--kv-heads", type=int, default=2)
    a("--head-dim", type=int, default=128, help="keep 128 (the Hadamard KV plan needs it)")
    a("--experts", type=int, default=16)
    a("--top-k", type=int, default=2)
    a("--moe-intermediate", type=int, default=32)
    a("--shared-intermediate", type=int, default=128)
    a("--sliding-window", type=int, default=513)
    a("--seq-len", type=int, default=1024)
    a("--batch-size", type=int, default=64, help="windows per step")
    a("--steps", type=int, default=5000, help="total steps of the run (the cosine's length)")
    a("--lr", type=float, default=3e-3)
    a("--min-lr-ratio", type=float, default=0.1)
    a("--warmup", type=int, default=200)
    a("--weight-decay", type=float, default=0.1)
    a("--clip", type=float, default=1.0)
    a("--seed", type=int, default=0)
    a("--chat-fraction", type=float, default=0.15,
      help="share of prose documents wrapped as [INST]..[/INST].. (chat template)")
    a("--save-every", type=int, default=500)
    a("--log-every", type=int, default=50)
    a("--eval-every", type=int, default=1000)
    a("--eval-batches", type=int, default=8)
    a("--time-budget-s", type=float, help="stop, save and exit before this many seconds")
    a("--max-steps-this-call", type=int, help="stop after this many steps in this call")
    a("--compile", action="store_true", help="torch.compile the loss function")
    a("--export-every-call", action="store_true", help="export even if the run is not done")
    a("--cache-dir", type=Path, help="token cache (default <run-dir>/cache)")
    return p


def target_config(args, vocab_size: int) -> KolibriConfig:
    """The mini target's config from the command line (every field checked by KolibriConfig)."""
    return KolibriConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        layer_types=tuple(FULL if i % 5 == 4 else SLIDING for i in range(args.layers)),
        sliding_window=args.sliding_window, max_position_embeddings=8192,
        num_experts=args.experts, num_experts_per_tok=args.top_k,
        moe_intermediate_size=args.moe_intermediate,
        shared_expert_intermediate_size=args.shared_intermediate,
        bos_token_id=1, eos_token_id=2, pad_token_id=11, torch_dtype="bfloat16")


def vocab_size(tokenizer_dir: Path) -> int:
    """Ids of the tokenizer in `tokenizer_dir`, control tokens included."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(True)


def init_weights(model: torch.nn.Module, seed: int, num_layers: int) -> None:
    """Seeded init: matrices N(0, INIT_STD^2), output projections (o_proj, down_proj) scaled
    by 1/sqrt(2 * layers), norms 1. Independent of the global RNG."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            std = INIT_STD / (2 * num_layers) ** 0.5 if name.endswith(
                ("o_proj.weight", "down_proj.weight")) else INIT_STD
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def make_optimizer(model, args, device) -> torch.optim.AdamW:
    """AdamW (0.9, 0.95); weight decay on matrices except the embedding."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed_tokens" in n]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=args.lr,
                             betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def evaluate(model, tokens, args, device) -> float:
    """Mean validation loss (nats/token) over --eval-batches fixed windows (eager: a compiled
    loss would compile again for no-grad mode)."""
    total = 0.0
    for i in range(args.eval_batches):
        b = batch_at(tokens, i, args.batch_size, args.seq_len + 1, seed=10_000 + args.seed)
        b = b.to(device)
        with autocast(device):
            total += float(fast_target.lm_loss(model, b[:, :-1], b[:, 1:]))
    return total / args.eval_batches


def export(model: KolibriForCausalLM, out: Path, tokenizer: Path, meta: dict) -> None:
    """bf16 checkpoint + tokenizer files into `out`, atomically (the old `out` is replaced)."""
    cfg = model.config.replace(extra={**model.config.extra, "training_steps": meta["step"],
                                      "training_tokens": meta["tokens"]})
    ref = KolibriForCausalLM(cfg)
    ref.load_state_dict({k: v.detach().to("cpu", torch.bfloat16)
                         for k, v in model.state_dict().items()})
    with atomic_dir(out) as tmp:
        ref.to(torch.bfloat16).save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            shutil.copy(tokenizer / name, tmp / name)


def setup(args, device):
    """Token streams, the model (fresh or restored from <run-dir>/state), the optimizer and
    the run's meta."""
    tokenizer = args.tokenizer or args.corpus / "tokenizer"
    cache = args.cache_dir or args.run_dir / "cache"
    train_tok = tokenize_corpus(args.corpus / "train.jsonl.xz", tokenizer, cache,
                                args.chat_fraction, args.seed)
    valid_tok = tokenize_corpus(args.corpus / "valid.jsonl.xz", tokenizer, cache, 0.0, 0)
    cfg = target_config(args, vocab_size(tokenizer))
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 router GEMM
    model = KolibriForCausalLM(cfg)
    init_weights(model, args.seed, cfg.num_hidden_layers)
    model.to(device).train()
    opt = make_optimizer(model, args, device)
    meta = load_state(args.run_dir, model, opt) or {"step": 0, "tokens": 0}
    if meta.get("config", cfg.to_dict()) != cfg.to_dict():
        raise ValueError(f"{args.run_dir}/state was made for another model config; use a new "
                         "--run-dir or the same options")
    meta["config"], meta["steps_total"] = cfg.to_dict(), args.steps
    return model, opt, meta, train_tok, valid_tok, tokenizer


def train(args) -> dict:
    """Run (or resume) training within the budget; returns the final state's meta."""
    device = torch.device(args.device)
    model, opt, meta, train_tok, valid_tok, tokenizer = setup(args, device)
    log = Logger(args.run_dir)
    log.log(event="start", step=meta["step"], params=sum(p.numel() for p in model.parameters()),
            train_tokens=len(train_tok), device=str(device))
    loss_fn = torch.compile(fast_target.lm_loss) if args.compile else fast_target.lm_loss

    def one_step(step: int, lr: float):
        for g in opt.param_groups:
            g["lr"] = lr
        batch = batch_at(train_tok, step, args.batch_size, args.seq_len + 1, args.seed)
        batch = batch.to(device, non_blocking=True)
        with autocast(device):
            loss = loss_fn(model, batch[:, :-1], batch[:, 1:])
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, {"grad_norm": gnorm}, batch[:, 1:].numel()

    budget = run_steps(args, meta, one_step,
                       lambda: {"valid_loss": evaluate(model, valid_tok, args, device)},
                       lambda: save_state(args.run_dir, model, opt, meta), log)
    save_state(args.run_dir, model, opt, meta)
    finished = meta["step"] >= args.steps
    if finished or args.export_every_call:
        meta["valid_loss"] = evaluate(model, valid_tok, args, device)
        export(model, args.out or args.run_dir / "export", tokenizer, meta)
    log.log(event="stop", step=meta["step"], finished=finished, valid_loss=meta.get("valid_loss"),
            elapsed_s=budget.elapsed())
    return meta


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    meta = train(args)
    return 0 if meta["step"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
