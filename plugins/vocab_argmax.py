"""Greedy pick over a vocabulary slice in one kernel: out[n] = vocab[argmax_v logits[n, v]].

The drafter's heads score a draft vocabulary (a slice of the target's, `draft_vocab.json`,
shared/spec/block-drafter.md) and propose the target id of the best one: torch needs two launches
(argmax, then index_select into the draft vocabulary) and writes the pick into a strided column
of the round's drafts. Here one program per row walks V in fixed BLOCK chunks in order, keeping
a running (max, first index); max and first-index are exact, so the pick is torch.argmax's
(ties to the lowest index, NaN counts as the largest, an all -inf row gives 0) and a row's
result never depends on the other rows.
"""

from __future__ import annotations

import torch

from ._argmax import argmax_step
from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, tl

BLOCK = 4096        # scores per loop step (num_warps 8: 16 per thread)
NUM_WARPS = 8


@jit
def _vocab_argmax_kernel(logits_ptr, vocab_ptr, out_ptr, stride, out_stride, V,
                         BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    row = logits_ptr + n * stride
    lanes = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.zeros([], tl.int32)
    nan_i = tl.zeros([], tl.int32) + V           # first NaN, V = none
    for start in range(0, V, BLOCK):
        offs = start + lanes
        m = offs < V
        val = tl.load(row + offs, mask=m, other=0.0).to(tl.float32)   # bf16 -> fp32: exact
        best, best_i, nan_i = argmax_step(val, offs, m, V, best, best_i, nan_i)
    idx = tl.where(nan_i < V, nan_i, best_i)
    tl.store(out_ptr + n * out_stride, tl.load(vocab_ptr + idx))


def vocab_argmax_ref(logits: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference: ``vocab[torch.argmax(logits, -1)]`` (int64 [N])."""
    return vocab.index_select(0, torch.argmax(logits, dim=-1))


@torch.library.custom_op(f"{NAMESPACE}::vocab_argmax", mutates_args=("out",))
def _vocab_argmax_op(logits: torch.Tensor, vocab: torch.Tensor, out: torch.Tensor) -> None:
    if kernel_path(logits, "vocab_argmax") == "ref":
        out.copy_(vocab_argmax_ref(logits, vocab))
        return
    _launch(logits, vocab, out, False)


@_vocab_argmax_op.register_fake
def _(logits, vocab, out):
    return None


def _launch(logits, vocab, out, interpret, block=BLOCK):
    N, V = logits.shape
    if N:
        launch(_vocab_argmax_kernel, (N,), logits, vocab, out, logits.stride(0), out.stride(0),
               V, BLOCK=block, num_warps=NUM_WARPS, interpret=interpret)


def vocab_argmax(logits, vocab, out=None, interpret: bool = False) -> torch.Tensor:
    """The target id of each row's best-scoring vocabulary entry.

    Args:
        logits: bf16 or fp32 [N, V] (last dim stride 1; row stride free), V >= 1.
        vocab: int64 [V] contiguous: the id of each scored entry (a draft vocabulary).
        out: int64 [N] (any stride, e.g. a column of a drafts tensor) written in place, or
            None (a new tensor).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        out: int64 [N], vocab[argmax_v logits[n, v]], ties and NaN as torch.argmax.
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: shared/spec/block-drafter.md (argmax ties to the lower draft-vocabulary index).
    """
    check_tensor("logits", logits, (torch.bfloat16, torch.float32), (None, None),
                 contiguous=False)
    N, V = logits.shape
    if V < 1 or V >= 2**31:
        raise ValueError(f"logits: shape {tuple(logits.shape)}, need 1 <= V < 2**31")
    if V > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits: last dim must have stride 1, strides {logits.stride()}")
    check_tensor("vocab", vocab, torch.int64, (V,), logits.device)
    if out is None:
        out = torch.empty((N,), dtype=torch.int64, device=logits.device)
    check_tensor("out", out, torch.int64, (N,), logits.device, contiguous=False)
    if interpret:
        _launch(logits, vocab, out, True)
    else:
        torch.ops.kolibri_plugins.vocab_argmax(logits, vocab, out)
    return out
