"""Per-expert row lists of one MoE chunk, for the grouped expert GEMM (moe_experts.py, ALIGNED).

    rows[e, 0]     = c_e, the tokens of the chunk that picked expert e
    rows[e, 1 + j] = m·(k + 1) + slot of the j-th of them, in token order (row-major over ids)
    (entries past 1 + c_e are not written)

The expert GEMM's programs (one per expert and n-tile) otherwise each scan all M·k ids for
their rows (`moe_experts._tile_rows`): at 256 tokens 5,200 down-projection programs each scan
1,536 ids for 6 K steps of work (plugins/NOTES.md, Nsight Compute `nr/`). Here one program per
expert scans once. The lists hold the same rows in the same order as the scan, so the GEMM's
tiles and bits do not change (tests/plugins/test_moe.py). Source of the routing: shared/spec/
kolibri-1.md (top-k per token); the layout is this project's (plugins/LAYOUTS.md has none).
"""

from __future__ import annotations

import torch

from ._common import check_tensor, jit, launch, next_pow2, tl
from ._common import early_launch, pdl_enter, pdl_release


@jit
def _moe_align_kernel(ids_ptr, rows_ptr, M, TOPK: tl.constexpr, M_P: tl.constexpr,
                      K_P: tl.constexpr, PDL: tl.constexpr = 0):
    """Program e: expert e's row list (module docstring) from ids [M, TOPK]."""
    pdl_enter(PDL)
    e = tl.program_id(0)
    mm = tl.arange(0, M_P)
    kk = tl.arange(0, K_P)
    ids = tl.load(ids_ptr + mm[:, None] * TOPK + kk[None, :],
                  mask=(mm < M)[:, None] & (kk < TOPK)[None, :], other=-1)
    match = ids == e
    has = tl.sum(match.to(tl.int32), 1) > 0     # top-k picks an expert at most once per token
    slot = tl.sum(tl.where(match, kk[None, :], 0), 1)
    pos = tl.cumsum(has.to(tl.int32), 0) - 1
    base = rows_ptr + e.to(tl.int64) * (M + 1)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    tl.store(base + 1 + pos, mm * (TOPK + 1) + slot, mask=has)
    tl.store(base, tl.sum(has.to(tl.int32), 0))


def moe_align_ref(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Plain-torch reference of :func:`moe_align` (entries past each count are 0 here)."""
    M, k = ids.shape
    rows = torch.zeros((num_experts, M + 1), dtype=torch.int32, device=ids.device)
    for m in range(M):
        for s in range(k):
            e = int(ids[m, s])
            rows[e, 0] += 1
            rows[e, int(rows[e, 0])] = m * (k + 1) + s
    return rows


def launch_moe_align(ids: torch.Tensor, num_experts: int, interpret: bool = False
                     ) -> torch.Tensor:
    """The kernel without argument checks, for `moe_forward`'s CUDA body; see moe_align."""
    M, k = ids.shape
    rows = torch.empty((num_experts, M + 1), dtype=torch.int32, device=ids.device)
    if M:
        launch(_moe_align_kernel, (num_experts,), ids, rows, M, TOPK=k,
               M_P=max(16, next_pow2(M)), K_P=max(2, next_pow2(k)), num_warps=4,
               interpret=interpret, pdl_early=early_launch("moe", M))
    return rows


def moe_align(ids: torch.Tensor, num_experts: int, interpret: bool = False) -> torch.Tensor:
    """Per-expert row lists of a chunk's routing (module docstring).

    Args:
        ids: int32 [M, k] contiguous, expert ids in [0, num_experts), distinct within a row
            (moe_route's output).
        num_experts: E.
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only).
    Returns: int32 [E, M + 1]: column 0 the count c_e, columns 1..c_e the rows m·(k+1) + slot
        in token order; later columns unspecified.
    Raises: ValueError naming the argument on a wrong shape, dtype or device;
        RuntimeError for CUDA tensors without Triton.
    """
    check_tensor("ids", ids, torch.int32, (None, None))
    if num_experts < 1:
        raise ValueError(f"num_experts: {num_experts} < 1")
    if ids.device.type == "cpu" and not interpret:
        return moe_align_ref(ids, num_experts)
    return launch_moe_align(ids, num_experts, interpret)
