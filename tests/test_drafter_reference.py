"""KolibriBlockDrafter: naive spec reading, row construction, spine, predecessor, depth."""

from __future__ import annotations

import copy

import pytest
import torch

from naive_kolibri import naive_drafter

# fp32 drafter vs float64 loops over 4 layers
FP32_VS_F64_REL = 1e-5


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _inputs(drafter, target, length, seed=0):
    ids = torch.randint(0, target.config.vocab_size, (1, length + 1),
                        generator=torch.Generator().manual_seed(seed))
    _, taps = target(ids[:, :-1], tap_layers=drafter.config.target_layer_ids)
    return taps[0], ids[0, 1:]


@pytest.mark.parametrize("length", [1, 4, 11])  # 11 > context_window 6: context is cut
def test_propose_matches_naive_spec_reading(micro_drafter, micro_target, length):
    taps, nxt = _inputs(micro_drafter, micro_target, length)
    drafts, logits = micro_drafter.propose(taps, nxt)
    ref_drafts, ref_logits = naive_drafter(
        micro_drafter.state_dict(), micro_drafter.config, micro_target.model.embed_tokens.weight,
        micro_target.lm_head.weight, micro_drafter.draft_vocab, taps, nxt)
    B = micro_drafter.config.block_size
    assert drafts.shape == (B,) and logits.shape == (B, micro_drafter.config.draft_vocab_size)
    assert logits.dtype == torch.float32 and drafts.dtype == torch.long
    assert rel(logits, ref_logits) < FP32_VS_F64_REL
    assert drafts.tolist() == ref_drafts
    assert set(drafts.tolist()) <= set(micro_drafter.draft_vocab.tolist())


def _one(drafter, fused, nxt):
    """block_pass of one stream, stream axis dropped: draft_ids [B], logits [B, Vd], states [B, H]."""
    out = drafter.block_pass(fused, nxt)
    return type(out)(out.draft_ids[0], out.logits[0], out.states[0])


def _variant(drafter, **edits):
    d = copy.deepcopy(drafter)
    with torch.no_grad():
        for name, fn in edits.items():
            fn(dict(d.named_parameters())[name])
    return d


def test_anchor_row_vs_mask_rows(micro_drafter, micro_target):
    taps, nxt = _inputs(micro_drafter, micro_target, 5)
    base = _one(micro_drafter, micro_drafter.fuse_taps(taps), nxt)
    # The mask row feeds rows >= 1 only: row 0 (the anchor's own context row) is unchanged.
    other = _variant(micro_drafter, mask_embedding=lambda p: p.add_(1.0))
    out = _one(other, other.fuse_taps(taps), nxt)
    assert torch.equal(out.logits[0], base.logits[0])
    assert not torch.equal(out.logits[1], base.logits[1])
    # Row 0 is ctx_p = fc(cat(fused_p, E[t_{p+1}])): the anchor's sampled token changes it.
    nxt2 = nxt.clone()
    nxt2[-1] = (nxt2[-1] + 1) % micro_target.config.vocab_size
    out2 = _one(micro_drafter, micro_drafter.fuse_taps(taps), nxt2)
    assert not torch.equal(out2.logits[0], base.logits[0])


def test_spine_leaves_row_zero_untouched(micro_drafter, micro_target):
    taps, nxt = _inputs(micro_drafter, micro_target, 5)
    fused = micro_drafter.fuse_taps(taps)
    base = _one(micro_drafter, fused, nxt)
    other = _variant(micro_drafter, **{f"layers.{l}.spine.U.weight": (lambda p: p.mul_(3.0))
                                      for l in (1, 2, 3)})
    out = _one(other, fused, nxt)
    assert torch.equal(out.states[0], base.states[0])
    assert not torch.equal(out.states[1], base.states[1])
    assert not hasattr(micro_drafter.layers[0], "spine")


def test_spine_reads_states_before_the_layer(micro_drafter):
    layer = micro_drafter.layers[1]
    x = torch.randn(4, micro_drafter.config.hidden_size)
    with torch.no_grad():
        delta = layer.spine(x[:-1])
    expected_rows = torch.cat([x[:1], x[1:] + delta])
    # Feed the spine-updated rows to a copy without a spine: the outputs must agree.
    plain = copy.deepcopy(layer)
    del plain.spine
    ck, cv = layer.kv(torch.randn(3, x.shape[1]), torch.arange(3))
    pos = (3 + torch.arange(4))[None]
    torch.testing.assert_close(layer(x[None], [(ck, cv)], pos),
                               plain(expected_rows[None], [(ck, cv)], pos))


