"""KolibriForCausalLM against a naive per-position reading of the spec, and its parts."""

from __future__ import annotations

import pytest
import torch

from kolibri_trt.config import FULL, SLIDING
from kolibri_trt.fixtures import random_target
from kolibri_trt.model import ops

from model_configs import micro_target_config
from naive_kolibri import naive_target_logits

# fp32 model vs float64 loops: accumulated fp32 rounding over 5 layers stays far below this
FP32_VS_F64_REL = 1e-5
# bf16 weights and activations vs the same weights in fp32: bf16 keeps ~3 significant digits
BF16_VS_FP32_REL = 5e-2


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_logits_match_naive_spec_reading_with_window_shorter_than_sequence(micro_target):
    cfg = micro_target.config
    ids = torch.randint(0, cfg.vocab_size, (1, 19), generator=torch.Generator().manual_seed(0))
    assert ids.shape[1] > cfg.sliding_window
    logits, taps = micro_target(ids, tap_layers=tuple(range(cfg.num_hidden_layers)))
    ref_logits, ref_h = naive_target_logits(micro_target.state_dict(), cfg, ids[0].tolist())
    assert logits.shape == (1, 19, cfg.vocab_size) and logits.dtype == torch.float32
    assert rel(logits[0], ref_logits) < FP32_VS_F64_REL
    assert rel(taps[0], ref_h) < FP32_VS_F64_REL


def test_full_head_dim_128_and_batch_rows_independent():
    cfg = micro_target_config(head_dim=128, num_attention_heads=4, num_key_value_heads=2,
                              sliding_window=4)
    model = random_target(cfg, seed=3, dtype=torch.float32)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    batch = model(ids)
    ref, _ = naive_target_logits(model.state_dict(), cfg, ids[1].tolist())
    assert rel(batch[1], ref) < FP32_VS_F64_REL
    # CPU BLAS may block a batch differently: equal up to fp32 rounding, not bit for bit
    torch.testing.assert_close(model(ids[1:2])[0], batch[1], rtol=1e-5, atol=1e-5)


def test_sliding_boundary_sees_512_back_not_513():
    # window 513: a query at i sees i-512 .. i. One sliding layer only, so nothing leaks
    # through another layer.
    cfg = micro_target_config(num_hidden_layers=1, layer_types=(SLIDING,), sliding_window=513,
                              hidden_size=32, head_dim=8)
    model = random_target(cfg, seed=5, dtype=torch.float32)
    base = torch.randint(0, cfg.vocab_size, (1, 516), generator=torch.Generator().manual_seed(2))
    last = base.shape[1] - 1
    ref = model(base)[0, last]

    def changed_at(pos):
        ids = base.clone()
        ids[0, pos] = (ids[0, pos] + 1) % cfg.vocab_size
        return not torch.equal(model(ids)[0, last], ref)

    assert changed_at(last - 512)
    assert not changed_at(last - 513)
    assert ops.causal_ranges(torch.tensor([599, 10]), 0, 513) == [(599 - 512, 600), (0, 11)]
    assert ops.causal_ranges(torch.tensor([599]), 50, 513) == [(599 - 512 - 50, 550)]


def test_full_attention_layers_have_no_positional_encoding():
    # One full layer: the last query attends over keys that depend on their own token only,
    # so without RoPE a permutation of the earlier tokens leaves the last logits unchanged.
    full = micro_target_config(num_hidden_layers=1, layer_types=(FULL,))
    sliding = micro_target_config(num_hidden_layers=1, layer_types=(SLIDING,), sliding_window=64)
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(3))
    perm = torch.cat([ids[:, :-1].flip(1), ids[:, -1:]], dim=1)
    m_full = random_target(full, seed=6, dtype=torch.float32)
    m_sliding = random_target(sliding, seed=6, dtype=torch.float32)
    torch.testing.assert_close(m_full(perm)[0, -1], m_full(ids)[0, -1], rtol=1e-5, atol=1e-5)
    assert rel(m_sliding(perm)[0, -1], m_sliding(ids)[0, -1]) > 1e-3


