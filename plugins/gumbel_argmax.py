"""Position-keyed Gumbel-max sampling in one kernel: one token id per row.

Maths (the Gumbel-max trick: argmax_v(l_v + g_v) with g_v i.i.d. standard Gumbel draws a sample
of softmax(l)). The noise is a pure hash of (row key, token id), defined here once: the torch
functions below (mix32, gumbel_noise_ref) are what kolibri_trt/sampling.py samples with, and the
kernel computes the same bits. All hash arithmetic is on 32-bit unsigned words
(multiplies wrap mod 2**32; shifts are logical):
    mix32(x)  = x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16
    bits      = mix32(mix32((v * 0x9E3779B1) ^ key) ^ 0x5BD1E995)
    u         = (fp32(bits >> 9) + 0.5) * 2**-23            (exact: u in [2**-24, 1 - 2**-24])
    g         = -log(-log(u))
    out[n]    = argmax_v(logits[n, v] / T[n] + g)           (first maximal index, NaN wins)
With 23 bits, b + 0.5 is exact in fp32 and u never reaches 1.0 (with 24 bits, b = 2**24 - 1 would
round u to 1.0 and give that token +inf noise); the kernel reproduces the noise bit for bit.
One program per row walks V in fixed BLOCK chunks in order, keeping a running (max, first index);
max and first-index are exact, so a row's result never depends on the other rows (or on BLOCK).
"""

from __future__ import annotations

import torch

from ._argmax import argmax_step
from ._common import NAMESPACE, cdiv, check_tensor, jit, kernel_path, launch, tl
from ._common import pdl_enter, pdl_release

BLOCK = 4096        # tokens per loop step on the GPU (num_warps 8: 16 per thread)
NUM_WARPS = 8
_M32 = 0xFFFFFFFF


# ---------------------------------------------------------------- Triton
@jit
def _mix32(x):
    """:func:`mix32` on uint32 (wrapping multiplies)."""
    x = (x ^ (x >> 16)) * 0x7FEB352D
    x = (x ^ (x >> 15)) * 0x846CA68B
    return x ^ (x >> 16)


@jit
def _hash_bits(v, key):
    """uint32 hash of token ids v (int32, >= 0) under the uint32 row key."""
    x = v.to(tl.uint32) * 0x9E3779B1
    x = _mix32(x ^ key)
    return _mix32(x ^ 0x5BD1E995)


@jit
def _gumbel(bits):
    """Standard Gumbel noise (fp32) from the hash bits: -log(-log(u)), u in (0, 1)."""
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    return -tl.log(-tl.log(u))


@jit
def _gumbel_argmax_kernel(logits_ptr, temp_ptr, keys_ptr, out_ptr, stride, V,
                          BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + n).to(tl.uint32)   # low 32 bits of the int64 key
    t = tl.load(temp_ptr + n)
    row = logits_ptr + n * stride
    lanes = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.zeros([], tl.int32)              # an all -inf row gives 0, as torch.argmax
    nan_i = tl.zeros([], tl.int32) + V           # first NaN (torch.argmax returns it), V = none
    for start in range(0, V, BLOCK):
        offs = start + lanes
        m = offs < V
        x = tl.load(row + offs, mask=m, other=0.0)
        val = tl.math.div_rn(x, t) + _gumbel(_hash_bits(offs, key))   # IEEE division, as torch
        best, best_i, nan_i = argmax_step(val, offs, m, V, best, best_i, nan_i)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    tl.store(out_ptr + n, tl.where(nan_i < V, nan_i, best_i).to(tl.int64))


@jit
def _noise_kernel(keys_ptr, bits_ptr, g_ptr, V, BLOCK: tl.constexpr):
    """Debug path: the hash bits and the noise the sampling kernel uses, [N, V] contiguous."""
    n = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < V
    bits = _hash_bits(offs, tl.load(keys_ptr + n).to(tl.uint32))
    tl.store(bits_ptr + n * V + offs, bits.to(tl.int64), mask=m)
    tl.store(g_ptr + n * V + offs, _gumbel(bits), mask=m)


# ---------------------------------------------------------------- torch reference
# The one torch definition of the hash: kolibri_trt/sampling.py samples with these functions.
def mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """(a * b) mod 2**32 for int64 a in [0, 2**32), without overflowing int64."""
    lo, hi = a & 0xFFFF, a >> 16
    return (lo * b + (((hi * b) & 0xFFFF) << 16)) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xorshift-multiply); int64 in [0, 2**32) in and out."""
    x = mul32(x ^ (x >> 16), 0x7FEB352D)
    x = mul32(x ^ (x >> 15), 0x846CA68B)
    return x ^ (x >> 16)


_VOCAB_TERM: dict[tuple[int, str], torch.Tensor] = {}


def _vocab_term(vocab_size: int, device: torch.device) -> torch.Tensor:
    """mul32(token id, 0x9E3779B1) for every id: int64 [V], made once per (V, device)."""
    k = (vocab_size, str(device))
    if k not in _VOCAB_TERM:
        v = torch.arange(vocab_size, device=device, dtype=torch.long)
        _VOCAB_TERM[k] = mul32(v, 0x9E3779B1)
    return _VOCAB_TERM[k]


def gumbel_bits_ref(keys: torch.Tensor, vocab_size: int, ids: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """The 32-bit hash of (key, token id) as int64 [N, V] in [0, 2**32); keys int64 [N] (only
    their low 32 bits are used); token ids 0 .. vocab_size - 1, or ids int64 [V] (ids >= 0:
    a vocabulary slice)."""
    term = _vocab_term(vocab_size, keys.device) if ids is None else mul32(ids, 0x9E3779B1)
    bits = mix32(term[None, :] ^ (keys & _M32)[:, None])
    return mix32(bits ^ 0x5BD1E995)


def gumbel_noise_ref(keys: torch.Tensor, vocab_size: int, ids: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """Standard Gumbel noise keyed by the row keys int64 [N]: fp32 [N, V] (what
    kolibri_trt.sampling.gumbel_noise_keyed returns); ids: as `gumbel_bits_ref`'s."""
    bits = gumbel_bits_ref(keys, vocab_size, ids)
    # 23 bits: b + 0.5 (b < 2**23) is exact in fp32, so u lies in [2**-24, 1 - 2**-24]: never 1.0
    u = ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))
    return -torch.log(-torch.log(u))


