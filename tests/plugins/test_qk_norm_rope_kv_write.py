"""QK-norm + RoPE fused with the FP8 cache write (plugins/qk_norm_rope_kv_write.py): the same
q and cache bytes as qk_norm_rope followed by fp8_kv_write, on the CPU path and in the
interpreter (both paths through the interpreter's own float8 cast, so equal bytes are
expected whatever that cast's rounding)."""

import pytest
import torch

from kolibri_trt_plugins import fp8_kv_write, qk_norm_rope, qk_norm_rope_kv_write
from kolibri_trt_plugins import testing as T

EPS = 1e-6


def case(t, hkv, seed, rope=True):
    g = T.gen(seed)
    hq = 5 * hkv
    qkv = T.randn((t, hq + 2 * hkv, 128), g, scale=3.0)   # one fused QKV row per token
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    gq, gk = (1 + 0.2 * torch.randn(128, generator=g)).to(torch.bfloat16), \
        (1 + 0.2 * torch.randn(128, generator=g)).to(torch.bfloat16)
    ang = torch.rand((t, 128), generator=g) * 6.0
    cos, sin = (ang.cos(), ang.sin()) if rope else (None, None)
    slots = torch.randperm(7 * 16, generator=g)[:t]
    slots[1::3] = -1
    caches = T.fp8_cache(7, 16, hkv, g)
    scales = torch.tensor([0.05]), torch.tensor([0.03])
    return q, k, v, gq, gk, cos, sin, slots, caches, scales


def both(t, hkv, seed, rope, interpret):
    q, k, v, gq, gk, cos, sin, slots, (kc, vc), (ks, vs) = case(t, hkv, seed, rope)
    kc2, vc2 = kc.clone(), vc.clone()
    before = kc.clone()
    got = qk_norm_rope_kv_write(q, k, v, gq, gk, cos, sin, slots, kc, vc, ks, vs, EPS, rope=rope,
                                interpret=interpret)
    q_want, k_want = qk_norm_rope(q, k, gq, gk, cos, sin, EPS, rope=rope, interpret=interpret)
    fp8_kv_write(k_want, v, slots, kc2, vc2, ks, vs, interpret=interpret)
    return got, q_want, (kc, vc), (kc2, vc2), (before, slots)


@pytest.mark.parametrize("t,hkv", [(1, 1), (3, 2), (33, 4)])
@pytest.mark.parametrize("rope", [True, False])
def test_cpu_path_is_the_two_ops(t, hkv, rope):
    got, q_want, caches, caches_want, _ = both(t, hkv, t + hkv, rope, interpret=False)
    assert torch.equal(got, q_want)
    for c, w in zip(caches, caches_want):
        assert torch.equal(c.view(torch.uint8), w.view(torch.uint8))


@pytest.mark.parametrize("t,hkv", [(1, 1), (3, 2), (33, 4)])
@pytest.mark.parametrize("rope", [True, False])
def test_interpreter_fused_equals_the_two_kernels(interp, t, hkv, rope):
    got, q_want, caches, caches_want, (before, slots) = both(t, hkv, 3 * t + hkv, rope,
                                                             interpret=True)
    assert torch.equal(got, q_want)
    for c, w in zip(caches, caches_want):
        assert torch.equal(c.view(torch.uint8), w.view(torch.uint8))
    changed = (caches[0].view(-1, hkv, 128).view(torch.uint8)
               != before.view(-1, hkv, 128).view(torch.uint8)).any(-1).any(-1)
    written = torch.zeros_like(changed)
    written[slots[slots >= 0]] = True
    assert torch.equal(changed, written)   # the slots >= 0 and nothing else


def test_errors_name_the_argument():
    q, k, v, gq, gk, cos, sin, slots, (kc, vc), (ks, vs) = case(3, 2, 1)
    with pytest.raises(ValueError, match="^v:"):
        qk_norm_rope_kv_write(q, k, v[:, :1], gq, gk, cos, sin, slots, kc, vc, ks, vs)
    with pytest.raises(ValueError, match="^slot_mapping:"):
        qk_norm_rope_kv_write(q, k, v, gq, gk, cos, sin, slots.int(), kc, vc, ks, vs)
    with pytest.raises(ValueError, match="^k_cache:"):
        qk_norm_rope_kv_write(q, k, v, gq, gk, cos, sin, slots, kc.float(), vc, ks, vs)
    with pytest.raises(ValueError, match="^cos:"):
        qk_norm_rope_kv_write(q, k, v, gq, gk, cos[:2], sin, slots, kc, vc, ks, vs)
