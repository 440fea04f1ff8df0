"""L2 prefetch of a program's weight tile before it waits for the kernel before it (PDL mode 4).

Under programmatic dependent launch mode 4 (plugins/_common.py) each kernel lets the next one
launch as soon as its own programs have waited, so the next kernel's programs sit on the SMs
while this one runs. Before they wait (``pdl_enter``) they ask L2 for the weight bytes they
will read: the weights do not depend on the kernel before, so the DRAM reads of kernel n + 1
overlap kernel n's, and kernel n + 1 then reads from L2. At decode sizes most kernels stand at
their own latency (plugins/NOTES.md, "Where each kernel stands"), and the card's DRAM idles
between them. A prefetch is a hint: it changes no value, so a stale address costs bandwidth
only (the MoE reads expert ids written two kernels back: `moe_experts.py`).

The instruction is Hopper's ``cp.async.bulk.prefetch.L2.global [addr], size`` (PTX ISA 8.0,
sm_90; 16-byte aligned address, size a multiple of 16), one per contiguous region, issued by
thread 0 (its operands must be warp-uniform: per-thread addresses compile to a loop over the
lanes); a region's ends are rounded down to 16 bytes, so up to 15 bytes at each end may go
unfetched. The SASS (UBLKPF) carries the size in 16-byte units in 16 bits: MAX_BYTES per
region. Nothing runs in modes 0-3, in the interpreter (PDL 0 there) or on GPUs without
PDL.
"""

from __future__ import annotations

from ._common import jit, tl


MAX_BYTES = tl.constexpr(65535 * 16) if tl is not None else 65535 * 16


@jit
def prefetch_region(PDL: tl.constexpr, base, nbytes):
    """Mode 4 only: ask L2 for the nbytes bytes (int; at most MAX_BYTES taken) from pointer
    ``base`` (any element type) in one bulk prefetch issued by thread 0."""
    if PDL == 4:
        addr = tl.cast(base, tl.int64)
        a = tl.full([1], addr // 16 * 16, tl.int64)
        size = tl.minimum((addr + nbytes) // 16 * 16 - addr // 16 * 16, MAX_BYTES).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
            "setp.gt.and.s32 p, $2, 0, p; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [a, tl.full([1], size, tl.int32)], dtype=tl.int32, is_pure=False,
            pack=1)


@jit
def prefetch_tile(PDL: tl.constexpr, base, row0, nrows, row_bytes, R: tl.constexpr,
                  SPLIT: tl.constexpr = 1):
    """Mode 4 only: `prefetch_region` of rows row0 .. min(row0 + R, nrows) - 1 of a row-major
    matrix at ``base`` with rows of row_bytes bytes: a GEMM program's weight tile. Split-K
    programs (program_id(2) of SPLIT) read parts of the same rows: range 0's program asks for
    the whole rows, the others for nothing."""
    if PDL == 4:
        rows = tl.maximum(tl.minimum(nrows - row0, R), 0)
        if SPLIT > 1:
            rows = tl.where(tl.program_id(2) == 0, rows, 0)
        prefetch_region(PDL, base + row0.to(tl.int64) * row_bytes, rows.to(tl.int64) * row_bytes)
