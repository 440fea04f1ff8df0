"""The drafter heads' pick over a vocabulary slice in one kernel: out[n] = vocab[argmax_v s_v].

The drafter's heads score a draft vocabulary (a slice of the target's, `draft_vocab.json`,
shared/spec/block-drafter.md) and propose the target id of the best one: torch needs two launches
(argmax, then index_select into the draft vocabulary) and writes the pick into a strided column
of the round's drafts. Here one program per row walks V in fixed BLOCK chunks in order, keeping
a running (max, first index); max and first-index are exact, so the pick is torch.argmax's
(ties to the lowest index, NaN counts as the largest, an all -inf row gives 0) and a row's
result never depends on the other rows.

Greedy rows score s_v = logits[n, v]. Keyed rows (`KeyedRows`, a sampled stream's drafts) score
s_v = logits[n, v] / T + g(key_n, vocab[v]) with the target sampler's own position-keyed Gumbel
noise (plugins/gumbel_argmax.py: the same hash of (row key, target token id)), key_n the key of
the output position the draft stands at. The target keeps the token argmax_u(l_u / T + g(key_n,
u)) (kolibri_trt/sampling.py), so where the drafter's distribution is close to the target's the
two argmaxes agree far more often than the drafter's greedy token equals the target's sample
(Gumbel-max coupling: both are samples of their softmax under shared noise). Verification is
unchanged, so the output is too: only which drafts are proposed changes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._argmax import argmax_step
from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, tl
from ._common import pdl_enter, pdl_release
from .gumbel_argmax import _gumbel, _hash_bits, _mix32, gumbel_noise_ref, mix32

BLOCK = 4096        # scores per loop step (num_warps 8: 16 per thread)
NUM_WARPS = 8
_M32 = 0xFFFFFFFF


class KeyedRows(NamedTuple):
    """Where each row's noise comes from (all int64 tensors on the logits' device):
    slots [N] (any stride): the row's entry in the per-slot tables; positions [N] (any
    stride): its position; temperature fp32 [Z] (0 = a greedy row); seed_key int64 [Z]: the
    32-bit seed part of the sampler's row key (kolibri_trt.sampling.seed_key); base int64 [Z]:
    the row's output position is positions[n] - base[slots[n]]."""

    slots: torch.Tensor
    positions: torch.Tensor
    temperature: torch.Tensor
    seed_key: torch.Tensor
    base: torch.Tensor