def test_predecessor_head_only_on_rows_from_one(micro_drafter, micro_target):
    taps, nxt = _inputs(micro_drafter, micro_target, 5)
    fused = micro_drafter.fuse_taps(taps)
    base = _one(micro_drafter, fused, nxt)
    other = _variant(micro_drafter, **{"predecessor.B.weight": lambda p: p.mul_(-2.0)})
    out = _one(other, fused, nxt)
    assert torch.equal(out.logits[0], base.logits[0])
    assert all(not torch.equal(out.logits[j], base.logits[j]) for j in range(1, 4))


def test_greedy_ties_go_to_lower_draft_vocab_index(micro_drafter, micro_target):
    d = copy.deepcopy(micro_drafter)
    d.target = type(d.target)(d.target.embed_tokens, torch.zeros_like(d.target.lm_head),
                              d.target.num_hidden_layers)
    taps, nxt = _inputs(d, micro_target, 3)
    drafts, logits = d.propose(taps, nxt)
    assert torch.all(logits == 0)
    assert drafts.tolist() == [int(d.draft_vocab[0])] * d.config.block_size


def test_depth_two_continues_from_the_last_draft(micro_drafter, micro_target):
    taps, nxt = _inputs(micro_drafter, micro_target, 5)
    B = micro_drafter.config.block_size
    drafts, logits = micro_drafter.propose_depth(taps, nxt, depth=2)
    first, first_logits = micro_drafter.propose(taps, nxt)
    assert drafts.shape == (2 * B,) and logits.shape[0] == 2 * B
    assert torch.equal(drafts[:B], first) and torch.equal(logits[:B], first_logits)
    # Pass 2 by hand: positions p+1..p+B get fused states g_0..g_{B-1}, next tokens d_1..d_B.
    fused = micro_drafter.fuse_taps(taps)
    one = _one(micro_drafter, fused, nxt)
    two = _one(micro_drafter, torch.cat([fused, one.states]), torch.cat([nxt, one.draft_ids]))
    assert torch.equal(drafts[B:], two.draft_ids)
    with pytest.raises(ValueError, match="depth"):
        micro_drafter.propose_depth(taps, nxt, depth=0)


def test_propose_checks_input_shapes(micro_drafter, micro_target):
    taps, nxt = _inputs(micro_drafter, micro_target, 3)
    with pytest.raises(ValueError, match="taps"):
        micro_drafter.propose(taps[:, :2], nxt)
    with pytest.raises(ValueError, match="next_token_ids"):
        micro_drafter.propose(taps, nxt[:-1])


@pytest.mark.parametrize("length, depth", [(1, 1), (5, 2), (9, 3)])
def test_cached_proposal_equals_reference_depth(micro_drafter, micro_target, length, depth):
    taps, nxt = _inputs(micro_drafter, micro_target, length)
    d = micro_drafter
    fused = d.fuse_taps(taps)
    p = length - 1
    start = max(0, p - d.config.context_window)
    kv = d.context_kv(d.context_rows(fused[start:p], nxt[start:p]), torch.arange(start, p))
    drafts, logits = d.propose_cached(fused[p:p + 1], nxt[p:p + 1], [p], [kv], depth)
    drafts, logits = drafts[0], logits[0]
    ref_drafts, ref_logits = d.propose_depth(taps, nxt, depth)
    assert torch.equal(drafts, ref_drafts)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)


def test_batched_streams_equal_each_stream_alone(micro_drafter, micro_target):
    d, depth = micro_drafter, 2
    inputs = [_inputs(d, micro_target, n, seed=n) for n in (2, 5, 9)]
    args = []
    for taps, nxt in inputs:
        fused = d.fuse_taps(taps)
        p = fused.shape[0] - 1
        start = max(0, p - d.config.context_window)
        kv = d.context_kv(d.context_rows(fused[start:p], nxt[start:p]), torch.arange(start, p))
        args.append((fused[p], nxt[p], p, kv))
    drafts, logits = d.propose_cached(torch.stack([a[0] for a in args]),
                                      torch.stack([a[1] for a in args]),
                                      [a[2] for a in args], [a[3] for a in args], depth)
    for s, (taps, nxt) in enumerate(inputs):
        ref_d, ref_l = d.propose_depth(taps, nxt, depth)
        assert torch.equal(drafts[s], ref_d)
        torch.testing.assert_close(logits[s], ref_l, rtol=1e-5, atol=1e-5)
