"""Sampling that depends only on (request seed, output position): position-keyed Gumbel-max.

The random choice for a request at output position n uses Gumbel noise that is a pure hash of
(seed, n, token id), so a request yields the same tokens alone or in a batch, with or without
speculative drafting (the property the lossless verification of seed 000 relies on). Greedy
(temperature 0) is argmax with ties to the lower token id. Every operation is row-wise, so a
row's result never depends on the other rows of the batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from kolibri_trt_plugins.gumbel_argmax import gumbel_argmax, gumbel_noise_ref, mix32

_M32 = 0xFFFFFFFF
# True: sampled rows go through the fused kernel plugins/gumbel_argmax.py (one launch instead of
# about 50 on CUDA); False: the torch ops (the same tokens). On the H200 (2026-11-30,
# bench/results/h200-2026-11-30c): gpu_check gumbel passed (same tokens as the torch ops), and
# T = 0.8 decode of the trained mini went from 729 to 1233 tok/s (chat, speculative off).
FUSED_SAMPLER = True


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling options (vLLM's names).

    max_tokens: tokens to generate at most (>= 1). temperature: 0 = greedy, else > 0.
    top_p in (0, 1]; top_k: 0 = off, else >= 1. seed: 64-bit int; None draws one at random.
    stop: strings that end generation (not included in the text); stop_token_ids: ids that
    end it; ignore_eos: keep going past EOS.

    Raises:
        ValueError: naming the field, for any value out of range or of the wrong type.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    resolved_seed: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ValueError(f"SamplingParams.{name}: {why}, got {getattr(self, name)!r}")

        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        check(is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "must be an int >= 1")
        check(isinstance(self.temperature, (int, float)) and not isinstance(self.temperature, bool)
              and 0 <= self.temperature < float("inf"), "temperature", "must be a number >= 0")
        check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, "top_p",
              "must be in (0, 1]")
        check(is_int(self.top_k) and self.top_k >= 0, "top_k", "must be an int >= 0 (0 = off)")
        check(self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**64), "seed",
              "must be None or an int in [0, 2**64)")
        object.__setattr__(self, "stop", tuple([self.stop] if isinstance(self.stop, str)
                                               else self.stop))
        check(all(isinstance(s, str) and s for s in self.stop), "stop",
              "must be non-empty strings")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        check(all(is_int(i) and i >= 0 for i in self.stop_token_ids), "stop_token_ids",
              "must be ints >= 0")
        check(isinstance(self.ignore_eos, bool), "ignore_eos", "must be a bool")
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little")
        object.__setattr__(self, "resolved_seed", seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _mix32_int(x: int) -> int:
    """`gumbel_argmax.mix32` on one Python int in [0, 2**32) (the same bits)."""
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """The 32-bit seed part of :func:`row_key` (seed as an unsigned or signed 64-bit pattern):
    row_key(seed, n) = mix32(seed_key(seed) ^ n). The drafter's keyed picks take it per stream
    (kolibri_trt_plugins.vocab_argmax.KeyedRows)."""
    return _mix32_int(_mix32_int((seed & _M32) ^ 0x9E3779B9) ^ ((seed >> 32) & _M32))


def row_key(seed: int, position: int) -> int:
    """The 32-bit key of (64-bit seed, output position): the per-row part of :func:`gumbel_noise`,
    computed on the host (seed as an unsigned or signed 64-bit pattern; position >= 0)."""
    return _mix32_int(seed_key(seed) ^ (position & _M32))


def gumbel_noise_keyed(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise for rows with keys int64 [N] (:func:`row_key`): fp32 [N, V].
    The hash and noise are defined once, in `kolibri_trt_plugins.gumbel_argmax` (torch path)."""
    return gumbel_noise_ref(keys, vocab_size)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise keyed by (seed, output position, token id).

    seeds: int64 [N] (the 64-bit seed as a signed int64 bit pattern); positions: int64 [N],
    the output position n >= 0. Returns fp32 [N, vocab_size]; the same (seed, n) row is
    bit-identical wherever and with whatever batch it is computed (on one device type).
    """
    s = seeds.long()
    key = mix32((s & _M32) ^ 0x9E3779B9)
    key = mix32(key ^ ((s >> 32) & _M32))
    key = mix32(key ^ (positions.long() & _M32))
    return gumbel_noise_keyed(key, vocab_size)


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p set to -inf (ties keep the lower id).

    logits: fp32 [N, V] (already divided by temperature); top_k: int64 [N] (0 = off);
    top_p: fp32 [N]. top-p keeps the smallest prefix of the sorted distribution whose mass
    reaches top_p (the token that crosses it included).
    """
    sorted_l, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, logits.shape[-1])[:, None]
    drop = rank >= k
    probs = torch.softmax(sorted_l.masked_fill(drop, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)  # 1.0 keeps all despite rounding
    drop_orig = torch.zeros_like(drop).scatter(-1, order, drop)
    return logits.masked_fill(drop_orig, float("-inf"))


def sample(logits: torch.Tensor, params: list[SamplingParams],
           positions: torch.Tensor | list[int]) -> torch.Tensor:
    """Choose one token per row.

    logits: fp32 [N, V]; params: N SamplingParams; positions: each row's output position n
    (0 = the first generated token), a list of ints or an int64 tensor [N]. Returns int64 [N].
    Greedy rows take argmax (ties to the lower id); sampled rows take
    argmax(filter(logits / T) + gumbel(seed, n)). Sampled rows cost one host-to-device upload
    (keys and per-row options together); the top-k / top-p filter (a sort) runs only when some
    row asks for it. With FUSED_SAMPLER the noise, the division by T and the argmax run as one
    kernel (`kolibri_trt_plugins.gumbel_argmax`; its torch reference on CPU, the same bits).
    """
    logits = logits.float()
    out = torch.argmax(logits, dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    pos = positions.tolist() if isinstance(positions, torch.Tensor) else list(positions)
    sel = [params[i] for i in rows]
    n = len(rows)
    ints = torch.tensor([row_key(p.resolved_seed, pos[i]) for i, p in zip(rows, sel)]
                        + [p.top_k for p in sel] + rows, dtype=torch.long)
    floats = torch.tensor([p.temperature for p in sel] + [p.top_p for p in sel],
                          dtype=torch.float64)
    packed = torch.cat([ints, floats.view(torch.long)]).to(logits.device)
    keys, top_k, idx, fl = packed[:n], packed[n:2 * n], packed[2 * n:3 * n], packed[3 * n:]
    fl = fl.view(torch.float64).float()
    temp, top_p = fl[:n], fl[n:]
    rows_l = logits if n == logits.shape[0] else logits[idx]
    filtered = any(p.top_k > 0 or p.top_p < 1 for p in sel)
    if FUSED_SAMPLER and not filtered:
        chosen = gumbel_argmax(rows_l, temp, keys)        # divides by T itself
    elif FUSED_SAMPLER:
        chosen = gumbel_argmax(filter_logits(rows_l / temp[:, None], top_k, top_p),
                               torch.ones_like(temp), keys)   # x / 1 is exact
    else:
        scaled = rows_l / temp[:, None]
        if filtered:
            scaled = filter_logits(scaled, top_k, top_p)
        chosen = torch.argmax(scaled + gumbel_noise_keyed(keys, logits.shape[-1]), dim=-1)
    if n == logits.shape[0]:
        return chosen
    out[idx] = chosen
    return out
