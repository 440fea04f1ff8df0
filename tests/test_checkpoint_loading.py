"""Strict checkpoint I/O: every loader error names the file and the tensor or field."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from kolibri_trt import CheckpointError, DrafterTarget, KolibriBlockDrafter, KolibriForCausalLM
from kolibri_trt.config import KolibriConfig
from kolibri_trt.drafter import DrafterConfig


@pytest.fixture()
def target_dir(tmp_path, micro_target):
    d = tmp_path / "target"
    micro_target.save_pretrained(d)
    return d


@pytest.fixture()
def drafter_dir(tmp_path, micro_drafter):
    d = tmp_path / "drafter"
    micro_drafter.save_pretrained(d)
    return d


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = torch.randint(0, 512, (1, 8))
    # same weights, but CPU BLAS may take another path for differently aligned buffers
    torch.testing.assert_close(a(ids), b(ids), rtol=1e-5, atol=1e-5)


def _raises(match_file, match_key, fn):
    with pytest.raises(CheckpointError) as err:
        fn()
    msg = str(err.value)
    assert match_file in msg and re.search(match_key, msg), msg
    return err.value


def test_round_trip_single_file(target_dir, micro_target):
    loaded = KolibriForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    _same_model(loaded, micro_target)
    assert loaded.config == micro_target.config
    assert not any(p.requires_grad for p in loaded.parameters())


def test_round_trip_sharded_with_index(tmp_path, micro_target):
    d = tmp_path / "sharded"
    micro_target.save_pretrained(d, max_shard_bytes=200_000)
    shards = sorted(d.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (d / "model.safetensors.index.json").is_file()
    assert not (d / "model.safetensors").exists()
    _same_model(KolibriForCausalLM.from_pretrained(d, dtype=torch.float32), micro_target)


def test_missing_tensor(target_dir):
    f = target_dir / "model.safetensors"
    t = load_file(f)
    del t["model.layers.2.mlp.experts.3.up_proj.weight"]
    save_file(t, f)
    _raises("target", r"tensor 'model\.layers\.2\.mlp\.experts\.3\.up_proj\.weight'.*missing",
            lambda: KolibriForCausalLM.from_pretrained(target_dir))


def test_unexpected_tensor(target_dir):
    f = target_dir / "model.safetensors"
    t = load_file(f)
    t["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(t, f)
    _raises("model.safetensors", r"tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'.*unexpected",
            lambda: KolibriForCausalLM.from_pretrained(target_dir))


def test_misshaped_tensor(target_dir):
    f = target_dir / "model.safetensors"
    t = load_file(f)
    t["lm_head.weight"] = t["lm_head.weight"][:, :32].contiguous()
    save_file(t, f)
    _raises("model.safetensors", r"tensor 'lm_head\.weight'.*shape \(512, 32\), expected \(512, 64\)",
            lambda: KolibriForCausalLM.from_pretrained(target_dir))


@pytest.mark.parametrize("changes, field", [
    (dict(layer_types=["sliding_attention"] * 4), r"field 'layer_types'.*4 entries"),
    (dict(layer_types=["sliding_attention"] * 4 + ["global"]), r"field 'layer_types'.*unknown layer type"),
    (dict(num_attention_heads=5), r"field 'num_attention_heads'.*not divisible"),
    (dict(hidden_size=None), r"field 'hidden_size': missing"),
    (dict(vocab_size="512"), r"field 'vocab_size': must be an integer"),
    (dict(model_type="llama"), r"field 'model_type'"),
    (dict(full_attention_rope=True), r"field 'full_attention_rope'"),
    (dict(eos_token_id=[2, 9999]), r"field 'eos_token_id'.*outside the vocabulary"),
    (dict(num_experts_per_tok=7), r"field 'num_experts_per_tok'"),
])
def test_config_contradictions(target_dir, changes, field):
    _edit_config(target_dir, **changes)
    _raises("config.json", field, lambda: KolibriForCausalLM.from_pretrained(target_dir))


def test_config_not_json_and_missing_files(target_dir, tmp_path):
    (target_dir / "config.json").write_text("{not json")
    _raises("config.json", "not valid JSON", lambda: KolibriForCausalLM.from_pretrained(target_dir))
    _raises("nowhere", "not found", lambda: KolibriForCausalLM.from_pretrained(tmp_path / "nowhere"))


def test_pickles_are_never_loaded(target_dir):
    (target_dir / "model.safetensors").rename(target_dir / "pytorch_model.bin")
    _raises("target", r"pytorch_model\.bin.*never loaded",
            lambda: KolibriForCausalLM.from_pretrained(target_dir))


def test_index_problems(tmp_path, micro_target):
    d = tmp_path / "sharded"
    micro_target.save_pretrained(d, max_shard_bytes=200_000)
    index = d / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.rename(d / "moved.safetensors")
    _raises(shard.name, "missing", lambda: KolibriForCausalLM.from_pretrained(d))
    (d / "moved.safetensors").rename(shard)
    name = next(iter(data["weight_map"]))
    data["weight_map"].pop(name)
    index.write_text(json.dumps(data))
    _raises("model-", rf"tensor '{re.escape(name)}'.*not in model\.safetensors\.index\.json",
            lambda: KolibriForCausalLM.from_pretrained(d))


def test_config_round_trip_keeps_extra_fields(target_dir):
    _edit_config(target_dir, transformers_version="5.17.0")
    cfg = KolibriConfig.from_json(target_dir)
    assert cfg.extra == {"transformers_version": "5.17.0"}
    assert cfg.to_dict()["transformers_version"] == "5.17.0"
    assert KolibriConfig() .num_hidden_layers == 50 and KolibriConfig().layer_types[4] == "full_attention"


# ---- drafter ---------------------------------------------------------------------------
def test_drafter_round_trip(drafter_dir, micro_drafter, micro_target):
    loaded = KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target,
                                                 dtype=torch.float32)
    assert torch.equal(loaded.draft_vocab, micro_drafter.draft_vocab)
    taps = torch.randn(5, 3, micro_target.config.hidden_size)
    nxt = torch.randint(0, 512, (5,))
    a, b = loaded.propose(taps, nxt), micro_drafter.propose(taps, nxt)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    bare = DrafterTarget(micro_target.model.embed_tokens.weight, micro_target.lm_head.weight, 5)
    assert KolibriBlockDrafter.from_pretrained(drafter_dir, target=bare).config == loaded.config


def test_drafter_target_layer_out_of_range(drafter_dir, micro_target):
    _edit_config(drafter_dir, target_layer_ids=[1, 3, 5])
    _raises("config.json", r"field 'target_layer_ids'.*layer 5 does not exist",
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))


def test_drafter_hidden_size_must_fit(drafter_dir, micro_target):
    _edit_config(drafter_dir, hidden_size=32)
    _raises("config.json", r"field 'hidden_size'.*target_hidden_size",
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))
    _edit_config(drafter_dir, hidden_size=32, target_hidden_size=32)
    _raises("config.json", r"field 'target_hidden_size'.*target's hidden_size is 64",
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))


@pytest.mark.parametrize("vocab, message", [
    (lambda v: v[:-1] + [512], r"entry 199: token id 512 is outside"),
    (lambda v: v[:-1], r"has 199 ids"),
    (lambda v: v[:-1] + [v[0]], r"distinct"),
    (lambda v: {"ids": v}, r"JSON list"),
])
def test_drafter_bad_draft_vocab(drafter_dir, micro_target, vocab, message):
    f = drafter_dir / "draft_vocab.json"
    f.write_text(json.dumps(vocab(json.loads(f.read_text()))))
    _raises("draft_vocab.json", message,
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))


def test_drafter_tensor_errors(drafter_dir, micro_target):
    f = drafter_dir / "model.safetensors"
    t = load_file(f)
    t["layers.0.spine.A.weight"] = torch.zeros(8, 64)  # layer 0 has no spine
    save_file(t, f)
    _raises("model.safetensors", r"tensor 'layers\.0\.spine\.A\.weight'.*unexpected",
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))
    del t["layers.0.spine.A.weight"]
    t["fuse.weight"] = torch.zeros(64, 128)
    save_file(t, f)
    _raises("model.safetensors", r"tensor 'fuse\.weight'.*expected \(64, 192\)",
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))


def test_drafter_config_errors(drafter_dir, micro_target):
    _edit_config(drafter_dir, serving_defaults={"depth": 2, "quant": "int3", "head": "nvfp4"})
    _raises("config.json", r"field 'serving_defaults'.*int3",
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))
    _edit_config(drafter_dir, serving_defaults={"depth": 2}, model_type="kolibri")
    _raises("config.json", r"field 'model_type'",
            lambda: KolibriBlockDrafter.from_pretrained(drafter_dir, target=micro_target))
    assert DrafterConfig().draft_vocab_size == 60614
