"""Per-head QK RMSNorm + RoPE (plugins/qk_norm_rope.py): the reference against the unfused
kolibri_trt.model.ops composition (bit for bit), the Triton kernel in the interpreter against the
reference on strided views of a fused QKV output, batch invariance, argument checks."""

import pytest
import torch

from kolibri_trt.model import ops
from kolibri_trt_plugins import qk_norm_rope
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.qk_norm_rope import qk_norm_rope_ref

EPS = 1e-6
THETA = 1e6
D = 128
# The interpreter (numpy) sums the squares in another order than torch and computes rsqrt
# another way: a normalised value may move by one bf16 ulp, rarely, and RoPE mixes it into
# two outputs (so the bound is in units of the head's largest value, not of each output).
FLIP_FRAC = 2e-3
ABS_TOL_OF_MAX = 2 ** -7  # one bf16 ulp of the head's largest |value|, times the rotation
HEADS = [(4, 2), (20, 4)]
TOKENS = [1, 3, 33, 511]


def fused_qkv(t, hq, hkv, seed, pad=0):
    """q, k, v as views of one [T, (Hq + 2 Hkv) * 128 + pad] bf16 buffer (the GEMV's output);
    pad > 0 makes the token stride differ from the packed width."""
    g = T.gen(seed)
    qkv = T.randn((t, (hq + 2 * hkv) * D + pad), g, scale=3.0)
    q = qkv[:, :hq * D].unflatten(1, (hq, D))
    k = qkv[:, hq * D:(hq + hkv) * D].unflatten(1, (hkv, D))
    gq = (1 + 0.2 * torch.randn(D, generator=g)).to(torch.bfloat16)
    gk = (1 + 0.2 * torch.randn(D, generator=g)).to(torch.bfloat16)
    pos = torch.randint(0, 40000, (t,), generator=g)
    cos, sin = ops.rope_cos_sin(pos, D, THETA)
    return q, k, gq, gk, cos, sin


def unfused(q, k, gq, gk, cos, sin, rope):
    """The code qk_norm_rope replaces in PluginModel._attention."""
    q, k = ops.rms_norm(q, gq, EPS), ops.rms_norm(k, gk, EPS)
    if rope:
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
    return q.contiguous(), k


def assert_close_bits(out, ref):
    flips = (out != ref).float().mean().item()
    scale = ref.float().abs().amax(-1, keepdim=True)
    err = ((out.float() - ref.float()).abs() - ABS_TOL_OF_MAX * scale).max().item()
    assert flips <= FLIP_FRAC and err <= 0, (flips, err)


@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("rope", [True, False])
def test_reference_is_the_ops_composition_bit_for_bit(hq, hkv, t, rope):
    q, k, gq, gk, cos, sin = fused_qkv(t, hq, hkv, t + hq, pad=64 if t % 2 else 0)
    assert t == 1 or not (q.is_contiguous() or k.is_contiguous())
    q_want, k_want = unfused(q, k, gq, gk, cos, sin, rope)
    for qo, ko in (qk_norm_rope_ref(q, k, gq, gk, cos, sin, EPS, rope),
                   qk_norm_rope(q, k, gq, gk, cos, sin, EPS, rope=rope)):   # ref, CPU op
        assert torch.equal(qo, q_want) and torch.equal(ko, k_want)
        assert qo.is_contiguous() and ko.is_contiguous() and qo.dtype == torch.bfloat16


@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("rope", [True, False])
def test_interpreter_matches_reference(interp_rne, hq, hkv, t, rope):
    q, k, gq, gk, cos, sin = fused_qkv(t, hq, hkv, 3 * t + hq, pad=32 if t % 2 else 0)
    qo, ko = qk_norm_rope(q, k, gq, gk, cos, sin, EPS, rope=rope, interpret=True)
    qr, kr = qk_norm_rope_ref(q, k, gq, gk, cos, sin, EPS, rope)
    assert qo.shape == (t, hq, D) and ko.shape == (t, hkv, D)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert_close_bits(qo, qr)
    assert_close_bits(ko, kr)


def test_interpreter_without_rope_ignores_tables(interp):
    q, k, gq, gk, cos, sin = fused_qkv(3, 4, 2, 5)
    a = qk_norm_rope(q, k, gq, gk, None, None, EPS, rope=False, interpret=True)
    b = qk_norm_rope(q, k, gq, gk, cos, sin, EPS, rope=False, interpret=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("rope", [True, False])
def test_kernel_tokens_are_batch_invariant(interp, hq, hkv, rope):
    """A token computed alone gives the same bits as inside a batch of 33 (interpreter)."""
    q, k, gq, gk, cos, sin = fused_qkv(33, hq, hkv, hq + 11)
    qb, kb = qk_norm_rope(q, k, gq, gk, cos, sin, EPS, rope=rope, interpret=True)
    for i in (0, 16, 32):
        s = slice(i, i + 1)
        q1, k1 = qk_norm_rope(q[s], k[s], gq, gk, cos[s], sin[s], EPS, rope=rope, interpret=True)
        assert torch.equal(q1, qb[s]) and torch.equal(k1, kb[s])


def test_empty_batch():
    q, k, gq, gk, cos, sin = fused_qkv(0, 4, 2, 0)
    qo, ko = qk_norm_rope(q, k, gq, gk, cos, sin, EPS)
    assert qo.shape == (0, 4, D) and ko.shape == (0, 2, D)


def test_bad_arguments_name_themselves():
    q, k, gq, gk, cos, sin = fused_qkv(3, 4, 2, 1)
    with pytest.raises(ValueError, match="^q:"):
        qk_norm_rope(q.float(), k, gq, gk, cos, sin, EPS)
    with pytest.raises(ValueError, match="^q:"):
        qk_norm_rope(q.transpose(1, 2).contiguous().transpose(1, 2), k, gq, gk, cos, sin, EPS)
    with pytest.raises(ValueError, match="^k:"):
        qk_norm_rope(q, k[:2], gq, gk, cos, sin, EPS)
    with pytest.raises(ValueError, match="^k:"):
        qk_norm_rope(q, k[..., :64], gq, gk, cos, sin, EPS)
    with pytest.raises(ValueError, match="^q_norm:"):
        qk_norm_rope(q, k, gq.float(), gk, cos, sin, EPS)
    with pytest.raises(ValueError, match="^k_norm:"):
        qk_norm_rope(q, k, gq, gk[:64], cos, sin, EPS)
    with pytest.raises(ValueError, match="^cos:"):
        qk_norm_rope(q, k, gq, gk, None, sin, EPS)
    with pytest.raises(ValueError, match="^sin:"):
        qk_norm_rope(q, k, gq, gk, cos, sin.double(), EPS)
    with pytest.raises(ValueError, match="^cos:"):
        qk_norm_rope(q, k, gq, gk, cos[:2], sin, EPS)
    qk_norm_rope(q, k, gq, gk, None, None, EPS, rope=False)   # no tables needed without RoPE
