"""Split-K paths of fp8_gemv and the MoE expert GEMM (plugins/_split_k.py): the K partition,
agreement with the torch references, batch invariance, and S = 1 as the default. (That the
S = 1 path gives the single-pass kernel's bits was checked once against the previous commit's
kernels when split-K was added; the sm_90 cubin of the default fp8_gemv was byte-identical.)"""

import importlib

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins._split_k import k_chunk, k_ranges, num_splits
from kolibri_trt_plugins.moe import moe_forward, moe_forward_ref

f8 = importlib.import_module("kolibri_trt_plugins.fp8_gemv")  # the package re-exports the
me = importlib.import_module("kolibri_trt_plugins.moe_experts")  # functions under module names
moe_mod = importlib.import_module("kolibri_trt_plugins.moe")

GEMV_TOL = 4e-3  # RNE bf16 output; block mode rounds w·s to bf16 (2^-9): measured <= 2.6e-3
MOE_TOL = 2e-2   # bf16 intermediate activation can round differently, then a bf16 output
SPLITS = (2, 4)
GEMV_SHAPES = [(1, 97, 512), (3, 33, 768), (17, 65, 1280), (33, 97, 272)]  # (M, N, K), K=272: tail
MOE_E, MOE_H, MOE_I, MOE_IS, MOE_K = 8, 64, 40, 56, 2
MOE_BLOCK_K = 16  # MoE tests shrink the K step: H=64, I=40, Is=56 take 4, 3 (tail), 4 (tail) steps


@pytest.mark.parametrize("block_k", [64, 256, 512])
def test_k_ranges_partition_k(block_k):
    """Contiguous, non-empty, BLOCK_K-aligned ranges covering [0, K); at most S of them."""
    for K in list(range(1, 3000, 61)) + [256, 768, 2560]:
        for S in range(1, 13):
            s = num_splits(K, S, block_k)
            assert 1 <= s <= S and k_chunk(K, s, block_k) == k_chunk(K, S, block_k)
            r = k_ranges(K, s, block_k)
            assert r[0][0] == 0 and r[-1][1] == K and all(lo < hi for lo, hi in r)
            assert all(a[1] == b[0] and b[0] % block_k == 0 for a, b in zip(r, r[1:]))


def gemv_inputs(M, N, K, mode):
    g = T.gen(M * 1000 + N + K)
    return T.randn((M, K), g), T.fp8_weight(N, K, mode, g)


@pytest.mark.parametrize("S", SPLITS)
@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
@pytest.mark.parametrize("M,N,K", GEMV_SHAPES)
def test_fp8_split_matches_reference(interp_rne, monkeypatch, S, mode, M, N, K):
    if mode == "block" and K % 64:
        pytest.skip("block scales need K % 64 == 0")
    x, w = gemv_inputs(M, N, K, mode)
    monkeypatch.setattr(f8, "SPLIT_K", S)
    assert T.rel_err(f8.fp8_gemv(x, *w, interpret=True), f8.fp8_gemv_ref(x, *w)) < GEMV_TOL


@pytest.mark.parametrize("S", (1,) + SPLITS)
@pytest.mark.parametrize("mode", ["tensor", "block"])
def test_fp8_split_batch_invariant(interp, monkeypatch, S, mode):
    """A row alone, inside 3 rows and inside 33 rows (3 row tiles): identical bits."""
    x, w = gemv_inputs(33, 97, 768, mode)
    monkeypatch.setattr(f8, "SPLIT_K", S)
    full = f8.fp8_gemv(x, *w, interpret=True)
    for rows in (slice(17, 18), slice(16, 19)):
        assert torch.equal(f8.fp8_gemv(x[rows].contiguous(), *w, interpret=True), full[rows])


def test_default_splits_follow_the_shape_table(monkeypatch):
    """S comes from the (N, K) table (SPLIT_K_BY_SHAPE), else 1 (one value per layer shape:
    batch invariance); an int in SPLIT_K overrides it (sweeps, tests)."""
    monkeypatch.setattr(f8, "SPLIT_K_BY_SHAPE", {(2560, 2560): 3})
    assert f8.split_k_for(2560, 2560) == 3
    assert f8.split_k_for(3584, 2560) == f8.split_k_for(7680, 2560) == 1
    assert me.split_k_for(768, 2560, True) == me.split_k_for(2560, 768, False) == 1
    monkeypatch.setattr(f8, "SPLIT_K", 2)
    assert f8.split_k_for(2560, 2560) == f8.split_k_for(3584, 2560) == 2


