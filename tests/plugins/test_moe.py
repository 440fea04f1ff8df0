"""MoE routing (fp32 router, top-k, lower-index ties, renorm) and the FP8 expert block."""

import pytest
import torch

import importlib

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.moe import moe_forward, moe_forward_ref
from kolibri_trt_plugins.moe_align import moe_align, moe_align_ref
from kolibri_trt_plugins.moe_route import moe_route, moe_route_ref

ME = importlib.import_module("kolibri_trt_plugins.moe_experts")
INTERP_TOL = 2e-2  # bf16 intermediate activation can round differently, then a bf16 output
E, H, I_, IS, K = 8, 64, 32, 48, 2


def test_route_ties_go_to_lower_index():
    x = torch.ones((2, 16), dtype=torch.bfloat16)
    rw = torch.zeros((6, 16), dtype=torch.bfloat16)
    rw[[1, 3, 4]] = 0.25  # three equal best experts
    ids, w = moe_route_ref(x, rw, 2)
    assert ids.tolist() == [[1, 3], [1, 3]]
    assert torch.allclose(w.sum(1), torch.ones(2))


def test_route_interpreter_ties_and_weights(interp):
    g = T.gen(4)
    x = T.randn((33, 64), g)
    rw = T.randn((16, 64), g, scale=0.1)
    rw[9] = rw[2]  # exact duplicate: identical logits, the lower index must win
    ids_r, w_r = moe_route_ref(x, rw, 3)
    ids_k, w_k = moe_route(x, rw, 3, interpret=True)
    assert torch.equal(ids_k, ids_r)
    assert torch.allclose(w_k, w_r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("split", [2, 3])
def test_route_split_h_interpreter(interp, monkeypatch, split):
    """The router's H split (SPLIT_H; partials summed in order by the top-k kernel) picks the
    reference's experts, with weights within fp32 rounding; 640 = 5 steps of 128 over 2 or 3
    ranges (one of them shorter)."""
    import importlib
    rt = importlib.import_module("kolibri_trt_plugins.moe_route")
    monkeypatch.setattr(rt, "BLOCK_H", 128)
    monkeypatch.setattr(rt, "SPLIT_H", split)
    g = T.gen(40 + split)
    x = T.randn((5, 640), g)
    rw = T.randn((32, 640), g, scale=0.1)
    ids_r, w_r = moe_route_ref(x, rw, 4)
    ids_k, w_k = moe_route(x, rw, 4, interpret=True)
    assert torch.equal(ids_k, ids_r)
    assert torch.allclose(w_k, w_r, rtol=1e-5, atol=1e-6)


def expert_dense(x, w13, s13, w2, s2):
    """Independent dense expert: fp64 gate/up, bf16 activation (the kernel's format), fp64 down."""
    inter = w13.shape[0] // 2
    gu = x.double() @ (w13.double() * float(s13)).T
    act = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(torch.bfloat16)
    return act.double() @ (w2.double() * float(s2)).T


def test_reference_against_dense():
    g = T.gen(6)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((3, H), g)
    ids, wts = moe_route_ref(x, rw, K)
    y = torch.zeros((3, H), dtype=torch.float64)
    for m in range(3):
        for i in range(K):
            e = int(ids[m, i])
            y[m] += float(wts[m, i]) * expert_dense(x[m:m + 1], w13[e], s13[e], w2[e], s2[e])[0]
        y[m] += expert_dense(x[m:m + 1], sw13[0], ss13[0], sw2[0], ss2[0])[0]
    out = moe_forward(x, rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2, top_k=K)
    assert T.rel_err(out, y) < 1e-2  # bf16 output


@pytest.mark.parametrize("swap_tokens", [0, 8, 64])
@pytest.mark.parametrize("M", [1, 3, 33, 70])
def test_interpreter_matches_reference(interp, monkeypatch, M, swap_tokens):
    """Both operand orders of the expert GEMM: moe_experts.SWAP_TOKENS 64 (the default) takes
    every chunk as W·x^T (weights the MMA's A, tokens its N, 8-token tiles; experts with more
    than 8 tokens take several 8-token passes), 8 only chunks of <= 8 tokens, 0 none."""
    monkeypatch.setattr(ME, "SWAP_TOKENS", swap_tokens)
    g = T.gen(10 + M)
    wts = T.moe_weights(E, H, I_, IS if M != 3 else 0, g)
    x = T.randn((M, H), g)
    out = moe_forward(x, *wts, top_k=K, interpret=True)
    assert T.rel_err(out, moe_forward_ref(x, *wts, top_k=K)) < INTERP_TOL


@pytest.mark.parametrize("M,swap_tokens", [(1, 8), (3, 8), (8, 8), (33, 64)])
def test_swapped_form_keeps_bits(interp, monkeypatch, M, swap_tokens):
    """The W·x^T experts (SWAP_TOKENS) give the bits of the 16-token x·W^T form."""
    g = T.gen(20 + M)
    wts = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((M, H), g)
    monkeypatch.setattr(ME, "SWAP_TOKENS", 0)
    want = moe_forward(x, *wts, top_k=K, interpret=True)
    monkeypatch.setattr(ME, "SWAP_TOKENS", swap_tokens)
    assert torch.equal(moe_forward(x, *wts, top_k=K, interpret=True), want)


@pytest.mark.parametrize("M", [33, 64])
def test_tile_loop_keeps_bits(interp, monkeypatch, M):
    """TILE_LOOP (row tiles after the first as a runtime loop) gives the unrolled form's bits;
    the shared expert and a 20-token expert take several 8-token tiles."""
    g = T.gen(60 + M)
    wts = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((M, H), g)
    x[:20] = x[0]   # 20 equal rows: their experts get 20 tokens each
    monkeypatch.setattr(ME, "TILE_LOOP", False)
    want = moe_forward(x, *wts, top_k=K, interpret=True)
    monkeypatch.setattr(ME, "TILE_LOOP", True)
    assert torch.equal(moe_forward(x, *wts, top_k=K, interpret=True), want)


@pytest.mark.parametrize("M,shared", [(130, True), (70, False)])
def test_chunks_and_units_keep_bits(interp, monkeypatch, M, shared):
    """The default chunks (MAX_TOKENS 256: one chunk here) with one unit per expert
    (BY_EXPERT_TOKENS) reading per-expert row lists (ALIGN_TOKENS) and the shared expert in
    SHARED_TOKENS groups (130 tokens: 3 groups; 20 tokens on the same experts) give the bits of
    chunks of 64 with one unit per (token, slot) pair."""
    g = T.gen(70 + M)
    wts = T.moe_weights(E, H, I_, IS if shared else 0, g)
    x = T.randn((M, H), g)
    x[:20] = x[0]
    monkeypatch.setattr(ME, "MAX_TOKENS", 64)
    monkeypatch.setattr(ME, "BY_EXPERT_TOKENS", 1 << 30)
    monkeypatch.setattr(ME, "ALIGN_TOKENS", 1 << 30)
    want = moe_forward(x, *wts, top_k=K, interpret=True)
    monkeypatch.undo()
    assert ME.MAX_TOKENS >= M and ME.BY_EXPERT_TOKENS <= M   # one chunk, units by expert
    assert torch.equal(moe_forward(x, *wts, top_k=K, interpret=True), want)


def test_align_interpreter_matches_reference(interp):
    """moe_align's per-expert lists (count, then m·(k+1) + slot in token order) equal the
    reference's up to each count."""
    g = T.gen(80)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(37)]).to(torch.int32)
    got, ref = moe_align(ids, E, interpret=True), moe_align_ref(ids, E)
    for e in range(E):
        c = int(ref[e, 0])
        assert torch.equal(got[e, :1 + c], ref[e, :1 + c]), e