def test_gqa_query_head_n_reads_kv_head_n_div_group():
    q = torch.randn(1, 3, 6, 8)
    k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)
    allowed = torch.ones(3, 3, dtype=torch.bool).tril()
    out = ops.attention(q, k, v, ops.causal_ranges(torch.arange(3), 0, None))
    for n in range(6):
        g = n // 3
        s = (q[0, :, n] @ k[0, :, g].T) / 8 ** 0.5
        s = s.masked_fill(~allowed, float("-inf"))
        torch.testing.assert_close(out[0, :, n], torch.softmax(s, -1) @ v[0, :, g])


def test_router_topk_ties_go_to_lower_expert_index():
    logits = torch.tensor([[0.0, 2.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    w, e = ops.route_topk(logits, 2, normalize=True)
    assert e.tolist() == [[1, 2], [0, 1]]
    torch.testing.assert_close(w, torch.full((2, 2), 0.5))
    w_raw, _ = ops.route_topk(logits, 2, normalize=False)
    torch.testing.assert_close(w_raw[1], torch.full((2,), 0.2))


def test_moe_layer_with_tied_router_rows_picks_lowest_experts(micro_target):
    import copy
    layer = copy.deepcopy(micro_target.model.layers[0].mlp)
    with torch.no_grad():
        layer.gate.weight.zero_()       # every expert scores exactly the same (0)
    x = torch.randn(3, micro_target.config.hidden_size)
    chosen = [layer.experts[e](x) for e in (0, 1)]
    expected = 0.5 * chosen[0] + 0.5 * chosen[1] + layer.shared_expert(x)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_taps_are_the_raw_residual_after_each_listed_layer(micro_target):
    ids = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(4))
    _, taps = micro_target(ids, tap_layers=(3, 1, 4))
    pos = torch.arange(6)
    h = micro_target.model.embed_tokens(ids)
    after = []
    for layer in micro_target.model.layers:
        h = layer(h, pos)
        after.append(h)
    assert taps.shape == (2, 6, 3, micro_target.config.hidden_size)
    for slot, layer_idx in enumerate((3, 1, 4)):
        assert torch.equal(taps[:, :, slot], after[layer_idx])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_and_attention_are_row_invariant(dtype):
    # The exactness of cached, chunked and speculative decoding rests on this (issue: batch
    # invariance): a row's result may not depend on how many rows share the call.
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 64, generator=g).to(dtype), torch.randn(48, 64, generator=g).to(dtype)
    full = ops.linear(x, w)
    for m in range(1, 36):
        for start in (0, 5):
            assert torch.equal(ops.linear(x[start:start + m], w), full[start:start + m])
    q, k, v = (torch.randn(1, 20, 4, 16, generator=g).to(dtype) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    ranges = ops.causal_ranges(torch.arange(20), 0, 7)
    whole = ops.attention(q, k, v, ranges)
    assert torch.equal(ops.attention(q[:, 13:15], k, v, ranges[13:15]), whole[:, 13:15])


def test_bf16_model_tracks_fp32(micro_target):
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(5))
    m16 = random_target(micro_target.config, seed=11, dtype=torch.bfloat16)
    assert rel(m16(ids), micro_target(ids)) < BF16_VS_FP32_REL


def test_rope_is_rotate_half_with_theta_power():
    x = torch.randn(1, 1, 8)
    cos, sin = ops.rope_cos_sin(torch.tensor([3]), 8, 10000.0)
    out = ops.apply_rope(x, cos, sin)[0, 0]
    for i in range(4):
        ang = 3 * 10000.0 ** (-2 * i / 8)
        c, s = torch.cos(torch.tensor(ang)), torch.sin(torch.tensor(ang))
        torch.testing.assert_close(out[i], x[0, 0, i] * c - x[0, 0, i + 4] * s)
        torch.testing.assert_close(out[i + 4], x[0, 0, i + 4] * c + x[0, 0, i] * s)
