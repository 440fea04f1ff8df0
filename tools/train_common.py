"""What the target and drafter trainers share: atomic files, resumable training state
(safetensors + JSON, never pickles), the learning-rate schedule, the time budget, the token
stream of the corpus and seeded batches, logging.

Imports only the standard library, numpy, torch, safetensors and tokenizers (what the GPU
machine has), plus tqdm if present.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

STATE_DIR = "state"              # <run-dir>/state: the latest resumable state
STEP_TIME_MARGIN = 1.5           # stop when less than this many step times (plus save) is left
SAVE_RESERVE_S = 20.0            # seconds kept for the final save and export
CHAT_SPLIT_MAX_FRACTION = 0.3    # a chat-wrapped document's prompt is at most this share of it


# ---- atomic files ---------------------------------------------------------------------------
def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: Path):
    """Yield a temporary folder beside `path`; on success it replaces `path` (the old one is
    removed only after the new one is in place); on an exception nothing changes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        yield tmp
        tmp.chmod(0o755)
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- resumable state ------------------------------------------------------------------------
def save_state(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               meta: dict) -> None:
    """Write <run_dir>/state atomically: model.safetensors (every trainable parameter, fp32),
    optimizer.safetensors (AdamW moments and step per parameter name) and state.json (`meta`:
    step, tokens seen, arguments)."""
    from safetensors.torch import save_file
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    index = {id(p): n for n, p in named}
    opt = {}
    for p, st in optimizer.state.items():
        for k, v in st.items():
            opt[f"{index[id(p)]}::{k}"] = v.detach().reshape(v.shape).contiguous().cpu()
    with atomic_dir(Path(run_dir) / STATE_DIR) as tmp:
        save_file({n: p.detach().contiguous().cpu() for n, p in named}, tmp / "model.safetensors")
        save_file(opt, tmp / "optimizer.safetensors")
        (tmp / "state.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


def load_state(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
               ) -> dict | None:
    """Restore what `save_state` wrote (None if there is no state). Parameters are copied in
    place; the optimizer state goes through `optimizer.load_state_dict` (which places each
    tensor as the optimizer expects). Raises KeyError naming a missing tensor."""
    from safetensors.torch import load_file
    d = Path(run_dir) / STATE_DIR
    if not (d / "state.json").is_file():
        return None
    params = load_file(d / "model.safetensors")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():
        for n, p in named:
            if n not in params:
                raise KeyError(f"{d / 'model.safetensors'}: tensor {n!r} missing")
            p.copy_(params[n])
    opt = load_file(d / "optimizer.safetensors")
    sd = optimizer.state_dict()
    order = {id(p): i for i, p in enumerate(q for g in optimizer.param_groups
                                            for q in g["params"])}
    state = {}
    for n, p in named:
        keys = {k.split("::", 1)[1]: v for k, v in opt.items() if k.split("::", 1)[0] == n}
        if keys:
            state[order[id(p)]] = keys
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
    return json.loads((d / "state.json").read_text())


# ---- schedule and budget --------------------------------------------------------------------
def lr_at(step: int, base: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine from `base` to `base * min_ratio` at
    step `total`, flat after it. `step` counts from 0."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


PROCESS_T0 = time.monotonic()    # budgets count from here (setup and tokenization included)


class Budget:
    """Wall-clock budget in seconds (None: unlimited) of one call, counted from this module's
    import (the start of the process, near enough); `stop(step_s)` says whether another step
    of about `step_s` seconds plus the final save and export still fits."""

    def __init__(self, seconds: float | None):
        self.seconds, self.t0 = seconds, PROCESS_T0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def stop(self, step_s: float) -> bool:
        if self.seconds is None:
            return False
        return self.elapsed() + STEP_TIME_MARGIN * step_s + SAVE_RESERVE_S > self.seconds


class Logger:
    """Prints one line per record and appends it as JSON to <run_dir>/log.jsonl."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, **rec) -> None:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in rec.items()), flush=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


# ---- data -----------------------------------------------------------------------------------
def _file_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def tokenize_corpus(corpus_file: Path, tokenizer_dir: Path, cache_dir: Path | None,
                    chat_fraction: float = 0.0, seed: int = 0) -> np.ndarray:
    """The token stream of a `*.jsonl.xz` corpus file: per document <s> ids </s>, in file
    order; a seeded `chat_fraction` of prose documents is wrapped as
    <s>[INST]first paragraphs[/INST]rest</s> so the chat template is in distribution.

    Returns uint16 [N] (int32 if the vocabulary exceeds 65,536 ids). Cached as .npy in
    `cache_dir` under a key of the corpus, tokenizer and options (np.load without pickles).
    """
    tok_file = Path(tokenizer_dir) / "tokenizer.json"
    key = f"{_file_digest([corpus_file, tok_file])}-{chat_fraction}-{seed}"
    cache = None if cache_dir is None else Path(cache_dir) / f"{corpus_file.name}.{key}.npy"
    if cache is not None and cache.is_file():
        return np.load(cache, allow_pickle=False)
    import lzma
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tok_file))
    tok.encode_special_tokens = True  # text is text (as KolibriTokenizer.encode)
    ids = {t: tok.token_to_id(t) for t in ("<s>", "</s>", "[INST]", "[/INST]")}
    with lzma.open(corpus_file, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    rng = np.random.default_rng(seed)
    pieces: list[tuple[str, str | None]] = []
    for d in docs:
        chat = d["lang"] != "code" and rng.random() < chat_fraction
        pieces.append(_chat_split(d["text"]) if chat else (d["text"], None))
    enc = tok.encode_batch([p[0] for p in pieces], add_special_tokens=False)
    rest = tok.encode_batch([p[1] or "" for p in pieces], add_special_tokens=False)
    out: list[list[int]] = []
    for (_, answer), e, r in zip(pieces, enc, rest):
        if answer is None:
            out.append([ids["<s>"], *e.ids, ids["</s>"]])
        else:
            out.append([ids["<s>"], ids["[INST]"], *e.ids, ids["[/INST]"], *r.ids, ids["</s>"]])
    dtype = np.uint16 if tok.get_vocab_size() <= 65536 else np.int32
    arr = np.fromiter((t for doc in out for t in doc), dtype=dtype)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npy")
        np.save(tmp, arr, allow_pickle=False)
        os.replace(tmp, cache)
    return arr


def _chat_split(text: str) -> tuple[str, str]:
    """(prompt, answer): the paragraphs up to CHAT_SPLIT_MAX_FRACTION of the text, the rest."""
    paras = text.split("\n\n")
    limit, acc, k = CHAT_SPLIT_MAX_FRACTION * len(text), 0, 0
    while k < len(paras) - 1 and (k == 0 or acc + len(paras[k]) <= limit):
        acc += len(paras[k]) + 2
        k += 1
    return "\n\n".join(paras[:k]), "\n\n".join(paras[k:])


def batch_at(tokens: np.ndarray, step: int, batch: int, length: int, seed: int
             ) -> torch.Tensor:
    """int64 [batch, length] windows of the token stream at seeded random offsets: a pure
    function of (seed, step), so a resumed run sees exactly the batches it would have seen."""
    if len(tokens) <= length:
        raise ValueError(f"the token stream ({len(tokens)} tokens) is shorter than one window "
                         f"of {length}")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - length, size=batch)
    idx = starts[:, None] + np.arange(length)[None, :]
    return torch.from_numpy(tokens[idx].astype(np.int64))


def _plain(v):
    """A logged value as JSON: tensors to floats, lists element-wise, 4 significant digits."""
    if isinstance(v, (list, tuple)):
        return [round(float(x), 4) for x in v]
    return float(v) if isinstance(v, torch.Tensor) else v


def run_steps(args, meta: dict, one_step, on_eval, on_save, log: Logger) -> Budget:
    """The loop both trainers share. Until meta["step"] reaches args.steps, the time budget
    (args.time_budget_s) or args.max_steps_this_call: lr from `lr_at`; `one_step(step, lr)`
    -> (loss tensor, {name: logged value}, tokens of the step); log every args.log_every,
    `on_eval()` -> {name: value} every args.eval_every, `on_save()` every args.save_every.
    Losses stay on the device between log lines (no per-step host sync). Updates `meta`
    (step, tokens) in place; returns the call's Budget."""
    budget, step_s, done = Budget(args.time_budget_s), 0.0, 0
    acc, n, t_log = 0.0, 0, time.monotonic()
    while meta["step"] < args.steps:
        if budget.stop(step_s) or (args.max_steps_this_call is not None
                                   and done >= args.max_steps_this_call):
            break
        t0 = time.monotonic()
        lr = lr_at(meta["step"], args.lr, args.warmup, args.steps, args.min_lr_ratio)
        loss, extra, ntok = one_step(meta["step"], lr)
        acc, n, done = acc + loss.detach(), n + 1, done + 1
        meta["step"], meta["tokens"] = meta["step"] + 1, meta["tokens"] + ntok
        if meta["step"] % args.log_every == 0 or meta["step"] == args.steps:
            log.log(step=meta["step"], loss=float(acc) / n, lr=lr,
                    **{k: _plain(v) for k, v in extra.items()},
                    tok_per_s=n * ntok / (time.monotonic() - t_log), elapsed_s=budget.elapsed())
            acc, n, t_log = 0.0, 0, time.monotonic()
        if meta["step"] % args.eval_every == 0:
            log.log(step=meta["step"], **on_eval())
        if meta["step"] % args.save_every == 0:
            on_save()
        if done > 1:  # the call's first step includes compilation and warm-up
            dt = time.monotonic() - t0
            step_s = 0.9 * step_s + 0.1 * dt if step_s else dt
    return budget
