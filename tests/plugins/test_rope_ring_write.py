"""The drafter's RoPE + ring write (plugins/rope_ring_write.py): the Triton kernel in the
interpreter against the plain-torch reference and against the drafter's torch glue
(`plugin_glue.rope_rotation` + `apply_rope_rotation` + the ring's index_put), bit for bit,
over odd token counts, GQA shapes, scattered ring rows, the trash slot, strided / expanded
index views, and argument checks."""

import pytest
import torch
from kolibri_trt_plugins import rope_ring_write
from kolibri_trt_plugins.rope_ring_write import rope_ring_write_ref

from kolibri_trt.drafter.plugin_glue import apply_rope_rotation, rope_rotation

SLOTS, R = 4, 23                 # ring slots 0..3, trash slot 4


def inputs(t, hq, hkv, d, seed):
    """(qkv strided view, m, kv, slots, rows): positions spread over thousands (large angles),
    rows scattered over the ring, the last token padding (trash slot, position -1)."""
    g = torch.Generator().manual_seed(seed)
    width = (hq + 2 * hkv) * d
    big = (torch.randn(t, width + 8, generator=g) * 3).to(torch.bfloat16)
    qkv = big[:, 3:3 + width]                                    # row stride width + 8
    pos = torch.randint(0, 5000, (t,), generator=g)
    slots = torch.randint(0, SLOTS, (t,), generator=g)
    if t > 1:
        pos[-1], slots[-1] = -1, SLOTS
    inv_half = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    m = rope_rotation(pos, inv_half)
    rows = pos.remainder(R)                                      # padding: row R - 1
    rows[:t - 1] = torch.randperm(R - 1, generator=g)[:t - 1]    # distinct, scattered
    kv = torch.randn(2, SLOTS + 1, R, hkv, d, generator=g).to(torch.bfloat16)
    return qkv, m, kv, slots, rows


def glue(qkv, m, kv, slots, rows, hq):
    """The drafter's torch glue (before the plugin): rotate q, k in place, one ring write."""
    t = qkv.shape[0]
    hkv, d = kv.shape[3], kv.shape[4]
    qk = qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d)
    apply_rope_rotation(qk, m, out=qk)
    kv[:, slots, rows] = qkv[:, hq * d:].view(*slots.shape, 2, hkv, d).movedim(-3, 0)


def run(fn, args, hq):
    qkv, m, kv, slots, rows = (a.clone() for a in args)
    fn(qkv, m, kv, slots, rows, hq)
    return qkv, kv


def interp_fn(qkv, m, kv, slots, rows, hq):
    rope_ring_write(qkv, m, kv, slots, rows, hq, interpret=True)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (8, 1), (0, 2)])
@pytest.mark.parametrize("t", [1, 3, 17])
def test_interpreter_ref_and_glue_are_bit_identical(interp_rne, t, hq, hkv, d):
    args = inputs(t, hq, hkv, d, seed=t * 100 + hq * 10 + d)
    q_i, kv_i = run(interp_fn, args, hq)
    q_r, kv_r = run(rope_ring_write_ref, args, hq)
    q_g, kv_g = run(glue, args, hq)
    qd = hq * d
    for q_x, kv_x in ((q_i, kv_i), (q_r, kv_r)):
        assert torch.equal(q_x[:, :qd].view(torch.int16), q_g[:, :qd].view(torch.int16))
        assert torch.equal(kv_x.view(torch.int16), kv_g.view(torch.int16))
        # k and v columns of qkv are not touched
        assert torch.equal(q_x[:, qd:], args[0][:, qd:])
    written = kv_i[:, args[3], args[4]]
    assert not torch.equal(written, args[2][:, args[3], args[4]])
    if t > 1:                                                  # the padding token's row
        assert torch.equal(kv_i[:, SLOTS, args[4][-1]], kv_g[:, SLOTS, args[4][-1]])


def test_expanded_2d_indices_and_int32(interp_rne):
    """The drafter's propose call: slots an expanded [S, B] view, rows [S, B]; int32 too."""
    s, b, hq, hkv, d = 3, 4, 4, 2, 64
    qkv, m, kv, _, _ = inputs(s * b, hq, hkv, d, seed=7)
    slots = torch.tensor([2, 0, SLOTS])[:, None].expand(s, b)
    rows = torch.tensor([[5, 6, 7, 8], [21, 22, 0, 1], [3, 3, 3, 3]])   # wrap; trash dupes
    args = (qkv, m, kv, slots, rows)
    q_g, kv_g = run(glue, args, hq)
    for idx in (torch.int64, torch.int32):
        a = (qkv, m, kv, slots.to(idx), rows.to(idx))
        for fn in (interp_fn, rope_ring_write_ref):
            q_x, kv_x = run(fn, a, hq)
            assert torch.equal(q_x[:, :hq * d], q_g[:, :hq * d])
            assert torch.equal(kv_x[:, :SLOTS], kv_g[:, :SLOTS])      # trash: dupes, any order
            assert torch.equal(kv_x[:, SLOTS, 4:], kv_g[:, SLOTS, 4:])


def test_cpu_op_runs_the_reference():
    args = inputs(5, 2, 1, 64, seed=3)
    q_o, kv_o = run(lambda *a: rope_ring_write(*a), args, 2)
    q_r, kv_r = run(rope_ring_write_ref, args, 2)
    assert torch.equal(q_o, q_r) and torch.equal(kv_o, kv_r)


def test_empty_batch_writes_nothing(interp):
    qkv, m, kv, slots, rows = inputs(1, 2, 1, 64, seed=4)
    kv0 = kv.clone()
    rope_ring_write(qkv[:0], m[:0], kv, slots[:0], rows[:0], 2, interpret=True)
    assert torch.equal(kv, kv0)


@pytest.mark.parametrize("change,match", [
    (lambda a: {"qkv": a["qkv"].float()}, "^qkv:"),
    (lambda a: {"qkv": a["qkv"][:, :-2]}, "^qkv:"),
    (lambda a: {"qkv": a["qkv"].t().contiguous().t()}, "^qkv:"),
    (lambda a: {"m": a["m"].double()}, "^m:"),
    (lambda a: {"m": a["m"][:2]}, "^m:"),
    (lambda a: {"kv": a["kv"][:1]}, "^kv:"),
    (lambda a: {"kv": a["kv"].transpose(1, 2)}, "^kv:"),
    (lambda a: {"slots": a["slots"].float()}, "^slots:"),
    (lambda a: {"slots": a["slots"][:2]}, "^slots:"),
    (lambda a: {"rows": a["rows"].view(1, -1)}, "^rows:"),
    (lambda a: {"num_q_heads": -1}, "^num_q_heads:"),
    (lambda a: {"slots": a["slots"].to("meta")}, "^slots:"),
])
def test_argument_errors(change, match):
    qkv, m, kv, slots, rows = inputs(3, 2, 1, 64, seed=5)
    a = {"qkv": qkv, "m": m, "kv": kv, "slots": slots, "rows": rows, "num_q_heads": 2}
    a.update(change(a))
    with pytest.raises(ValueError, match=match):
        rope_ring_write(**a)
