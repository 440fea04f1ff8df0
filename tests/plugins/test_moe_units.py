"""The MoE work list (plugins/moe_units.py) and the expert GEMM walking it (moe_experts
COMPACT_UNITS): the list against its reference, and the compact launch giving the per-unit
launch's bits (which program runs an expert never changes a value), with split-K too."""

import importlib

import pytest
import torch
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.moe import moe_forward, moe_forward_ref
from kolibri_trt_plugins.moe_units import moe_units, moe_units_ref

me = importlib.import_module("kolibri_trt_plugins.moe_experts")  # the package re-exports

MOE_E, MOE_H, MOE_I, MOE_IS, MOE_K = 8, 64, 40, 56, 2
MOE_BLOCK_K = 16  # as tests/plugins/test_split_k.py: several K steps and tails at tiny sizes
MOE_TOL = 2e-2    # bf16 intermediate activation can round differently, then a bf16 output


@pytest.mark.parametrize("M,k,E", [(1, 1, 4), (1, 6, 256), (3, 2, 8), (17, 6, 8), (64, 6, 256),
                                   (64, 6, 4), (33, 5, 300)])
def test_work_list_matches_reference(interp, M, k, E):
    g = T.gen(M * 100 + k * 10 + E)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).int()
    units, count = moe_units(ids, interpret=True)
    want, n = moe_units_ref(ids)
    assert int(count[0]) == n == len(set(ids.flatten().tolist()))
    assert torch.equal(units[:n], want)


def test_work_list_rejects_bad_ids():
    with pytest.raises(ValueError, match="ids"):
        moe_units(torch.zeros((2, 3), dtype=torch.int64))
    with pytest.raises(ValueError, match="ids"):
        moe_units(torch.zeros((0, 3), dtype=torch.int32))


@pytest.mark.parametrize("programs,split,M,shared", [
    (1, 1, 17, True), (3, 1, 33, True), (64, 1, 1, True), (64, 1, 3, False), (64, 1, 33, True),
    (3, 2, 17, True), (64, 2, 3, False)])
def test_compact_launch_gives_the_same_bits(interp, monkeypatch, programs, split, M, shared):
    """COMPACT_UNITS with 1, 3 or 64 programs per n-tile == one program per unit, bit for bit."""
    monkeypatch.setattr(me, "BLOCK_K", MOE_BLOCK_K)
    monkeypatch.setattr(me, "SPLIT_K_GATED", split)
    monkeypatch.setattr(me, "SPLIT_K_DOWN", split)
    g = T.gen(500 + M)
    x = T.randn((M, MOE_H), g)
    wts = T.moe_weights(MOE_E, MOE_H, MOE_I, MOE_IS if shared else 0, g)
    per_unit = moe_forward(x, *wts, top_k=MOE_K, interpret=True)
    monkeypatch.setattr(me, "COMPACT_UNITS", True)
    monkeypatch.setattr(me, "UNIT_PROGRAMS", programs)
    compact = moe_forward(x, *wts, top_k=MOE_K, interpret=True)
    assert torch.equal(compact, per_unit)
    assert T.rel_err(compact, moe_forward_ref(x, *wts, top_k=MOE_K)) < MOE_TOL
