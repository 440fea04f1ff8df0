"""QK-norm + rotation fold + INT4 cache write (plugins/qk_norm_fold_int4.py)."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.qk_norm_fold_int4 import (dequantize_int4_ref, fold_matrices,
                                                   hadamard_rotation, int4_rows, qk_norm_fold_int4,
                                                   qk_norm_fold_int4_ref, quantize_int4_ref, rms)

FOLD_SCORE_RTOL = 1e-5   # fp32 products of an orthogonal rotation: rounding only
Q_OUT_TOL = 1e-2         # bf16 output (2^-9) of an fp32 128x128 product, interpreter truncates bf16
CODE_FLIP_FRAC = 2e-2    # codes may move by one step at rounding boundaries (fp32 sum order)


def caches(nb, blk, hkv):
    """Empty head-major pages: key codes [nb, hkv, blk, 64], value codes [nb, hkv, 64, blk]
    (dim-major), meta [nb, hkv, blk, 2]."""
    return ([torch.zeros(shape, dtype=torch.uint8) for shape in ((nb, hkv, blk, 64),
                                                                 (nb, hkv, 64, blk))]
            + [torch.zeros((nb, hkv, blk, 2), dtype=torch.float16) for _ in range(2)])


def token_major(c):
    """The value codes viewed [nb, hkv, blk, 64], like the keys'."""
    return [x.transpose(2, 3) if i == 1 else x for i, x in enumerate(c)]


def test_rotation_is_orthogonal_and_fold_keeps_scores():
    r = hadamard_rotation(3)
    assert torch.allclose(r @ r.T, torch.eye(128), atol=1e-6)
    g = T.gen(0)
    q, k = torch.randn(7, 128, generator=g), torch.randn(9, 128, generator=g)
    gq, gk = 1 + 0.2 * torch.randn(128, generator=g), 1 + 0.2 * torch.randn(128, generator=g)
    mq, mk = fold_matrices(gq, gk, r)
    stock = (rms(q, 1e-6) * gq) @ (rms(k, 1e-6) * gk).T
    folded = (rms(q, 1e-6) @ mq.T) @ (rms(k, 1e-6) @ mk.T).T
    assert torch.allclose(folded, stock, rtol=FOLD_SCORE_RTOL, atol=FOLD_SCORE_RTOL * 10)


def test_int4_quantize_format():
    x = torch.linspace(-1, 2, 128)[None]
    codes, meta = quantize_int4_ref(x)
    assert codes.shape == (1, 64) and meta.dtype == torch.float16
    assert int(codes[0, 0]) & 15 == 0 and int(codes[0, 63]) >> 4 == 15  # min -> 0, max -> 15
    scale = meta[0, 0].float()
    assert abs(scale - 3 / 15) < 1e-3 and abs(meta[0, 1].float() + 1) < 1e-3
    err = (dequantize_int4_ref(codes, meta) - x).abs().max()
    assert err <= scale / 2 + 1e-3  # round to nearest: at most half a step (+ fp16 offset rounding)
    # element 2i is the low nibble
    c, _ = quantize_int4_ref(torch.tensor([[0.0, 15.0] + [0.0] * 126]))
    assert int(c[0, 0]) == 0xF0