@jit
def _vocab_argmax_kernel(logits_ptr, vocab_ptr, out_ptr, stride, out_stride, V,
                         slot_ptr, pos_ptr, temp_ptr, seed_ptr, base_ptr, slot_stride, pos_stride,
                         BLOCK: tl.constexpr, KEYED: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    row = logits_ptr + n * stride
    lanes = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.zeros([], tl.int32)
    nan_i = tl.zeros([], tl.int32) + V           # first NaN, V = none
    t = tl.full([], 0.0, tl.float32)
    key = tl.zeros([], tl.uint32)
    if KEYED:
        z = tl.load(slot_ptr + n * slot_stride)
        t = tl.load(temp_ptr + z)
        at = tl.load(pos_ptr + n * pos_stride) - tl.load(base_ptr + z)   # output position
        key = _mix32(tl.load(seed_ptr + z).to(tl.uint32) ^ at.to(tl.uint32))
    for start in range(0, V, BLOCK):
        offs = start + lanes
        m = offs < V
        val = tl.load(row + offs, mask=m, other=0.0).to(tl.float32)   # bf16 -> fp32: exact
        if KEYED:
            if t > 0:
                ids = tl.load(vocab_ptr + offs, mask=m, other=0).to(tl.int32)
                val = tl.math.div_rn(val, t) + _gumbel(_hash_bits(ids, key))
        best, best_i, nan_i = argmax_step(val, offs, m, V, best, best_i, nan_i)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    idx = tl.where(nan_i < V, nan_i, best_i)
    tl.store(out_ptr + n * out_stride, tl.load(vocab_ptr + idx))


def keyed_scores_ref(logits: torch.Tensor, vocab: torch.Tensor, keyed: KeyedRows
                     ) -> torch.Tensor:
    """fp32 [N, V]: each row's scores as the kernel forms them (module docstring)."""
    s = logits.float()
    z = keyed.slots.long()
    t = keyed.temperature[z]
    at = (keyed.positions - keyed.base[z]) & _M32
    key = mix32((keyed.seed_key[z] & _M32) ^ at)
    noise = gumbel_noise_ref(key, vocab.shape[0], ids=vocab)
    sampled = (t > 0)[:, None]
    return torch.where(sampled, s / torch.where(t > 0, t, 1.0)[:, None] + noise, s)


def vocab_argmax_ref(logits: torch.Tensor, vocab: torch.Tensor,
                     keyed: KeyedRows | None = None) -> torch.Tensor:
    """Plain-torch reference: ``vocab[torch.argmax(scores, -1)]`` (int64 [N]); scores are the
    logits, or `keyed_scores_ref`'s."""
    s = logits if keyed is None else keyed_scores_ref(logits, vocab, keyed)
    return vocab.index_select(0, torch.argmax(s, dim=-1))


@torch.library.custom_op(f"{NAMESPACE}::vocab_argmax", mutates_args=("out",))
def _vocab_argmax_op(logits: torch.Tensor, vocab: torch.Tensor, out: torch.Tensor) -> None:
    if kernel_path(logits, "vocab_argmax") == "ref":
        out.copy_(vocab_argmax_ref(logits, vocab))
        return
    _launch(logits, vocab, out, None, False)


@_vocab_argmax_op.register_fake
def _(logits, vocab, out):
    return None


@torch.library.custom_op(f"{NAMESPACE}::vocab_argmax_keyed", mutates_args=("out",))
def _vocab_argmax_keyed_op(logits: torch.Tensor, vocab: torch.Tensor, out: torch.Tensor,
                           slots: torch.Tensor, positions: torch.Tensor,
                           temperature: torch.Tensor, seed_key: torch.Tensor,
                           base: torch.Tensor) -> None:
    keyed = KeyedRows(slots, positions, temperature, seed_key, base)
    if kernel_path(logits, "vocab_argmax") == "ref":
        out.copy_(vocab_argmax_ref(logits, vocab, keyed))
        return
    _launch(logits, vocab, out, keyed, False)


@_vocab_argmax_keyed_op.register_fake
def _(logits, vocab, out, slots, positions, temperature, seed_key, base):
    return None


def _launch(logits, vocab, out, keyed, interpret, block=BLOCK):
    N, V = logits.shape
    if not N:
        return
    if keyed is None:
        k = (vocab,) * 5 + (0, 0)          # unused pointers (KEYED False)
    else:
        k = tuple(keyed) + (keyed.slots.stride(0), keyed.positions.stride(0))
    launch(_vocab_argmax_kernel, (N,), logits, vocab, out, logits.stride(0), out.stride(0), V,
           *k, BLOCK=block, KEYED=keyed is not None, num_warps=NUM_WARPS,
           enable_fp_fusion=False, interpret=interpret)


def _check_keyed(keyed: KeyedRows, n: int, device) -> None:
    for name in ("slots", "positions"):
        check_tensor(f"keyed.{name}", getattr(keyed, name), torch.int64, (n,), device,
                     contiguous=False)
    check_tensor("keyed.temperature", keyed.temperature, torch.float32, (None,), device)
    z = keyed.temperature.shape[0]
    check_tensor("keyed.seed_key", keyed.seed_key, torch.int64, (z,), device)
    check_tensor("keyed.base", keyed.base, torch.int64, (z,), device)


def vocab_argmax(logits, vocab, out=None, keyed: KeyedRows | None = None,
                 interpret: bool = False) -> torch.Tensor:
    """The target id of each row's best-scoring vocabulary entry.

    Args:
        logits: bf16 or fp32 [N, V] (last dim stride 1; row stride free), V >= 1.
        vocab: int64 [V] contiguous: the id of each scored entry (a draft vocabulary).
        out: int64 [N] (any stride, e.g. a column of a drafts tensor) written in place, or
            None (a new tensor).
        keyed: None (every row greedy), or `KeyedRows`: rows whose slot's temperature is > 0
            score logits / T + the sampler's Gumbel noise at their output position (module
            docstring); slots must index the tables (not checked on the device).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        out: int64 [N], vocab[argmax_v scores[n, v]], ties and NaN as torch.argmax.
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: shared/spec/block-drafter.md (argmax ties to the lower draft-vocabulary index);
    the Gumbel-max trick and the sampler's noise (plugins/gumbel_argmax.py).
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
    if keyed is not None:
        _check_keyed(keyed, N, logits.device)
    if interpret:
        _launch(logits, vocab, out, keyed, True)
    elif keyed is None:
        torch.ops.kolibri_plugins.vocab_argmax(logits, vocab, out)
    else:
        torch.ops.kolibri_plugins.vocab_argmax_keyed(logits, vocab, out, *keyed)
    return out
