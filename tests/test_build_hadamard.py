"""The KV plan's maths: Sylvester H, the seeded rotation R (orthogonal), the exact fold
(M_q rms(q)) . (M_k rms(k)) = (g_q rms(q)) . (g_k rms(k)), and the engine's stored matrices."""

from __future__ import annotations

import pytest
import torch
from test_build_support import build_target_config, load_all

from kolibri_trt.builder import BuildError, fold_qk_gains, hadamard_rotation
from kolibri_trt.builder.hadamard import rotation_signs, sylvester_hadamard
from kolibri_trt.builder.recipes import KvPlan
from kolibri_trt.builder.target import kv_tensors
from kolibri_trt.fixtures import random_target

EPS32 = torch.finfo(torch.float32).eps


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("dim", [1, 2, 16, 128])
def test_sylvester_hadamard(dim):
    h = sylvester_hadamard(dim)
    assert torch.equal(h @ h.T, dim * torch.eye(dim))
    i = torch.arange(dim)
    popcount = torch.tensor([bin(int(a)).count("1") for a in (i[:, None] & i[None, :]).flatten()])
    assert torch.equal(h.flatten(), (-1.0) ** popcount.float())


def test_rotation_is_orthogonal_seeded_and_signed():
    r = hadamard_rotation(1003)
    assert r.dtype == torch.float32 and r.shape == (128, 128)
    assert (r @ r.T - torch.eye(128)).abs().max() <= 4 * EPS32
    assert torch.equal(r.abs(), torch.full((128, 128), (1 / 128 ** 0.5), dtype=torch.float32))
    assert torch.equal(r, hadamard_rotation(1003))                    # same seed, same R
    assert not torch.equal(r, hadamard_rotation(1004))
    s = rotation_signs(1003)
    assert torch.equal(torch.sign(r[0]), s)                           # row 0 of H is all ones
    assert torch.equal(r, sylvester_hadamard(128) * s / torch.tensor(128 ** 0.5))


def test_rotation_needs_a_power_of_two():
    with pytest.raises(BuildError, match="power-of-two"):
        hadamard_rotation(0, dim=96)


@pytest.mark.parametrize("rotated", [True, False])
def test_fold_is_exact_to_fp32_rounding(rotated):
    gen = torch.Generator().manual_seed(7)
    g_q = (1 + 0.3 * torch.randn(128, generator=gen)).bfloat16()
    g_k = (1 + 0.3 * torch.randn(128, generator=gen)).bfloat16()
    q, k = torch.randn(64, 128, generator=gen) * 3, torch.randn(64, 128, generator=gen)
    m_q, m_k = fold_qk_gains(g_q, g_k, hadamard_rotation(5) if rotated else None)
    folded = (_rms(q) @ m_q.T) @ (_rms(k) @ m_k.T).T                      # fp32 throughout
    a, b = g_q.float() * _rms(q), g_k.float() * _rms(k)
    plain = a @ b.T
    bound = 64 * EPS32 * (a.norm(dim=1)[:, None] * b.norm(dim=1)[None, :])
    assert ((folded - plain).abs() <= bound).all()
    if not rotated:
        assert torch.equal(m_k, torch.eye(128))
        assert torch.equal(m_q, torch.diag(g_q.float() * g_k.float()))


def _plan(full: str, sliding: str = "fp8") -> KvPlan:
    return KvPlan(full, "", sliding, full, seed=42)


def test_kv_tensors_per_plan():
    model = random_target(build_target_config(num_hidden_layers=5), seed=3)
    cfg, state = model.config, model.state_dict()
    full = [i for i in range(5) if not cfg.is_sliding(i)]
    for name, sliding_keys, full_keys in (
            ("hadamard-int4", {"k_scale", "v_scale"}, {"q_rotation", "k_rotation"}),
            ("int4", {"k_scale", "v_scale"}, {"q_rotation", "k_rotation"}),
            ("fp8", {"k_scale", "v_scale"}, {"k_scale", "v_scale"})):
        out = kv_tensors(cfg, state, _plan(name))
        for i in range(5):
            keys = {n.rsplit(".", 1)[1] for n in out if n.startswith(f"model.layers.{i}.")}
            assert keys == (full_keys if i in full else sliding_keys), (name, i)
        assert all(float(t) == 1.0 for n, t in out.items() if n.endswith("_scale"))
    assert kv_tensors(cfg, state, _plan("bf16", "bf16")) == {}
    eye = kv_tensors(cfg, state, _plan("int4"))[f"model.layers.{full[0]}.self_attn.k_rotation"]
    assert torch.equal(eye, torch.eye(128))


def test_hadamard_plan_rejects_head_dim_not_power_of_two():
    model = random_target(build_target_config(head_dim=96), seed=3)
    with pytest.raises(BuildError, match="head_dim 96"):
        kv_tensors(model.config, model.state_dict(), _plan("hadamard-int4"))
    assert kv_tensors(model.config, model.state_dict(), _plan("int4"))   # fine without R


def test_engine_stores_the_fold(build_ckpt, built_engine):
    import json
    src, eng = load_all(build_ckpt[0]), load_all(built_engine / "target")
    manifest = json.loads((built_engine / "manifest.json").read_text())
    r = hadamard_rotation(manifest["kv_cache"]["seed"], manifest["kv_cache"]["head_dim"])
    p = "model.layers.4.self_attn."
    m_q, m_k = fold_qk_gains(src[p + "q_norm.weight"], src[p + "k_norm.weight"], r)
    assert torch.equal(eng[p + "q_rotation"], m_q) and torch.equal(eng[p + "k_rotation"], m_k)
    assert (p.replace("4", "0") + "q_rotation") not in eng       # sliding layers: FP8 scales
    assert float(eng["model.layers.0.self_attn.k_scale"]) == 1.0