def gumbel_argmax_ref(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor
                      ) -> torch.Tensor:
    """Plain-torch reference of :func:`gumbel_argmax`: bit-identical to
    ``torch.argmax(logits / temperature[:, None] + gumbel_noise_keyed(keys, V), -1)``."""
    noise = gumbel_noise_ref(keys, logits.shape[-1])
    return torch.argmax(logits / temperature[:, None] + noise, dim=-1)


# ---------------------------------------------------------------- op + wrappers
@torch.library.custom_op(f"{NAMESPACE}::gumbel_argmax", mutates_args=())
def _gumbel_argmax_op(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor
                      ) -> torch.Tensor:
    if kernel_path(logits, "gumbel_argmax") == "ref":
        return gumbel_argmax_ref(logits, temperature, keys)
    return _launch(logits, temperature, keys, False)


@_gumbel_argmax_op.register_fake
def _(logits, temperature, keys):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


def _launch(logits, temperature, keys, interpret, block=BLOCK):
    N, V = logits.shape
    out = torch.empty((N,), dtype=torch.int64, device=logits.device)
    if N:
        launch(_gumbel_argmax_kernel, (N,), logits, temperature, keys, out, logits.stride(0), V,
               BLOCK=block, num_warps=NUM_WARPS, enable_fp_fusion=False, interpret=interpret)
    return out


def _check(logits, temperature, keys):
    check_tensor("logits", logits, torch.float32, (None, None), contiguous=False)
    N, V = logits.shape
    if V < 1:
        raise ValueError(f"logits: shape {tuple(logits.shape)}, the vocabulary dim must be >= 1")
    if V > 1 and logits.stride(1) != 1:
        raise ValueError(f"logits: last dim must have stride 1, strides {logits.stride()}")
    if V >= 2**31:
        raise ValueError(f"logits: vocabulary of {V} ids does not fit int32 token ids")
    check_tensor("temperature", temperature, torch.float32, (N,), logits.device)
    check_tensor("keys", keys, torch.int64, (N,), logits.device)


def gumbel_argmax(logits, temperature, keys, interpret: bool = False) -> torch.Tensor:
    """Sample one token id per row by the Gumbel-max trick with position-keyed noise.

    Args:
        logits: fp32 [N, V] (last dim stride 1; row stride free), V >= 1: raw logits in nats
            (or already-scaled/filtered ones with temperature 1; -inf = excluded).
        temperature: fp32 [N] contiguous, each row's temperature, > 0 (not checked on the
            device: checking would cost a host sync).
        keys: int64 [N] contiguous, each row's 32-bit key in [0, 2**32)
            (kolibri_trt.sampling.row_key(seed, position)); only the low 32 bits are used.
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns:
        int64 [N]: argmax_v(logits[n, v] / temperature[n] + g(keys[n], v)), ties (and NaN, which
        torch.argmax treats as the largest) to the lowest index; bit-identical to
        torch.argmax(logits / temperature[:, None] + gumbel_noise_keyed(keys, V), -1).
    Raises:
        ValueError naming the argument on a wrong shape, dtype, device or stride;
        RuntimeError for CUDA tensors when Triton is unavailable.
    Source: the Gumbel-max trick (argmax of logits plus standard Gumbel noise samples the
    softmax); the hash, u and noise formula are kolibri_trt/sampling.py's gumbel_noise_keyed.
    """
    _check(logits, temperature, keys)
    if interpret:
        return _launch(logits, temperature, keys, True)
    return torch.ops.kolibri_plugins.gumbel_argmax(logits, temperature, keys)


def gumbel_noise_debug(keys, vocab_size: int, interpret: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's own hash bits (int64 [N, V], in [0, 2**32)) and noise (fp32 [N, V]), from
    the same @triton.jit helpers as :func:`gumbel_argmax`: for tests and bench/gpu_check.py only
    (compare with :func:`gumbel_bits_ref` / :func:`gumbel_noise_ref`). keys: int64 [N]; CUDA
    tensors or interpret=True (CPU). Not registered as an op. Raises ValueError naming the bad
    argument."""
    check_tensor("keys", keys, torch.int64, (None,))
    if not interpret and keys.device.type != "cuda":
        raise ValueError(f"keys: on {keys.device}; the debug kernel needs CUDA or interpret=True")
    if int(vocab_size) < 1 or int(vocab_size) >= 2**31:
        raise ValueError(f"vocab_size: must be in [1, 2**31), got {vocab_size}")
    N, V = keys.shape[0], int(vocab_size)
    bits = torch.empty((N, V), dtype=torch.int64, device=keys.device)
    g = torch.empty((N, V), dtype=torch.float32, device=keys.device)
    if N:
        launch(_noise_kernel, (N, cdiv(V, 1024)), keys, bits, g, V, BLOCK=1024, num_warps=4,
               enable_fp_fusion=False, interpret=interpret)
    return bits, g
