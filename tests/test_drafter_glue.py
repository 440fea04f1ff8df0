"""`kolibri_trt/drafter/plugin_glue.py` (the drafter's few-launch torch glue) against the plain
formulations it replaces, bit for bit on CPU: RoPE (`ops.rope_tables` + `ops.apply_rope`), the
ring's visibility mask and the ring attention (per-tensor gathers, `masked_fill`, `.to`)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kolibri_trt.drafter.plugin_glue import (apply_rope_rotation, ring_attention, rope_rotation,
                                             rope_table, visible_rows)
from kolibri_trt.model import ops


@pytest.mark.parametrize("t,heads,d", [(1, 1, 128), (7, 3, 128), (13, 5, 64), (4, 2, 16)])
def test_rope_rotation_is_apply_rope_bit_for_bit(t, heads, d):
    g = torch.Generator().manual_seed(t * 31 + heads)
    positions = torch.cat([torch.tensor([-1, 0, 2047, 262143, 3_000_001]),
                           torch.randint(0, 1 << 20, (t,), generator=g)])[:max(t, 5)]
    inv = ops.rope_inv_freq(d, 10000.0)
    cos, sin = ops.rope_tables(positions, inv)
    m = rope_rotation(positions, inv[:d // 2].contiguous())
    assert torch.equal(m[:, 0, 0], cos[:, :d // 2]) and torch.equal(m[:, 1, 1], cos[:, d // 2:])
    assert torch.equal(m[:, 0, 1], -sin[:, :d // 2]) and torch.equal(m[:, 1, 0], sin[:, d // 2:])
    n = positions.shape[0]
    wide = (torch.randn(n, heads + 2, d, generator=g) * 4).to(torch.bfloat16)
    x = wide[:, 1:heads + 1]                              # a strided view, as the QKV slices
    want = ops.apply_rope(x, cos, sin)
    assert torch.equal(apply_rope_rotation(x, m), want)
    apply_rope_rotation(x, m, out=x)                      # in place, as `_layer` runs it
    assert torch.equal(x, want)


@pytest.mark.parametrize("d", [128, 64, 16])
def test_rope_table_rows_are_rope_rotation_bit_for_bit(d):
    """`rope_table` (made once) holds in row t the bits `rope_rotation` gives position t in a
    step of any size."""
    inv = ops.rope_inv_freq(d, 10000.0)[:d // 2].contiguous()
    table = rope_table(4200, inv)
    assert table.shape == (4200, 2, 2, d // 2) and table.dtype == torch.float32
    g = torch.Generator().manual_seed(d)
    for t in (1, 8, 37, 300):
        pos = torch.randint(0, 4200, (t,), generator=g)
        assert torch.equal(table.index_select(0, pos), rope_rotation(pos, inv))
    assert torch.equal(table, rope_rotation(torch.arange(4200), inv))


def test_visible_rows_matches_the_three_comparisons():
    g = torch.Generator().manual_seed(3)
    ring_pos = torch.randint(-1, 60, (5, 24), generator=g)
    ring_pos[1, :7] = -1
    slots = torch.tensor([1, 4, 0])
    anchors = torch.tensor([3, 40, 17])
    pos = anchors[:, None] + torch.arange(4)
    for cw, length in ((8, 24), (2, 16), (100, 24)):
        rp = ring_pos[:, :length].index_select(0, slots)[:, None, :]
        lo = (anchors - cw)[:, None, None]
        want = (rp >= 0) & (rp >= lo) & (rp <= pos[:, :, None])
        assert torch.equal(visible_rows(ring_pos, slots, anchors, pos, cw, length), want)


def _attention_per_tensor(q, ring_k, ring_v, slots, visible, length, impl):
    """The formulation `ring_attention` replaces (`DrafterPlugin._attend` before it)."""
    s, b, hq, d = q.shape
    hkv = ring_k.shape[2]
    g = hq // hkv
    k = ring_k[:, :length].index_select(0, slots).transpose(1, 2)
    v = ring_v[:, :length].index_select(0, slots).transpose(1, 2)
    qg = q.reshape(s, b, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(s, hkv, g * b, d)
    vis = visible[:, None, None].expand(s, 1, g, b, length).reshape(s, 1, g * b, length)
    if impl == "sdpa":
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=vis)
    else:
        scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)) / math.sqrt(d)
        probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)
        out = torch.matmul(probs, v.float())
    return out.view(s, hkv, g, b, d).permute(0, 3, 1, 2, 4).reshape(s * b, hq * d).to(
        torch.bfloat16)


@pytest.mark.parametrize("impl", ["dense", "sdpa"])
@pytest.mark.parametrize("s,hq,hkv,length", [(1, 1, 1, 12), (3, 2, 2, 20), (5, 4, 2, 17),
                                             (2, 6, 3, 9)])
def test_ring_attention_matches_the_per_tensor_formulation(impl, s, hq, hkv, length):
    g = torch.Generator().manual_seed(s * 7 + hq)
    b, d, slots_n, r = 4, 128, 6, 24
    kv = torch.randn(2, slots_n + 1, r, hkv, d, generator=g).to(torch.bfloat16)
    qkv = torch.randn(s * b, (hq + 2 * hkv) * d, generator=g).to(torch.bfloat16)
    q = qkv[:, :hq * d].view(s, b, hq, d)                 # a strided view, as in `_layer`
    slots = torch.randperm(slots_n + 1, generator=g)[:s]
    visible = torch.rand(s, b, length, generator=g) < 0.6
    visible[..., 0] = True                                 # every row sees one key at least
    want = _attention_per_tensor(q, kv[0], kv[1], slots, visible, length, impl)
    assert torch.equal(ring_attention(q, kv, slots, visible, length, impl), want)
