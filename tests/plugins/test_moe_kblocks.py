"""moe_experts.K_BLOCKS > 1 (plugins/_k_blocks.py): K blocks per loop step of the swapped
pass, one accumulator each, in the interpreter: against the reference, batch invariance across
chunk sizes, and the settings it refuses."""

import importlib

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.moe import moe_forward, moe_forward_ref

ME = importlib.import_module("kolibri_trt_plugins.moe_experts")
INTERP_TOL = 2e-2  # bf16 intermediate activation can round differently, then a bf16 output
E, H, I_, IS, K = 8, 64, 32, 48, 2


@pytest.mark.parametrize("k_blocks,block_k", [(4, 64), (8, 128)])
@pytest.mark.parametrize("M", [1, 3, 33])
def test_k_blocks_match_reference(interp, monkeypatch, M, k_blocks, block_k):
    """4 blocks of 16 cover H = 64 in one step; 8 of 16 leave the step's last blocks past K
    (masked), and the down projection's K = 32 in two of them."""
    monkeypatch.setattr(ME, "K_BLOCKS", k_blocks)
    monkeypatch.setattr(ME, "BLOCK_K", block_k)
    g = T.gen(80 + M)
    wts = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((M, H), g)
    out = moe_forward(x, *wts, top_k=K, interpret=True)
    assert T.rel_err(out, moe_forward_ref(x, *wts, top_k=K)) < INTERP_TOL


def test_k_blocks_rows_do_not_depend_on_the_batch(interp_f64_dots, monkeypatch):
    """Every chunk takes the blocks: a token's output is the same from a chunk of 1, 3 or 40
    tokens (units by (token, slot) pair, by expert, row lists, several 8-token tiles)."""
    monkeypatch.setattr(ME, "K_BLOCKS", 4)
    monkeypatch.setattr(ME, "BLOCK_K", 64)
    g = T.gen(90)
    wts = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((40, H), g)
    x[:12] = x[0]   # 12 equal rows: their experts get 12 tokens each (two 8-token tiles)
    full = moe_forward(x, *wts, top_k=K, interpret=True)
    for m in (1, 3):
        assert torch.equal(moe_forward(x[:m], *wts, top_k=K, interpret=True), full[:m]), m


@pytest.mark.parametrize("k_blocks,swap_tokens", [(3, 1 << 30), (16, 1 << 30), (8, 8)])
def test_k_blocks_refuses(interp, monkeypatch, k_blocks, swap_tokens):
    """Not one of 1 / 2 / 4 / 8 with blocks of >= 16 columns (BLOCK_K 128), or chunks left
    unswapped (their pass has no blocks: other bits): ValueError naming K_BLOCKS."""
    monkeypatch.setattr(ME, "K_BLOCKS", k_blocks)
    monkeypatch.setattr(ME, "SWAP_TOKENS", swap_tokens)
    g = T.gen(95)
    wts = T.moe_weights(E, H, I_, IS, g)
    with pytest.raises(ValueError, match="K_BLOCKS"):
        moe_forward(T.randn((2, H), g), *wts, top_k=K, interpret=True)
