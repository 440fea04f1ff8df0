"""The drafter's ring attention (plugins/ring_attention.py): the Triton kernel in the interpreter
against the plain-torch reference over rings with wrap-around, empty rows, stale provisional
rows and a cutting context window; batch invariance of the kernel; rows that see no key;
argument checks."""

import importlib
import math

import pytest
import torch

from kolibri_trt_plugins import ring_attention
from kolibri_trt_plugins.ring_attention import ring_attention_ref

# The kernel rounds the softmax probabilities to bf16 for the P·V product (the reference keeps
# them fp32) and sums in another order: |error| <= ~2^-9 of the largest |v| per output, plus the
# output's own bf16 rounding (2^-8 relative); |v| <= ~4 here.
ATOL, RTOL = 2e-2, 1e-2
SLOTS, R, B = 5, 300, 4


def ring(hkv, d, seed):
    """(kv, ring_pos, slots, anchors, pos) like the drafter's: per slot a stream's positions
    0 .. p+B-1 written at row position % R (wrapping for p >= R - B), a few stale provisional
    rows (positions past p+B-1, masked by position), empty rows (-1) in a short stream, a
    trash slot; streams in slots 3, 0, 4 (the trash slot)."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, SLOTS + 1, R, hkv, d, generator=g).to(torch.bfloat16)
    ring_pos = torch.full((SLOTS + 1, R), -1, dtype=torch.long)
    slots = torch.tensor([3, 0, SLOTS])
    anchors = torch.tensor([450, 20, 0])           # wraps; short (empty rows); padding stream
    for slot, p in zip(slots.tolist(), anchors.tolist()):
        end = p + B + (2 * B if slot != SLOTS else 0)   # + stale provisional rows
        for q in range(max(end - R, 0), end):
            ring_pos[slot, q % R] = q
    for slot in (1, 2, 4):                          # other streams' rows: never read
        ring_pos[slot] = torch.randint(-1, 600, (R,), generator=g)
    pos = anchors[:, None] + torch.arange(B)
    return kv, ring_pos, slots, anchors, pos


def queries(s, hq, hkv, d, seed):
    """q bf16 [S, B, Hq, D] as a strided view (the q columns of a fused QKV product)."""
    g = torch.Generator().manual_seed(seed + 1)
    qkv = (torch.randn(s * B, (hq + 2 * hkv) * d, generator=g) * 2).to(torch.bfloat16)
    return qkv[:, :hq * d].view(s, B, hq, d)


def case(s, hq, hkv, d, window, seed=0):
    kv, ring_pos, slots, anchors, pos = ring(hkv, d, seed + hq * 7 + d)
    q = queries(s, hq, hkv, d, seed + hkv)
    return q, kv, ring_pos, slots[:s], anchors[:s], pos[:s]


@pytest.mark.parametrize("length", [1, 37, 300])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (8, 1)])
@pytest.mark.parametrize("s", [1, 3])
def test_interpreter_matches_reference(interp_rne, s, hq, hkv, d, length):
    window = 64 if d == 64 else 200                 # cuts the wrapped stream's context
    q, kv, ring_pos, slots, anchors, pos = case(s, hq, hkv, d, window)
    args = (q, kv, ring_pos, slots, anchors, pos, window, length)
    got = ring_attention(*args, interpret=True)
    want = ring_attention_ref(*args)
    assert got.shape == (s * B, hq * d) and got.dtype == torch.bfloat16 and got.is_contiguous()
    assert torch.isfinite(want).all()
    err = (got.float() - want.float()).abs()
    assert (err <= ATOL + RTOL * want.float().abs()).all(), err.max().item()
    assert torch.equal(ring_attention(*args), want)     # the CPU op is the reference


def test_split_rows_change_only_the_summation_order(interp_rne, monkeypatch):
    """length 300 runs 3 programs per (stream, head) and `attn_combine`; with one split (a
    SPLIT_ROWS above the length) the kernel writes the output itself. Both are the reference
    within the kernel's tolerance, and they differ only by summation order."""
    module = importlib.import_module("kolibri_trt_plugins.ring_attention")
    assert module.num_splits(300, 128) == 3 and module.num_splits(128, 128) == 1
    assert module.num_splits(300, 96) == 1          # D not a power of two: one program
    args = case(3, 4, 2, 128, 200)
    split = ring_attention(*args, 200, 300, interpret=True)
    monkeypatch.setattr(module, "SPLIT_ROWS", 512)
    assert module.num_splits(300, 128) == 1
    whole = ring_attention(*args, 200, 300, interpret=True)
    want = ring_attention_ref(*args, 200, 300).float()
    for got in (split, whole):
        assert ((got.float() - want).abs() <= ATOL + RTOL * want.abs()).all()
    assert ((split.float() - whole.float()).abs() <= ATOL + RTOL * want.abs()).all()


