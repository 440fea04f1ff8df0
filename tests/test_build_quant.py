"""Quantized weights: tolerances against the bf16 originals, NVFP4 bit-exactness with ModelOpt,
block-FP8 amax, the E2M1 table and nibble order, the amax grid."""

from __future__ import annotations

import pytest
import torch
from test_build_support import load_all

from kolibri_trt.builder import dequant, quantize
from kolibri_trt.builder.dequant import E2M1_VALUES, dequantize, dequantize_linear

# Named tolerances (per element, relative to |w| or in units of the block's scale s):
FP8_REL_TOL = 2.0 ** -4 + 2.0 ** -8   # e4m3 half-ulp (2^-4) + ModelOpt's bf16 intermediate
FP8_SUBNORMAL_TOL = 2.0 ** -10        # half the smallest e4m3 subnormal, times the scale
BLOCK_FP8_REL_TOL = 2.0 ** -4         # single rounding (fp32 division)
NVFP4_ELEMENT_TOL = 1.0               # half of e2m1's widest gap (4 -> 6), in units of s
FP8_REL_FRO_TOL = 0.04                # whole-matrix ||deq - w|| / ||w||
BLOCK_FP8_REL_FRO_TOL = 0.04
NVFP4_REL_FRO_TOL = 0.12              # ~9.5 % on Gaussian weights (shared/notes/modelopt.md)


def _fro(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_target_fp8_weights_within_tolerance(build_ckpt, built_engine):
    src, eng = load_all(build_ckpt[0]), load_all(built_engine / "target")
    prefixes = [n[: -len(".weight_scale")] for n in eng if n.endswith(".weight_scale")
                and not n.startswith("lm_head")]
    assert any(".experts." in p for p in prefixes) and any("self_attn" in p for p in prefixes)
    for p in prefixes:
        w, deq = src[p + ".weight"].float(), dequantize(eng, p, "fp8")
        scale = float(eng[p + ".weight_scale"])
        bound = torch.maximum(w.abs() * FP8_REL_TOL, torch.tensor(scale * FP8_SUBNORMAL_TOL))
        assert ((deq - w).abs() <= bound * (1 + 1e-6)).all(), p
        assert _fro(deq, w) < FP8_REL_FRO_TOL, p
        assert eng[p + ".input_scale"] > 0


def test_nvfp4_heads_within_tolerance(build_ckpt, built_engine):
    src = load_all(build_ckpt[0])
    for folder, rows in (("target", None), ("drafter", "vocab")):
        eng = load_all(built_engine / folder)
        w = src["lm_head.weight"].float()
        if rows:
            import json
            w = w[json.loads((build_ckpt[1] / "draft_vocab.json").read_text())]
        deq = dequantize(eng, "lm_head", "nvfp4")
        s = (eng["lm_head.weight_scale"].float() * eng["lm_head.weight_scale_2"]).repeat_interleave(
            16, dim=1)
        assert ((deq - w).abs() <= s * NVFP4_ELEMENT_TOL).all(), folder
        assert _fro(deq, w) < NVFP4_REL_FRO_TOL, folder


def test_drafter_block_fp8_within_tolerance(build_ckpt, built_engine):
    src, eng = load_all(build_ckpt[1]), load_all(built_engine / "drafter")
    body = [n[: -len(".weight_scale")] for n in eng if n.endswith(".weight_scale")
            and not n.startswith("lm_head")]
    assert "layers.0.mlp.down_proj" in body and "predecessor.U" in body   # K = 96 and K = 8
    for p in body:
        w, deq = src[p + ".weight"].float(), dequantize(eng, p, "block_fp8")
        n, k = w.shape
        assert eng[p + ".weight_scale"].shape == (n, -(-k // 64))
        scale = eng[p + ".weight_scale"].repeat_interleave(64, dim=1)[:, :k]
        bound = torch.maximum(w.abs() * BLOCK_FP8_REL_TOL, scale * FP8_SUBNORMAL_TOL)
        assert ((deq - w).abs() <= bound * (1 + 1e-6)).all(), p
        assert _fro(deq, w) < BLOCK_FP8_REL_FRO_TOL, p


def test_engine_nvfp4_heads_are_modelopts_bytes(build_ckpt, built_engine):
    import json

    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    head = load_all(build_ckpt[0])["lm_head.weight"]
    vocab = json.loads((build_ckpt[1] / "draft_vocab.json").read_text())
    for folder, w in (("target", head), ("drafter", head[vocab])):
        eng = load_all(built_engine / folder)
        q, block, global_scale = NVFP4QTensor.quantize(w.to(torch.bfloat16), 16)
        assert torch.equal(eng["lm_head.weight"], q._quantized_data), folder
        assert torch.equal(eng["lm_head.weight_scale"].view(torch.uint8), block.view(torch.uint8))
        assert torch.equal(eng["lm_head.weight_scale_2"], global_scale.reshape(()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_our_nvfp4_equals_modelopt_bit_for_bit(dtype):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 128, generator=gen) * 0.05
    w[3] = 0                                             # an all-zero row: block scale 1.0
    w[5, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6] * 2) * torch.tensor(
        [1.0] * 8 + [-1.0] * 8)                          # exact e2m1 midpoints (ties)
    w[7, 3] = 40.0                                       # an outlier sets the global scale
    w = w.to(dtype)
    q, block, global_scale = NVFP4QTensor.quantize(w, 16)
    packed, ours_block, ours_global = quantize.quantize_nvfp4(w)
    assert torch.equal(packed, q._quantized_data)
    assert torch.equal(ours_block.view(torch.uint8), block.view(torch.uint8))
    assert torch.equal(ours_global, global_scale)


def test_block_fp8_amax_is_modelopts():
    from kolibri_trt.builder.modelopt_backend import block_fp8_amax

    gen = torch.Generator().manual_seed(1)
    weights = {"a": torch.randn(8, 128, generator=gen).bfloat16(),
               "b.c": torch.randn(4, 72, generator=gen).bfloat16()}
    amax = block_fp8_amax(weights, 64)
    for name, w in weights.items():
        assert torch.equal(amax[name], quantize.block_amax(w, 64)), name


def test_e2m1_table_and_nibble_order():
    assert E2M1_VALUES[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert E2M1_VALUES[8:] == tuple(-v for v in E2M1_VALUES[:8])
    packed = torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)   # codes 1, 2, 8, 15
    assert dequant.unpack_e2m1(packed).tolist() == [[1, 2, 8, 15]]
    values = dequant.nvfp4_to_float(packed.repeat(1, 4), torch.ones(1, 1).to(torch.float8_e4m3fn),
                                    torch.tensor(2.0))
    assert values[0, :4].tolist() == [1.0, 2.0, 0.0, -12.0]


def test_dequantize_linear_errors():
    with pytest.raises(ValueError, match="unknown weight format"):
        dequantize_linear("int3", {"weight": torch.zeros(2, 2)})
    with pytest.raises(KeyError, match="weight_scale"):
        dequantize_linear("fp8", {"weight": torch.zeros(2, 2).to(torch.float8_e4m3fn)})


def test_round_amax_up_grid():
    assert quantize.round_amax_up(2.0, 16) == 2.0
    for a in (0.013, 1.7, 3.0, 250.0):
        r = quantize.round_amax_up(a, 16)
        assert a <= r <= a * 2 ** (1 / 16) * (1 + 1e-12)
        assert quantize.round_amax_up(a * (1 + 1e-7), 16) == r or r / a < 1 + 1e-6