@pytest.mark.parametrize("M,shared", [(130, True), (40, False)])
def test_expert_row_lists_keep_bits(interp, monkeypatch, M, shared):
    """The experts reading per-expert row lists (ALIGN_TOKENS, the default: moe_align once per
    chunk) give the bits of every program scanning ids (the same rows, in order)."""
    g = T.gen(90 + M)
    wts = T.moe_weights(E, H, I_, IS if shared else 0, g)
    x = T.randn((M, H), g)
    x[:20] = x[0]
    monkeypatch.setattr(ME, "ALIGN_TOKENS", 1 << 30)
    want = moe_forward(x, *wts, top_k=K, interpret=True)
    monkeypatch.undo()
    assert ME.BY_EXPERT_TOKENS <= ME.ALIGN_TOKENS <= M   # the lists are used
    assert torch.equal(moe_forward(x, *wts, top_k=K, interpret=True), want)


def test_row_lists_need_units_by_expert(interp, monkeypatch):
    """Row lists for a chunk served by (token, slot) units raise, naming the setting."""
    monkeypatch.setattr(ME, "ALIGN_TOKENS", 2)
    g = T.gen(2)
    wts = T.moe_weights(E, H, I_, IS, g)
    with pytest.raises(ValueError, match="^expert_rows:.*ALIGN_TOKENS"):
        moe_forward(T.randn((3, H), g), *wts, top_k=K, interpret=True)


def test_errors_name_the_argument():
    g = T.gen(1)
    rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2 = T.moe_weights(E, H, I_, IS, g)
    x = T.randn((2, H), g)
    with pytest.raises(ValueError, match="^w13:"):
        moe_forward(x, rw, w13.float(), s13, w2, s2)
    with pytest.raises(ValueError, match="^w2:"):
        moe_forward(x, rw, w13, s13, w2[:, :, :5].contiguous(), s2)
    with pytest.raises(ValueError, match="pass all or none"):
        moe_forward(x, rw, w13, s13, w2, s2, sw13, ss13, None, None)
    with pytest.raises(ValueError, match="^top_k:"):
        moe_forward(x, rw, w13, s13, w2, s2, top_k=E + 1)
    with pytest.raises(ValueError, match="^router_weight:"):
        moe_route(x, rw[:, :5].contiguous(), 2)
