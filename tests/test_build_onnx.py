"""`--export-onnx`: the drafter's one-pass graph, quantized linears as `kolibri` custom nodes,
and the bf16 variant run by onnxruntime against the torch reference."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from onnx import numpy_helper
from test_build_support import build, cached, load_all

from kolibri_trt import KolibriBlockDrafter, KolibriForCausalLM
from kolibri_trt.builder.onnx_export import run_bf16

LOGITS_TOL = 1e-4   # fp32 onnxruntime vs fp32 torch on the same bf16 weights


@pytest.fixture(scope="module")
def onnx_engine(build_ckpt, test_recipes, tmp_path_factory):
    return cached("onnx", lambda: build(tmp_path_factory.mktemp("onnx") / "e", build_ckpt,
                                        test_recipes, export_onnx=True))


def test_quantized_graph_uses_kolibri_nodes_with_engine_tensors(onnx_engine, built_engine):
    model = onnx.load(str(onnx_engine / "onnx" / "drafter.onnx"))
    onnx.checker.check_model(model)
    custom = {n.op_type for n in model.graph.node if n.domain == "kolibri"}
    assert custom == {"BlockFp8Linear", "Nvfp4Linear"}
    assert {o.domain: o.version for o in model.opset_import} == {"": 17, "kolibri": 1}
    inits = {t.name: t for t in model.graph.initializer}
    eng = load_all(onnx_engine / "drafter")
    for name in ("fc.weight", "fc.weight_scale", "lm_head.weight", "lm_head.weight_scale"):
        raw = eng[name].contiguous().view(torch.uint8).numpy().tobytes() \
            if eng[name].dtype == torch.float8_e4m3fn else eng[name].numpy().tobytes()
        assert inits[name].raw_data == raw, name
    m = json.loads((onnx_engine / "manifest.json").read_text())
    assert {"onnx/drafter.onnx", "onnx/drafter_bf16.onnx"} <= set(m["files"])
    weights = {k: v for k, v in m["files"].items() if k.endswith(".safetensors")}
    base = json.loads((built_engine / "manifest.json").read_text())["files"]
    assert all(base[k] == v for k, v in weights.items())     # same weights with or without ONNX


def test_bf16_graph_matches_torch(onnx_engine, build_ckpt):
    path = onnx_engine / "onnx" / "drafter_bf16.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert all(n.domain == "" for n in model.graph.node)
    assert numpy_helper.to_array(next(t for t in model.graph.initializer
                                      if t.name == "draft_vocab")).shape == (300,)
    target = KolibriForCausalLM.from_pretrained(build_ckpt[0], dtype=torch.float32)
    drafter = KolibriBlockDrafter.from_pretrained(build_ckpt[1], target=target,
                                                  dtype=torch.float32)
    ids = torch.randint(1000, 2048, (14,), generator=torch.Generator().manual_seed(3))
    _, taps = target(ids[None], tap_layers=drafter.config.target_layer_ids)
    for p in (0, 5, 12):                                     # p = 0: no context row at all
        ref_ids, ref_logits = drafter.propose(taps[0, :p + 1], ids[1:p + 2])
        out_ids, out_logits = run_bf16(path, taps[0, :p + 1],
                                       target.model.embed_tokens.weight[ids[1:p + 2]], p)
        assert torch.equal(out_ids, ref_ids), p
        assert (out_logits - ref_logits).abs().max() <= LOGITS_TOL * ref_logits.abs().max(), p
