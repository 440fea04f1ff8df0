"""The MoE step's work list: the distinct experts of ``ids`` in first-appearance order, on device.

    first[u] = ids[u] differs from every ids[u'] with u' < u        (u = m·k + slot, row-major)
    units[j] = the j-th u with first[u]                              j = 0 .. count - 1
    count    = number of distinct experts
The grouped expert GEMM (`moe_experts.py`, ``COMPACT_UNITS``) then runs a fixed grid of programs
that walk j = 0 .. count (count = the shared expert) instead of one program per (token, slot),
most of which would find their expert already taken and exit. One program; the M·k <= 384 pairs
are compared in chunks of CH rows against all of ids (O((M·k)²) compares, a few µs).
Batch invariance: the list only decides which program runs which expert, never a value.
"""

from __future__ import annotations

import torch

from ._common import check_tensor, jit, kernel_path, launch, next_pow2, tl

CH = 32   # rows of ids compared per chunk ([CH, U_P] compares in registers)


@jit
def _moe_units_kernel(ids_ptr, flags_ptr, units_ptr, count_ptr, MK,
                      U_P: tl.constexpr, CH: tl.constexpr):
    uu = tl.arange(0, U_P)
    ids = tl.load(ids_ptr + uu, mask=uu < MK, other=-1)
    for c in tl.static_range(U_P // CH):
        r = c * CH + tl.arange(0, CH)
        ir = tl.load(ids_ptr + r, mask=r < MK, other=-2)
        dup = (ids[None, :] == ir[:, None]) & (uu[None, :] < r[:, None])
        first = (tl.sum(dup.to(tl.int32), 1) == 0) & (r < MK)
        tl.store(flags_ptr + r, first.to(tl.int32))
    tl.debug_barrier()   # the flags of every chunk, visible to every thread of the program
    first = tl.load(flags_ptr + uu)
    j = tl.cumsum(first, 0) - 1
    tl.store(units_ptr + j, uu, mask=first > 0)
    tl.store(count_ptr, tl.sum(first, 0))


def moe_units_ref(ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Plain-torch reference: (units int32 [count], count) for ids int32 [M, k]."""
    flat = ids.reshape(-1).tolist()
    seen, units = set(), []
    for u, e in enumerate(flat):
        if e not in seen:
            seen.add(e)
            units.append(u)
    return torch.tensor(units, dtype=torch.int32), len(units)


def moe_units(ids: torch.Tensor, interpret: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The work list of :mod:`moe_experts` for routed ids, built on the ids' device.

    Args:
        ids: int32 [M, k] contiguous (the router's choices; M·k >= 1).
        interpret: run the Triton kernel in the interpreter on CPU tensors (tests only);
            without it CPU tensors take the reference.
    Returns: (units int32 [next_pow2(M·k)]: entries 0 .. count-1 as defined in the module
        docstring, the rest unspecified; count int32 [1]).
    Raises: ValueError naming ``ids`` on a wrong dtype, rank, size or stride.
    """
    check_tensor("ids", ids, torch.int32, (None, None))
    mk = ids.numel()
    if mk == 0:
        raise ValueError("ids: empty (no routed tokens)")
    u_p = max(CH, next_pow2(mk))
    if not interpret and kernel_path(ids, "moe_units") == "ref":
        want, n = moe_units_ref(ids)
        units = torch.zeros(u_p, dtype=torch.int32)
        units[:n] = want
        return units, torch.tensor([n], dtype=torch.int32)
    flags = torch.empty(u_p, dtype=torch.int32, device=ids.device)
    units = torch.empty(u_p, dtype=torch.int32, device=ids.device)
    count = torch.empty(1, dtype=torch.int32, device=ids.device)
    launch(_moe_units_kernel, (1,), ids, flags, units, count, mk, U_P=u_p, CH=CH, num_warps=4,
           interpret=interpret)
    return units, count
