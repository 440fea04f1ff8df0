"""The synthetic full-size engine path (`kolibri_trt/builder/synthetic.py`) on a small config:
its own quantizers give exactly the tensors build.py's ModelOpt path writes for the same bf16
weights, and the PluginModel built from them in memory equals the one loaded from the engine."""

from __future__ import annotations

import torch
from test_build_support import load_all

from kolibri_trt.builder import synthetic
from kolibri_trt.config import KolibriConfig
from kolibri_trt.fixtures import tiny_target_config
from kolibri_trt.model.metadata import StepMetadata
from kolibri_trt.runtime.engine_loader import Manifest
from kolibri_trt.runtime.kv_cache import CacheGeometry, KVCache, KVPlan
from kolibri_trt.runtime.plugin_loader import load_plugin_target, plugin_model_from_tensors


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _direct(build_ckpt, built_engine):
    cfg = KolibriConfig.from_json(build_ckpt[0])
    manifest = Manifest.read(built_engine)
    state = load_all(build_ckpt[0])
    return cfg, manifest, synthetic.quantize_target(cfg, state, manifest.kv, manifest.kv_seed)


def test_direct_quantization_equals_modelopt_build(build_ckpt, built_engine):
    cfg, manifest, ours = _direct(build_ckpt, built_engine)
    assert manifest.target_formats == synthetic.FP8_NVFP4
    assert manifest.kv == synthetic.DEFAULT_KV
    theirs = load_all(built_engine / "target")
    assert set(ours) == set(theirs)
    synthetic.check_engine_tensors(cfg, ours, manifest.kv)
    compared = 0
    for name, ref in theirs.items():
        if name.endswith("input_scale"):       # calibration's, not the quantizer's
            continue
        mine = ours[name]
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, name
        assert torch.equal(_bits(mine), _bits(ref)), name
        compared += 1
    # every FP8 weight and scale, the NVFP4 head, norms, router, embedding, KV tensors
    assert compared == len(theirs) - sum(n.endswith("input_scale") for n in theirs)
    assert any(n.endswith("q_rotation") for n in ours) and any(n.endswith("k_scale") for n in ours)


def test_in_memory_plugin_model_equals_loaded(build_ckpt, built_engine):
    cfg, manifest, ours = _direct(build_ckpt, built_engine)
    mem, _, mem_scales = plugin_model_from_tensors(ours, cfg, manifest.target_formats, "<mem>")
    disk, _, disk_scales = load_plugin_target(built_engine, manifest, "cpu")
    assert mem_scales == disk_scales
    for a, b in zip(mem.layers, disk.layers):
        for field in a.__dataclass_fields__:
            x, y = getattr(a, field), getattr(b, field)
            xs = x if isinstance(x, tuple) else (x,)
            ys = y if isinstance(y, tuple) else (y,)
            for u, v in zip(xs, ys):
                assert (u is None) == (v is None), field
                if u is not None:
                    assert u.dtype == v.dtype and torch.equal(_bits(u), _bits(v)), field
    for u, v in ((mem.head.weight, disk.head.weight), (mem.head.scale, disk.head.scale),
                 (mem.embed, disk.embed)):
        assert torch.equal(_bits(u), _bits(v))


def _decode_meta(cfg, n_ctx: int, bs: int) -> tuple[StepMetadata, CacheGeometry]:
    """One stream decoding its token at position n_ctx - 1 (earlier positions: zero cache)."""
    nb = -(-n_ctx // bs)
    ids = torch.tensor([5])
    table = torch.arange(nb, dtype=torch.int32)[None]
    slot = torch.tensor([(n_ctx - 1) // bs * bs + (n_ctx - 1) % bs])
    meta = StepMetadata(ids, torch.tensor([n_ctx - 1]), torch.tensor([0, 1], dtype=torch.int32),
                        torch.tensor([n_ctx], dtype=torch.int32), table, table, slot, slot,
                        torch.tensor([0]), (1,), (n_ctx,))
    return meta, CacheGeometry(bs, nb, nb, nb)


def test_random_synthetic_model_runs_on_cpu():
    """The layer-by-layer random path: contract-checked tensors, deterministic per seed, a
    decode step through the kernels' torch references gives finite logits."""
    cfg = tiny_target_config(vocab_size=512, hidden_size=64, num_hidden_layers=5,
                             num_attention_heads=2, num_key_value_heads=1, sliding_window=16,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32)
    a = synthetic.synthetic_engine_tensors(cfg, "cpu", seed=3)
    b = synthetic.synthetic_engine_tensors(cfg, "cpu", seed=3)
    synthetic.check_engine_tensors(cfg, a)
    assert all(torch.equal(_bits(a[n]), _bits(b[n])) for n in a)
    model, target, scales = synthetic.synthetic_plugin_model(cfg, "cpu", seed=3)
    assert target.embed_tokens.shape == (512, 64) and len(scales) == 4
    meta, geometry = _decode_meta(cfg, 20, 16)
    cache = KVCache(cfg, KVPlan("fp8", "hadamard-int4"), geometry, scales)
    logits, _ = model.forward(meta, cache.layers, 20, 1)
    assert logits.shape == (1, 512) and torch.isfinite(logits).all()