def test_int4_rows_address_head_major_pages():
    """int4_rows(slots) are the flat rows of [block, head, offset] in [nb, Hkv, BLOCK, X]."""
    nb, hkv, blk = 3, 4, 16
    cache = torch.arange(nb * hkv * blk).view(nb, hkv, blk, 1)
    slots = torch.tensor([0, 5, 16, 47, 33])
    rows = int4_rows(slots, hkv, blk)
    want = torch.stack([cache[int(s) // blk, :, int(s) % blk, 0] for s in slots])
    assert torch.equal(cache.view(-1, 1)[rows][..., 0], want)


def test_int4_constant_row_guard():
    codes, meta = quantize_int4_ref(torch.full((2, 128), 0.75))
    assert torch.all(codes == 0) and torch.all(meta[..., 0] == 0)
    assert torch.allclose(dequantize_int4_ref(codes, meta), torch.full((2, 128), 0.75))


def fold_inputs(T_, seed, hq=4, hkv=2, nb=4, blk=16):
    g = T.gen(seed)
    q = T.randn((T_, hq, 128), g, scale=2.0)
    k = T.randn((T_, hkv, 128), g, scale=2.0)
    v = T.randn((T_, hkv, 128), g)
    mq, mk = fold_matrices(1 + 0.1 * torch.randn(128, generator=g),
                           1 + 0.1 * torch.randn(128, generator=g), hadamard_rotation(seed), 0.1)
    slots = torch.randperm(nb * blk, generator=g)[:T_]
    if T_ > 1:
        slots[1] = -1
    return q, k, v, mq, mk, slots, caches(nb, blk, hkv)


def test_cpu_op_is_reference_and_skips_negative_slots():
    q, k, v, mq, mk, slots, c = fold_inputs(3, 1)
    c_ref = [x.clone() for x in c]
    out = qk_norm_fold_int4(q, k, v, mq, mk, slots, *c)
    ref = qk_norm_fold_int4_ref(q, k, v, mq, mk, slots, *c_ref, 1e-6)
    assert torch.equal(out, ref) and all(torch.equal(a, b) for a, b in zip(c, c_ref))
    per_slot = c[0].transpose(1, 2).reshape(-1, c[0].shape[1] * 64)   # [block·BLOCK + off, ..]
    written = int((per_slot.abs().sum(-1) > 0).sum())
    assert written == 2  # slots[1] == -1 is not written


@pytest.mark.parametrize("T_, hq, hkv", [(1, 4, 2), (3, 4, 2), (33, 4, 2), (3, 20, 4),
                                         (2, 33, 3)])
def test_interpreter_matches_reference(interp, T_, hq, hkv):
    """Query heads split over programs of Q_ROWS (20 -> 16 + 4, 33 -> 16 + 16 + 1)."""
    q, k, v, mq, mk, slots, c = fold_inputs(T_, 10 + T_, hq=hq, hkv=hkv)
    c_ref = [x.clone() for x in c]
    out = qk_norm_fold_int4(q, k, v, mq, mk, slots, *c, interpret=True)
    ref = qk_norm_fold_int4_ref(q, k, v, mq, mk, slots, *c_ref, 1e-6)
    assert T.rel_err(out, ref) < Q_OUT_TOL
    flips = sum(int((a != b).sum()) for a, b in zip(c[:2], c_ref[:2]))
    assert flips <= CODE_FLIP_FRAC * c[0].numel() * 2
    tc, tr = token_major(c), token_major(c_ref)
    for i in (0, 1):
        d = (dequantize_int4_ref(tc[i], tc[i + 2]) - dequantize_int4_ref(tr[i], tr[i + 2]))
        assert d.abs().max() <= c_ref[i + 2][..., 0].float().max() * 1.01 + 1e-3


def test_errors_name_the_argument():
    q, k, v, mq, mk, slots, c = fold_inputs(3, 2)
    with pytest.raises(ValueError, match="^k:"):
        qk_norm_fold_int4(q, k.float(), v, mq, mk, slots, *c)
    with pytest.raises(ValueError, match="^m_q:"):
        qk_norm_fold_int4(q, k, v, mq[:64], mk, slots, *c)
    with pytest.raises(ValueError, match="^slot_mapping:"):
        qk_norm_fold_int4(q, k, v, mq, mk, slots.int(), *c)
    with pytest.raises(ValueError, match="^v_meta:"):
        qk_norm_fold_int4(q, k, v, mq, mk, slots, c[0], c[1], c[2], c[3].float())
    with pytest.raises(ValueError, match="^q:"):
        qk_norm_fold_int4(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, mq, mk, slots, *c)
