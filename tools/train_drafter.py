#!/usr/bin/env python3
r"""Train a `KolibriBlockDrafter` for a (mini) Kolibri target with the seed's recipe.

The recipe is the seed's (`shared/seeds/000_18e372fd3ab55920.txt`, `shared/spec/block-drafter.md`
§Training target):

    PYTHONPATH=. python tools/train_drafter.py --corpus corpus --target runs/target/export \
        --run-dir runs/drafter --out runs/drafter/export [--time-budget-s 300]

Fine-tuning a drafter (its config and draft vocabulary kept) on the target's own continuations
(`tools/gen_self_distill.py`), as the shipped one was made (`checkpoints/kolibri-mini/README.md`;
on a CPU add --device cpu and small --batch-size / --seq-len / --steps):

    PYTHONPATH=. python tools/train_drafter.py --corpus corpus/sub \
        --target checkpoints/kolibri-mini/target --init-from checkpoints/kolibri-mini/drafter \
        --generated runs/gen/train.npy --generated-fraction 0.75 --copy-miss-weight 1 \
        --lr 3e-4 --steps 2500 --warmup 50 --run-dir runs/drafter-sd --out runs/drafter-sd/export

The generated stream's last 5 % (`generated_stream.GENERATED_HOLDOUT`) is held out for
`valid_gen_agree`, so the stream needs at least (seq_len + 1) / 0.05 tokens.

- target-distilled: the frozen target runs on corpus windows; the loss is the KL divergence
  from the target's distribution restricted to the draft vocabulary (renormalised) to the
  drafter's, at every anchor of the window, row j weighted 0.8^j;
- taps: the target's residual stream after the drafter config's target_layer_ids (default
  n-6, n-3, n-1 of n layers, as 44/47/49 of 50);
- predecessor token of row j >= 1: the target's argmax at p + j;
- draft vocabulary: the target's most frequent argmax tokens over corpus windows (ties by
  data frequency, then id), chosen once per run and kept in <run-dir>/draft_vocab.json;
- AdamW (0.9, 0.95), linear warm-up then cosine to --min-lr-ratio, gradient clip 0.5; the
  seed's 2e-4 -> 2e-5 fine-tuned a drafter started from an earlier one, this one starts from
  scratch and small, hence 1e-3 -> 1e-4 by default;
- windows of --seq-len 1,024 (the seed: 2,048; the mini target was trained on 1,024), every
  anchor of a window in one pass (`tools/fast_drafter.py`), each seeing its whole left context.
Resumable exactly like `tools/train_target.py` (<run-dir>/state, --time-budget-s). The export
is `KolibriBlockDrafter.save_pretrained` (config.json, model.safetensors, draft_vocab.json),
what `python build.py --drafter` takes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import gpu_env  # noqa: E402,F401
import fast_drafter  # noqa: E402
import fast_target  # noqa: E402
from generated_stream import load_generated, train_batch  # noqa: E402
from train_common import (Logger, atomic_dir, batch_at, load_state, run_steps,  # noqa: E402
                          save_state, tokenize_corpus, write_bytes_atomic)

from kolibri_trt.drafter import (DrafterConfig, DrafterTarget, KolibriBlockDrafter,  # noqa: E402
                                 ServingDefaults)
from kolibri_trt.model.reference import KolibriForCausalLM  # noqa: E402

INIT_STD = 0.02
VOCAB_SEED = 20_000      # batch seed of the draft-vocabulary count (apart from training's)
EVAL_SEED = 30_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--corpus", type=Path, default=ROOT / "corpus",
      help="folder with train.jsonl.xz and valid.jsonl.xz (tools/corpus.py, corpus_subset.py)")
    a("--target", type=Path, required=True, help="target checkpoint (with tokenizer)")
    a("--run-dir", type=Path, default=ROOT / "runs" / "drafter")
    a("--out", type=Path, help="export folder (default <run-dir>/export)")
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu",
      help="cuda or cpu (default: cuda when there is one)")
    a("--layers", type=int, default=4)
    a("--heads", type=int, default=2)
    a("--kv-heads", type=int, default=2)
    a("--head-dim", type=int, default=128)
    a("--intermediate", type=int, default=512)
    a("--rank", type=int, default=64, help="predecessor and spine rank")
    a("--block-size", type=int, default=4)
    a("--context-window", type=int, default=2048)
    a("--target-layer-ids", type=int, nargs="+")
    a("--draft-vocab-size", type=int, default=8192)
    a("--vocab-tokens", type=int, default=2_000_000, help="tokens scored for the draft vocab")
    a("--seq-len", type=int, default=1024)
    a("--batch-size", type=int, default=16)
    a("--steps", type=int, default=7000)
    a("--lr", type=float, default=1e-3)
    a("--min-lr-ratio", type=float, default=0.1)
    a("--warmup", type=int, default=100)
    a("--weight-decay", type=float, default=0.0)
    a("--clip", type=float, default=0.5)
    a("--position-decay", type=float, default=0.8)
    a("--seed", type=int, default=0)
    a("--save-every", type=int, default=250)
    a("--log-every", type=int, default=25)
    a("--eval-every", type=int, default=500)
    a("--eval-batches", type=int, default=4)
    a("--time-budget-s", type=float)
    a("--max-steps-this-call", type=int)
    a("--export-every-call", action="store_true")
    a("--compile", action="store_true", help="torch.compile the drafter's loss")
    a("--cache-dir", type=Path)
    a("--init-from", type=Path, help="start from this drafter checkpoint (its config and draft "
      "vocabulary; the seed fine-tuned so with --lr 2e-4, i.e. 2e-4 -> 2e-5)")
    a("--generated", type=Path, help="token stream of the target's own continuations "
      "(`tools/gen_self_distill.py`); its last 5 %% is kept for validation")
    a("--generated-fraction", type=float,
      help="share of each batch's windows taken from --generated, the rest from the corpus "
           "(default 0.5; only with --generated)")
    a("--copy-miss-weight", type=float, default=0.0,
      help="extra loss weight of the anchors where copy drafting misses (`copy_miss_mask`): "
           "weight 1 + this, 1 elsewhere (0: the seed's recipe)")
    return p


def drafter_config(target_cfg, args, vocab_size: int) -> DrafterConfig:
    n, h = target_cfg.num_hidden_layers, target_cfg.hidden_size
    ids = args.target_layer_ids or sorted({max(0, n - 6), max(0, n - 3), n - 1})
    return DrafterConfig(
        hidden_size=h, target_hidden_size=h, target_layer_ids=tuple(ids),
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        intermediate_size=args.intermediate, block_size=args.block_size,
        context_window=args.context_window, predecessor_rank=args.rank, spine_rank=args.rank,
        draft_vocab_size=vocab_size, serving_defaults=ServingDefaults(2, "fp8", "nvfp4"))


def init_weights(drafter: torch.nn.Module, seed: int) -> None:
    """Matrices N(0, INIT_STD^2) except the spine's and predecessor's U (zero: both start as
    no-ops, spec: the spine is zero-initialised); norms 1; mask row N(0, INIT_STD^2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 1 and name != "mask_embedding":
                p.fill_(1.0)
            elif name.endswith("U.weight"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)


def autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def target_pass(target, ids: torch.Tensor, tap_layers, device):
    """Frozen target on ids [B, T]: taps [B, T, n_taps, H] and logits [B, T, V]."""
    with autocast(device):
        h, taps = fast_target.residual_stream(target, ids, tap_layers)
        out = fast_target.logits(target, h)
        return (torch.stack(taps, dim=2) if taps else None), out


@torch.no_grad()
def choose_draft_vocab(target, tokens, size: int, n_tokens: int, args, device) -> list[int]:
    """The `size` ids the target predicts (argmax) most often on `n_tokens` corpus tokens,
    most frequent first (ties: data frequency, then lower id); EOS always included."""
    v = target.config.vocab_size
    pred, data = torch.zeros(v, dtype=torch.long), torch.zeros(v, dtype=torch.long)
    per = args.batch_size * args.seq_len
    for i in range(max(1, -(-n_tokens // per))):
        ids = batch_at(tokens, i, args.batch_size, args.seq_len, VOCAB_SEED).to(device)
        _, logits = target_pass(target, ids, (), device)
        pred += torch.bincount(logits.argmax(-1).flatten().cpu(), minlength=v)
        data += torch.bincount(ids.flatten().cpu(), minlength=v)
    order = sorted(range(v), key=lambda t: (-int(pred[t]), -int(data[t]), t))[:size]
    for eos in target.config.eos_token_ids:
        if eos not in order:
            order[-1] = eos
    return order


@torch.no_grad()
def copy_miss_mask(ids: torch.Tensor) -> torch.Tensor:
    """bool [B, T] for windows ids int64 [B, T + 1]: anchor p's copy lookup misses, i.e. the
    bigram (ids[p], ids[p + 1]) that ends at the anchor's next token occurs nowhere earlier
    in the window (`CopyIndex` with min_ngram 2 hits iff it does: a longer match contains
    it). What the engine's copy+drafter mode hands the drafter (the window stands in for the
    stream's whole context)."""
    b, t = ids.shape[0], ids.shape[1] - 1
    v = int(ids.max()) + 1
    key = ids[:, :-1] * v + ids[:, 1:] + torch.arange(b, device=ids.device)[:, None] * v * v
    _, inv = torch.unique(key.flatten(), return_inverse=True)
    pos = torch.arange(b * t, device=ids.device)
    first = torch.full((int(inv.max()) + 1,), b * t, dtype=torch.long, device=ids.device)
    first.scatter_reduce_(0, inv, pos, "amin")
    return (first[inv] == pos).view(b, t)


def distill_loss(logits: torch.Tensor, teacher: torch.Tensor, decay: float,
                 weights: torch.Tensor | None = None, miss: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """KL(teacher || drafter) per row j, weighted decay^j and normalised by the weights.

    logits: [B, T, Bk, Vd] drafter logits of anchors 0..T-1; teacher: [B, T, Vd] the target's
    logits restricted to the draft vocabulary; row j of anchor p is scored against the
    teacher at p + 1 + j (anchors past the window's end are skipped); weights: fp32 [B, T]
    per anchor (None: the plain mean); miss: bool [B, T] (`copy_miss_mask`), for the
    agreement on those anchors. Returns (loss fp32 scalar, top-1 agreement per row, the same
    on the `miss` anchors (empty without): fp32 scalars, no grad).
    """
    t, blk = logits.shape[1], logits.shape[2]
    total, wsum, agree, agree_miss = logits.new_zeros((), dtype=torch.float32), 0.0, [], []
    for j in range(blk):
        s = logits[:, : t - 1 - j, j].float()
        tt = teacher[:, 1 + j:].float()
        logp_t = F.log_softmax(tt, dim=-1)
        kl = (logp_t.exp() * (logp_t - F.log_softmax(s, dim=-1))).sum(-1)
        if weights is None:
            kl = kl.mean()
        else:
            w = weights[:, : t - 1 - j]
            kl = (kl * w).sum() / w.sum()
        total = total + decay ** j * kl
        wsum += decay ** j
        hit = (s.argmax(-1) == tt.argmax(-1)).float()
        agree.append(hit.mean().detach())
        if miss is not None:
            m = miss[:, : t - 1 - j].float()
            agree_miss.append(((hit * m).sum() / m.sum().clamp(min=1)).detach())
    return total / wsum, agree, agree_miss


def drafter_loss(drafter, taps, next_ids, pred, teacher, decay: float, weights=None,
                 miss=None):
    """`distill_loss` of the drafter's block rows for every anchor (what --compile compiles).
    taps [B, T, n_taps, H]; next_ids, pred int64 [B, T]; teacher [B, T, Vd]; weights,
    miss: `distill_loss`'s."""
    x = fast_drafter.block_states(drafter, taps, next_ids)
    logits, _ = fast_drafter.block_logits(drafter, x, pred)
    return distill_loss(logits, teacher, decay, weights, miss)


def step_loss(drafter, target, ids, args, device, loss_fn=drafter_loss):
    """Loss, per-row agreement and per-row agreement where copy drafting misses, of one
    batch of windows ids [B, T + 1]; anchors weighted 1 + --copy-miss-weight there."""
    c, t = drafter.config, args.seq_len
    taps, tlogits = target_pass(target, ids[:, :t], c.target_layer_ids, device)
    pred = tlogits.argmax(-1)
    teacher = tlogits[..., drafter.draft_vocab]
    miss = copy_miss_mask(ids[:, :t + 1])
    weights = 1.0 + args.copy_miss_weight * miss.float() if args.copy_miss_weight else None
    with autocast(device):
        return loss_fn(drafter, taps, ids[:, 1:t + 1], pred, teacher, args.position_decay,
                       weights, miss)


@torch.no_grad()
def evaluate(drafter, target, tokens, args, device) -> dict[str, list[float]]:
    """Mean top-1 agreement per block row over --eval-batches fixed validation windows: at
    every anchor ("all") and where copy drafting misses ("copy_miss")."""
    rows = None
    for i in range(args.eval_batches):
        ids = batch_at(tokens, i, args.batch_size, args.seq_len + 1, EVAL_SEED).to(device)
        _, agree, agree_miss = step_loss(drafter, target, ids, args, device)
        a = torch.stack([torch.stack(agree), torch.stack(agree_miss)]).cpu()
        rows = a if rows is None else rows + a
    return {k: [round(float(x) / args.eval_batches, 4) for x in r]
            for k, r in zip(("all", "copy_miss"), rows)}


def export(drafter: KolibriBlockDrafter, out: Path, meta: dict, args=None) -> None:
    """bf16 drafter checkpoint (config.json, model.safetensors, draft_vocab.json) into `out`;
    config extra: training steps and tokens (a fine-tuned one's: its start's plus this run's,
    then fine_tuning_steps and copy_miss_weight)."""
    import dataclasses
    extra = dict(drafter.config.extra)
    steps, tokens = meta["step"], meta["tokens"]
    if args is not None and args.init_from is not None:
        steps += int(extra.get("training_steps", 0))
        tokens += int(extra.get("training_tokens", 0))
        extra.update(fine_tuning_steps=meta["step"], copy_miss_weight=args.copy_miss_weight)
    if args is not None and args.generated is not None:
        extra.update(generated_fraction=args.generated_fraction)
    cfg = dataclasses.replace(drafter.config, extra={
        **extra, "training_steps": steps, "training_tokens": tokens})
    ref = KolibriBlockDrafter(cfg, drafter.target, drafter.draft_vocab.cpu())
    ref.load_state_dict({k: v.detach().to("cpu", torch.bfloat16)
                         for k, v in drafter.state_dict().items()})
    with atomic_dir(out) as tmp:
        ref.to(torch.bfloat16).save_pretrained(tmp)


def setup(args, device):
    """Target, token streams, draft vocabulary (chosen once per run dir) and a fresh drafter,
    or (--init-from) the given drafter with its config and draft vocabulary, in fp32."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = KolibriForCausalLM.from_pretrained(args.target, dtype=dtype, device=device)
    cache = args.cache_dir or args.run_dir / "cache"
    train_tok = tokenize_corpus(args.corpus / "train.jsonl.xz", args.target, cache, 0.0, 0)
    valid_tok = tokenize_corpus(args.corpus / "valid.jsonl.xz", args.target, cache, 0.0, 0)
    if args.init_from is not None:
        drafter = KolibriBlockDrafter.from_pretrained(args.init_from, target=target,
                                                      dtype=torch.float32).requires_grad_(True)
    else:
        vocab_file = args.run_dir / "draft_vocab.json"
        if vocab_file.is_file():
            vocab = json.loads(vocab_file.read_text())
        else:
            size = min(args.draft_vocab_size, target.config.vocab_size)
            vocab = choose_draft_vocab(target, train_tok, size, args.vocab_tokens, args, device)
            write_bytes_atomic(vocab_file, json.dumps(vocab).encode())
        cfg = drafter_config(target.config, args, len(vocab))
        drafter = KolibriBlockDrafter(cfg, DrafterTarget.of(target),
                                      torch.tensor(vocab, dtype=torch.long))
        init_weights(drafter, args.seed)
    drafter.to(device).train()
    drafter.draft_vocab = drafter.draft_vocab.to(device)
    drafter.head_slice = target.lm_head.weight[drafter.draft_vocab].detach()
    return target, drafter, train_tok, valid_tok


def train(args) -> dict:
    """Run (or resume) drafter training within the budget; returns the final meta. ValueError
    / FileNotFoundError for a bad --generated / --generated-fraction, before anything loads."""
    gen_train, gen_valid = load_generated(args)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    target, drafter, train_tok, valid_tok = setup(args, device)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=args.weight_decay, fused=device.type == "cuda")
    meta = load_state(args.run_dir, drafter, opt) or {"step": 0, "tokens": 0}
    if meta.get("config", drafter.config.to_dict()) != drafter.config.to_dict():
        raise ValueError(f"{args.run_dir}/state was made for another drafter config")
    meta["config"], meta["steps_total"] = drafter.config.to_dict(), args.steps
    log = Logger(args.run_dir)
    log.log(event="start", step=meta["step"], params=sum(p.numel() for p in drafter.parameters()),
            draft_vocab=drafter.config.draft_vocab_size, device=str(device))

    def valid() -> dict:
        out = {"valid_agree": evaluate(drafter, target, valid_tok, args, device)}
        if gen_valid is not None:
            out["valid_gen_agree"] = evaluate(drafter, target, gen_valid, args, device)
        return out

    loss_fn = torch.compile(drafter_loss) if args.compile else drafter_loss
    if args.init_from is not None and meta["step"] == 0:     # the starting point's agreement
        log.log(step=0, **valid())

    def one_step(step: int, lr: float):
        for g in opt.param_groups:
            g["lr"] = lr
        ids = train_batch(train_tok, gen_train, step, args).to(device)
        loss, agree, agree_miss = step_loss(drafter, target, ids, args, device, loss_fn)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, {"grad_norm": gnorm, "agree": agree, "agree_miss": agree_miss}, \
            ids[:, :-1].numel()

    budget = run_steps(args, meta, one_step,
                       valid,
                       lambda: save_state(args.run_dir, drafter, opt, meta), log)
    save_state(args.run_dir, drafter, opt, meta)
    finished = meta["step"] >= args.steps
    if finished or args.export_every_call:
        meta.update(valid())
        export(drafter, args.out or args.run_dir / "export", meta, args)
    log.log(event="stop", step=meta["step"], finished=finished,
            valid_agree=meta.get("valid_agree"), valid_gen_agree=meta.get("valid_gen_agree"),
            elapsed_s=budget.elapsed())
    return meta


def main(argv: list[str] | None = None) -> int:
    meta = train(build_parser().parse_args(argv))
    return 0 if meta["step"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
