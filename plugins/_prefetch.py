"""L2 prefetch of the bytes later kernels will read, issued by the kernel that first knows them.

The MoE at one token reads ~41 MB of expert weights (6 routed experts and the shared one, gate /
up then down) in two launches whose warps wait on DRAM latency: on the H200 gate/up ran at
2.3 TB/s, down at 1.9 TB/s, with 1-2 warps per scheduler (plugins/NOTES_HISTORY_2.md, Nsight
Compute `nr/`). The top-k kernel is the first to know which experts those are: it can ask L2 for
their weights at once, in ~1 MB bulk requests that keep DRAM busy while the expert launches
start, so their loads meet L2. Each kernel prefetching its own tile (PDL mode 4 of 1d8bce0)
lost: later waves asked just before they read. Here the bytes are asked for one kernel early,
and only for chunks small enough that they fit L2 (`moe_route.PREFETCH_TOKENS`).

The instruction is Hopper's ``cp.async.bulk.prefetch.L2.global [addr], size`` (PTX ISA 8.0,
sm_90; 16-byte aligned address, size a multiple of 16), issued by thread 0 with warp-uniform
operands. The SASS (UBLKPF) holds the size in 16 bits of 16-byte units: MAX_BYTES per
instruction. A prefetch changes no value: a wrong address costs bandwidth, not bits. Addresses
are plain int64 (``tensor.data_ptr()``), so the address maths runs in Triton's interpreter too
(tests/plugins/test_prefetch.py); the instruction itself only on the GPU.
"""

from __future__ import annotations

import torch

from ._common import cdiv, jit, sm90_or_later, tl

MAX_BYTES = 65535 * 16   # bytes one bulk prefetch can ask for


def bulk_prefetch_here(device: torch.device) -> bool:
    """True when CUDA device `device` has the bulk prefetch (`_common.sm90_or_later`)."""
    return sm90_or_later(torch.device(device))


def chunking(nbytes: int) -> tuple[int, int]:
    """(chunks, bytes per chunk) that cover a region of `nbytes` bytes in requests of at most
    MAX_BYTES, each chunk a multiple of 16 bytes (the last one may be shorter). Raises
    ValueError on a negative size."""
    if nbytes < 0:
        raise ValueError(f"nbytes: {nbytes} < 0")
    if nbytes == 0:
        return 0, 16
    chunks = cdiv(nbytes, MAX_BYTES)
    per = cdiv(cdiv(nbytes, chunks), 16) * 16
    return cdiv(nbytes, per), per


@jit
def chunk_span(base, nbytes, c, per):
    """(first address, bytes) int64 of chunk c of the region [base, base + nbytes) cut in chunks
    of `per` bytes, both ends rounded down to 16 bytes (up to 15 bytes at the region's ends go
    unasked); bytes <= 0 for a chunk past the region's end."""
    lo = base + tl.full([], c, tl.int64) * per   # c: an int32 scalar or a loop's int
    hi = tl.minimum(lo + per, base + nbytes)
    start = lo // 16 * 16
    return start, hi // 16 * 16 - start


@jit
def prefetch_l2(addr, nbytes, ASM: tl.constexpr):
    """Ask L2 for [addr, addr + nbytes) (int64 scalars; nbytes <= MAX_BYTES, nothing when <= 0):
    one bulk prefetch from thread 0. ASM False (the interpreter, GPUs before sm_90): nothing."""
    if ASM:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
            "setp.gt.and.s32 p, $2, 0, p; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [tl.full([1], addr, tl.int64), tl.full([1], nbytes, tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1)


@jit
def ask_chunks(base, nbytes, per, first, step, log_ptr, CHUNKS: tl.constexpr,
               ASM: tl.constexpr, LOG: tl.constexpr):
    """Chunks first, first + step, ... < CHUNKS of the region [base, base + nbytes) (int64
    address; `per` bytes per chunk): each asked of L2 (`prefetch_l2`), or with LOG (tests;
    after the kernel's wait, as it stores) its (address, bytes) stored and a count added at
    int64 log_ptr + 3·c instead. The same loop either way, so the log shows what is asked."""
    for c in range(first, CHUNKS, step):
        addr, size = chunk_span(base, nbytes, c, per)
        if LOG:
            tl.store(log_ptr + 3 * c, addr)
            tl.store(log_ptr + 3 * c + 1, size)
            tl.atomic_add(log_ptr + 3 * c + 2, 1)
        else:
            prefetch_l2(addr, size, ASM)