def test_reference_is_the_dense_glue_where_every_row_sees_a_key():
    """ring_attention_ref == plugin_glue.ring_attention("dense") with visible_rows, bit for bit."""
    from kolibri_trt.drafter.plugin_glue import ring_attention as glue, visible_rows
    q, kv, ring_pos, slots, anchors, pos = case(3, 4, 2, 128, 100)
    for window, length in ((100, 300), (8, 300), (300, 300)):
        vis = visible_rows(ring_pos, slots, anchors, pos, window, length)
        want = glue(q, kv, slots, vis, length, "dense")
        got = ring_attention_ref(q, kv, ring_pos, slots, anchors, pos, window, length)
        assert torch.equal(got, want)


def test_rows_without_a_visible_key_are_zeros(interp_rne):
    """length 1: stream 0 (anchor 450, window 64) sees only position 300 (out of its window),
    stream 1 only an emptied row: zeros (the dense glue gives NaN there); stream 2 sees one."""
    q, kv, ring_pos, slots, anchors, pos = case(3, 4, 2, 64, 64)
    ring_pos[slots[1], 0] = -1                      # stream 1: ring row 0 empty
    args = (q, kv, ring_pos, slots, anchors, pos, 64, 1)
    want = ring_attention_ref(*args)
    got = ring_attention(*args, interpret=True)
    assert torch.equal(want[:2 * B], torch.zeros(2 * B, 4 * 64, dtype=torch.bfloat16))
    assert torch.equal(got[:2 * B], want[:2 * B]) and want[2 * B:].abs().sum() > 0


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (8, 1, 128)])
def test_kernel_streams_are_batch_invariant(interp, hq, hkv, d):
    """A stream computed alone gives the same bits as inside a batch of 3 (interpreter)."""
    q, kv, ring_pos, slots, anchors, pos = case(3, hq, hkv, d, 64)
    q = q.contiguous()
    full = ring_attention(q, kv, ring_pos, slots, anchors, pos, 64, 300, interpret=True)
    for i in range(3):
        one = ring_attention(q[i:i + 1], kv, ring_pos, slots[i:i + 1], anchors[i:i + 1],
                             pos[i:i + 1], 64, 300, interpret=True)
        assert torch.equal(one, full[i * B:(i + 1) * B])


def test_bad_arguments_name_themselves():
    q, kv, ring_pos, slots, anchors, pos = case(3, 4, 2, 64, 64)
    good = dict(q=q, kv=kv, ring_pos=ring_pos, slots=slots, anchors=anchors, pos=pos,
                context_window=64, length=37)
    bad = {
        "q": [q.float(), q[..., :32], q.transpose(2, 3), q[0]],
        "kv": [kv.float(), kv[:, :, :, :1], kv[:1], kv[..., :32]],
        "ring_pos": [ring_pos.float(), ring_pos[:, :10], ring_pos.t().contiguous().t()],
        "slots": [slots[:2], slots.float()],
        "anchors": [anchors[:2], anchors.to(torch.int16)],
        "pos": [pos[:, :2], pos[:2], pos.float()],
        "length": [0, R + 1],
        "context_window": [-1],
    }
    for name, values in bad.items():
        for v in values:
            with pytest.raises(ValueError, match=f"^{name}:"):
                ring_attention(**{**good, name: v})
    # 3 query heads over 2 KV heads
    with pytest.raises(ValueError, match="^kv:"):
        ring_attention(**{**good, "q": queries(3, 3, 2, 64, 0)})
    assert math.isfinite(float(ring_attention(**good).float().abs().max()))