def moe_inputs(M, shared=True):
    g = T.gen(100 + M)
    return T.randn((M, MOE_H), g), T.moe_weights(MOE_E, MOE_H, MOE_I, MOE_IS if shared else 0, g)


@pytest.mark.parametrize("sg,sd", [(2, 2), (4, 4), (1, 3)])
@pytest.mark.parametrize("M", [1, 3, 17, 33])
def test_moe_split_matches_reference(interp_rne, monkeypatch, sg, sd, M):
    """Gate/up and down split (Is=56 > I=40: at S=4 a routed down program has an empty range)."""
    monkeypatch.setattr(me, "BLOCK_K", MOE_BLOCK_K)
    monkeypatch.setattr(me, "SPLIT_K_GATED", sg)
    monkeypatch.setattr(me, "SPLIT_K_DOWN", sd)
    x, wts = moe_inputs(M, shared=M != 3)
    out = moe_forward(x, *wts, top_k=MOE_K, interpret=True)
    assert T.rel_err(out, moe_forward_ref(x, *wts, top_k=MOE_K)) < MOE_TOL


@pytest.mark.parametrize("S", SPLITS)
def test_moe_split_batch_invariant(interp, monkeypatch, S):
    monkeypatch.setattr(me, "BLOCK_K", MOE_BLOCK_K)
    monkeypatch.setattr(me, "SPLIT_K_GATED", S)
    monkeypatch.setattr(me, "SPLIT_K_DOWN", S)
    x, wts = moe_inputs(17)
    full = moe_forward(x, *wts, top_k=MOE_K, interpret=True)
    for rows in (slice(16, 17), slice(2, 5)):
        alone = moe_forward(x[rows].contiguous(), *wts, top_k=MOE_K, interpret=True)
        assert torch.equal(alone, full[rows])


@pytest.mark.parametrize("gated", [True, False])
def test_split_combine_kernel_matches_reference(interp, gated):
    """The split-K combine kernel (plugins/moe_split_combine.py) against its torch reference:
    fp32 rows exactly (the same sum order), bf16 act within a bf16 rounding (exp)."""
    from kolibri_trt_plugins.moe_split_combine import launch_split_combine, moe_split_combine_ref
    g = T.gen(90 + gated)
    S, M, k, n, n_sh = 3, 5, 2, 300, 200
    part = torch.randn((S, 2 if gated else 1, M, k + 1, n), generator=g)
    ids = torch.randint(0, 6, (M, k), generator=g, dtype=torch.int32)
    ws, shs = torch.rand(6, generator=g) + 0.5, torch.rand(1, generator=g) + 0.5
    out = torch.zeros((M, k + 1, n), dtype=torch.bfloat16 if gated else torch.float32)
    launch_split_combine(part, ids, ws, shs, out, n, n_sh, gated, S, interpret=True)
    want = moe_split_combine_ref(part, ids, ws, shs, gated)
    routed, shared = (slice(None), slice(0, k)), (slice(None), k)
    if gated:
        assert T.rel_err(out[routed], want[routed]) < 1e-2
        assert T.rel_err(out[shared][:, :n_sh], want[shared][:, :n_sh]) < 1e-2
    else:
        assert torch.equal(out[routed], want[routed])
        assert torch.equal(out[shared][:, :n_sh], want[shared][:, :n_sh])
    assert not out[shared][:, n_sh:].any()   # the shared expert's rows end at n_sh


@pytest.mark.parametrize("M", [1, 3, 16])
def test_moe_split_fixup_equals_combine_launch(interp, monkeypatch, M):
    """Split-K summed in the expert launch (FIXUP, chunks of <= FIXUP_TOKENS tokens) gives the
    combine launch's bits, and leaves every tile counter at zero for the next launch (graphs)."""
    monkeypatch.setattr(me, "BLOCK_K", MOE_BLOCK_K)
    monkeypatch.setattr(me, "SPLIT_K_GATED", 2)
    monkeypatch.setattr(me, "SPLIT_K_DOWN", 3)
    x, wts = moe_inputs(M)
    monkeypatch.setattr(me, "FIXUP_TOKENS", 0)
    combined = moe_forward(x, *wts, top_k=MOE_K, interpret=True)
    monkeypatch.setattr(me, "FIXUP_TOKENS", 16)
    me._COUNTERS.clear()
    fixed = moe_forward(x, *wts, top_k=MOE_K, interpret=True)
    assert torch.equal(fixed, combined)
    counters = me._COUNTERS[str(x.device)]
    assert int(counters.abs().sum()) == 0
    assert torch.equal(moe_forward(x, *wts, top_k=MOE_K, interpret=True), combined)
