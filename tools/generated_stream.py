"""The self-distillation stream in drafter training (`train_drafter.py --generated`): its
held-out tail and batches that mix its windows with the corpus's. The stream is
`gen_self_distill.py`'s: uint16 token ids, per sample <s> prompt continuation </s>."""

from __future__ import annotations

import numpy as np
import torch

from train_common import batch_at

GEN_SEED_OFFSET = 1    # --generated windows: batch seed = --seed + this (apart from the corpus's)
GENERATED_HOLDOUT = 0.05   # tail share of --generated kept out of training, for validation


def load_generated(args) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(training part, held-out tail of GENERATED_HOLDOUT) of the `gen_self_distill.py` token
    stream args.generated ((None, None) without one); sets args.generated_fraction's default
    (0.5). FileNotFoundError names a missing file, ValueError a --generated-fraction without
    --generated or outside [0, 1], or a stream whose held-out tail is shorter than a window."""
    if args.generated is None:
        if args.generated_fraction is not None:
            raise ValueError("--generated-fraction: only with --generated")
        return None, None
    if args.generated_fraction is None:
        args.generated_fraction = 0.5
    if not 0.0 <= args.generated_fraction <= 1.0:
        raise ValueError(f"--generated-fraction: must be in [0, 1], got {args.generated_fraction}")
    path = args.generated
    if not path.is_file():
        raise FileNotFoundError(f"--generated: {path} does not exist (tools/gen_self_distill.py)")
    arr = np.load(path, allow_pickle=False)
    cut = int(len(arr) * (1 - GENERATED_HOLDOUT))
    if len(arr) - cut < args.seq_len + 1:
        raise ValueError(f"--generated: {path} holds {len(arr)} tokens; its held-out "
                         f"{GENERATED_HOLDOUT:.0%} needs one window of --seq-len + 1 = "
                         f"{args.seq_len + 1}, i.e. at least "
                         f"{int((args.seq_len + 1) / GENERATED_HOLDOUT) + 1} tokens")
    return arr[:cut], arr[cut:]


def train_batch(train_tok: np.ndarray, gen: np.ndarray | None, step: int, args) -> torch.Tensor:
    """int64 [batch_size, seq_len + 1] windows of step `step`: round(--generated-fraction x
    batch_size) rows from the generated stream (when given), the rest from the corpus; a pure
    function of (seed, step) as `batch_at`."""
    n = args.seq_len + 1
    g = round(args.generated_fraction * args.batch_size) if gen is not None else 0
    parts = []
    if g < args.batch_size:
        parts.append(batch_at(train_tok, step, args.batch_size - g, n, args.seed))
    if g:
        parts.append(batch_at(gen, step, g, n, args.seed + GEN_SEED_OFFSET))
    return torch.cat(parts)
