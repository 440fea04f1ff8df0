"""fp8_gemv.K_BLOCKS > 1 (plugins/_k_blocks.py): each K step as blocks on as many warps, one
accumulator per block, in the interpreter: the blocks' batches, the kernel's fp32 sums against
a torch model of that order in every form, and the settings it refuses."""

import importlib

import pytest
import torch

from kolibri_trt_plugins._common import jit, launch, tl
from kolibri_trt_plugins._k_blocks import k_blocks
from kolibri_trt_plugins._split_k import k_ranges

F8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")


@jit
def _blocks_kernel(a_ptr, b_ptr, a3_ptr, b3_ptr, R: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, KB: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    k = tl.arange(0, BK * KB)
    a = tl.load(a_ptr + r[:, None] * (BK * KB) + k[None, :])
    b = tl.load(b_ptr + k[:, None] * C + c[None, :])
    a3, b3 = k_blocks(a, b, KB)
    j = tl.arange(0, KB)[:, None, None]
    kk = tl.arange(0, BK)
    tl.store(a3_ptr + j * (R * BK) + r[None, :, None] * BK + kk[None, None, :], a3)
    tl.store(b3_ptr + j * (BK * C) + kk[None, :, None] * C + c[None, None, :], b3)


@pytest.mark.parametrize("kb", [2, 4])
def test_k_blocks_batches_are_the_blocks(interp, kb):
    """Batch j of a3 [KB, R, BK] is a[:, j·BK:(j+1)·BK], of b3 [KB, BK, C] b[j·BK:(j+1)·BK]."""
    R, C, BK = 16, 8, 16
    a, b = torch.randn(R, kb * BK), torch.randn(kb * BK, C)
    a3, b3 = torch.empty(kb, R, BK), torch.empty(kb, BK, C)
    launch(_blocks_kernel, (1,), a, b, a3, b3, R=R, C=C, BK=BK, KB=kb, interpret=True)
    for j in range(kb):
        assert torch.equal(a3[j], a[:, j * BK:(j + 1) * BK])
        assert torch.equal(b3[j], b[j * BK:(j + 1) * BK])


def _block_sums(x, w, block_k, kb, k_lo, k_hi):
    """fp32 [M, N] x·w^T over columns [k_lo, k_hi) in the order of KB blocks per step under
    `interp_f64_dots`: block j of each step of block_k columns into accumulator j (each block's
    sum exact, added with one fp32 rounding), then the accumulators summed in fp32."""
    xf, wf = x.double(), w.float().double()
    sub = block_k // kb
    accs = [torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32) for _ in range(kb)]
    for k0 in range(k_lo, k_hi, block_k):
        for j in range(kb):
            lo, hi = k0 + j * sub, min(k0 + (j + 1) * sub, k_hi)
            if lo < hi:
                accs[j] = (accs[j].double() + xf[:, lo:hi] @ wf[:, lo:hi].T).float()
    total = accs[0]
    for a in accs[1:]:
        total = total + a
    return total


@pytest.mark.parametrize("m", [1, 3, 33])
def test_fp8_gemv_sums_in_k_blocks(interp_f64_dots, m):
    """fp8_gemv's fp32 partials (two K ranges of 3 and 2 steps; interpreter, float64 dots)
    follow `_block_sums` at K_BLOCKS 4 and 1, swapped (m <= SWAP_ROWS) and in the 16-row form
    (SWAP_ROWS 0); the two orders differ in fp32 here, so the test tells them apart."""
    g = torch.Generator().manual_seed(m)
    K, N = 5 * F8.BLOCK_K, 40
    w = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn)
    s = torch.tensor([0.03])
    x = torch.randn(m, K, generator=g).bfloat16()
    ranges = k_ranges(K, 2, F8.BLOCK_K)
    want = {kb: torch.stack([_block_sums(x, w, F8.BLOCK_K, kb, lo, hi) for lo, hi in ranges])
            for kb in (1, 4)}
    assert not torch.equal(want[1], want[4])
    saved = F8.K_BLOCKS, F8.SWAP_ROWS, F8.SPLIT_K
    try:
        for kb in (4, 1):
            for swap_rows in (saved[1], 0):
                F8.K_BLOCKS, F8.SWAP_ROWS, F8.SPLIT_K = kb, swap_rows, 2
                got = F8.launch_partials(x, w, s, interpret=True)
                assert torch.equal(got, want[kb]), (kb, swap_rows)
    finally:
        F8.K_BLOCKS, F8.SWAP_ROWS, F8.SPLIT_K = saved


@pytest.mark.parametrize("kb", [3, 32])
def test_k_blocks_refuses(interp, monkeypatch, kb):
    """Not one of 1 / 2 / 4 / 8, or blocks under 16 columns: ValueError naming K_BLOCKS."""
    monkeypatch.setattr(F8, "K_BLOCKS", kb)
    w = torch.randn(32, 256).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="K_BLOCKS"):
        F8.fp8_gemv(torch.randn(2, 256).bfloat16(), w, torch.tensor([0.1]), interpret=True)


def test_k_blocks_by_shape(interp_f64_dots, monkeypatch):
    """K_BLOCKS None: an [N, K] weight listed in K_BLOCKS_BY_SHAPE sums in that many blocks, any
    other in one accumulator, at one row and at 33 (the count is the shape's, not the batch's)."""
    g = torch.Generator().manual_seed(7)
    K = 5 * F8.BLOCK_K
    monkeypatch.setattr(F8, "K_BLOCKS", None)
    monkeypatch.setattr(F8, "K_BLOCKS_BY_SHAPE", {(40, K): 4})
    monkeypatch.setattr(F8, "SPLIT_K", 2)
    x = torch.randn(33, K, generator=g).bfloat16()
    for n, kb in ((40, 4), (48, 1)):
        w = torch.randn(n, K, generator=g).to(torch.float8_e4m3fn)
        want = torch.stack([_block_sums(x, w, F8.BLOCK_K, kb, lo, hi)
                            for lo, hi in k_ranges(K, 2, F8.BLOCK_K)])
        other = torch.stack([_block_sums(x, w, F8.BLOCK_K, 5 - kb, lo, hi)
                             for lo, hi in k_ranges(K, 2, F8.BLOCK_K)])
        assert not torch.equal(want, other)
        for m in (1, 33):
            got = F8.launch_partials(x[:m], w, torch.tensor([0.03]), interpret=True)
            assert torch.equal(got, want[:, :m]), (n, m)


def test_k_blocks_by_shape_refuses(interp, monkeypatch):
    """A count K_BLOCKS_BY_SHAPE gives that check_k_blocks refuses: ValueError naming K_BLOCKS."""
    monkeypatch.setattr(F8, "K_BLOCKS", None)
    monkeypatch.setattr(F8, "K_BLOCKS_BY_SHAPE", {(32, 256): 3})
    w = torch.randn(32, 256).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="K_BLOCKS"):
        F8.fp8_gemv(torch.randn(2, 256).bfloat16(), w, torch.tensor([0.1]), interpret=True)
