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

_M32 = 0xFFFFFFFF


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


def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """(a * b) mod 2**32 for int64 a in [0, 2**32), without overflowing int64."""
    lo, hi = a & 0xFFFF, a >> 16
    return (lo * b + (((hi * b) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xorshift-multiply); int64 in, int64 in [0, 2**32) out."""
    x = _mul32(x ^ (x >> 16), 0x7FEB352D)
    x = _mul32(x ^ (x >> 15), 0x846CA68B)
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise keyed by (seed, output position, token id).

    seeds: int64 [N] (the 64-bit seed as a signed int64 bit pattern); positions: int64 [N],
    the output position n >= 0. Returns fp32 [N, vocab_size]; the same (seed, n) row is
    bit-identical wherever and with whatever batch it is computed (on one device type).
    """
    s = seeds.long()
    key = _mix32((s & _M32) ^ 0x9E3779B9)
    key = _mix32(key ^ ((s >> 32) & _M32))
    key = _mix32(key ^ (positions.long() & _M32))
    v = torch.arange(vocab_size, device=seeds.device, dtype=torch.long)
    bits = _mix32(_mul32(v[None, :], 0x9E3779B1) ^ key[:, None])
    bits = _mix32(bits ^ 0x5BD1E995)
    u = ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))  # in (0, 1), exact in fp32
    return -torch.log(-torch.log(u))


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


def sample(logits: torch.Tensor, params: list[SamplingParams], positions: torch.Tensor
           ) -> torch.Tensor:
    """Choose one token per row.

    logits: fp32 [N, V]; params: N SamplingParams; positions: int64 [N], each row's output
    position n (0 = the first generated token). Returns int64 [N]. Greedy rows take argmax
    (ties to the lower id); sampled rows take argmax(filter(logits / T) + gumbel(seed, n)).
    """
    logits = logits.float()
    out = torch.argmax(logits, dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        idx = torch.tensor(rows, device=logits.device)
        sel = [params[i] for i in rows]
        temp = torch.tensor([p.temperature for p in sel], device=logits.device)
        scaled = logits[idx] / temp[:, None]
        scaled = filter_logits(
            scaled, torch.tensor([p.top_k for p in sel], device=logits.device),
            torch.tensor([p.top_p for p in sel], device=logits.device, dtype=torch.float32))
        seeds = torch.tensor([_as_int64(p.resolved_seed) for p in sel], device=logits.device)
        noise = gumbel_noise(seeds, positions[idx], logits.shape[-1])
        out[idx] = torch.argmax(scaled + noise, dim=-1)
    return out


def _as_int64(seed: int) -> int:
    """The 64-bit seed's bit pattern as a signed int64."""
    return seed - 2**64 if seed >= 2**63 else seed
