"""fp8_kv_write: the reference against the spec's rounding, and the Triton kernel in the
interpreter against the reference (on e4m3-exact inputs: the interpreter's float8 cast is not
trusted for rounding; bench/gpu_runtime.py checks rounding on the GPU)."""

import pytest
import torch

from kolibri_trt_plugins import fp8_kv_write
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.fp8_kv_write import fp8_kv_write_ref

E4M3 = torch.float8_e4m3fn


def _case(t, hkv, nb, bs, g, exact):
    k, v = T.randn((t, hkv, 128), g), T.randn((t, hkv, 128), g) * 3
    ks, vs = torch.tensor([0.5]), torch.tensor([0.25])
    if exact:  # values whose division by the scale lands exactly on e4m3 numbers
        k = (k / ks).to(E4M3).float() * ks
        v = (v / vs).to(E4M3).float() * vs
    perm = torch.randperm(nb * bs, generator=g)[:t]
    slots = perm.clone()
    slots[::3] = -1
    caches = T.fp8_cache(nb, bs, hkv, g)
    return k, v, slots, caches, ks, vs


@pytest.mark.parametrize("t,hkv", [(1, 1), (3, 2), (33, 4), (70, 5)])
def test_reference_writes_rounded_values_and_skips_negative_slots(t, hkv):
    g = T.gen(t)
    k, v, slots, (kc, vc), ks, vs = _case(t, hkv, 7, 16, g, exact=False)
    before_k, before_v = kc.clone(), vc.clone()
    fp8_kv_write(k.to(torch.bfloat16), v.to(torch.bfloat16), slots, kc, vc, ks, vs)
    keep = slots >= 0
    flat_k, flat_v = kc.view(-1, hkv, 128), vc.view(-1, hkv, 128)
    want_k = (k[keep].to(torch.bfloat16).float() / ks).clamp(-448, 448).to(E4M3)
    assert torch.equal(flat_k[slots[keep]].view(torch.uint8), want_k.view(torch.uint8))
    want_v = (v[keep].to(torch.bfloat16).float() / vs).clamp(-448, 448).to(E4M3)
    assert torch.equal(flat_v[slots[keep]].view(torch.uint8), want_v.view(torch.uint8))
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots[keep]] = False
    assert torch.equal(flat_k[untouched].view(torch.uint8),
                       before_k.view(-1, hkv, 128)[untouched].view(torch.uint8))
    assert torch.equal(flat_v[untouched].view(torch.uint8),
                       before_v.view(-1, hkv, 128)[untouched].view(torch.uint8))


def test_large_values_saturate_instead_of_overflowing():
    k = torch.full((1, 1, 128), 1e6)
    kc, vc = (torch.zeros(1, 16, 1, 128, dtype=E4M3) for _ in range(2))
    one = torch.ones(1)
    fp8_kv_write_ref(k, -k, torch.tensor([3]), kc, vc, one, one)
    assert kc[0, 3].float().eq(448).all() and vc[0, 3].float().eq(-448).all()


@pytest.mark.parametrize("t,hkv", [(3, 2), (33, 1)])
def test_interpreter_matches_reference(t, hkv):
    pytest.importorskip("triton")
    g = T.gen(100 + t)
    k, v, slots, (kc, vc), ks, vs = _case(t, hkv, 5, 16, g, exact=True)
    kc2, vc2 = kc.clone(), vc.clone()
    fp8_kv_write_ref(k, v, slots, kc, vc, ks, vs)
    fp8_kv_write(k, v, slots, kc2, vc2, ks, vs, interpret=True)
    assert torch.equal(kc.view(torch.uint8), kc2.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), vc2.view(torch.uint8))


def test_bad_arguments_name_themselves():
    g = T.gen(0)
    kc, vc = T.fp8_cache(2, 16, 2, g)
    k = T.randn((2, 2, 128), g)
    one = torch.ones(1)
    with pytest.raises(ValueError, match="slot_mapping"):
        fp8_kv_write(k, k, torch.tensor([0, 1], dtype=torch.int32), kc, vc, one, one)
    with pytest.raises(ValueError, match="k_cache"):
        fp8_kv_write(k, k, torch.tensor([0, 1]), kc.float(), vc, one, one)
    with pytest.raises(ValueError, match="v:"):
        fp8_kv_write(k, k[:1], torch.tensor([0, 1]), kc, vc, one, one)
