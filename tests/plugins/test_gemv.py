"""NVFP4 and FP8 (per-tensor, per-channel, block 1x64) weight-only GEMMs for small batches."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.fp8_gemv import fp8_dequantize_ref, fp8_gemv, fp8_gemv_ref
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_dequantize_ref, nvfp4_gemv, nvfp4_gemv_ref

INTERP_TOL = 1.5e-2  # bf16 output; the interpreter's bf16 store truncates; block-FP8 rounds w·s to bf16
SHAPES = [(1, 1, 64), (3, 33, 256), (33, 17, 272), (65, 3, 64)]  # (M, N, K): odd M, N; K % 16 == 0


def test_nvfp4_dequant_against_bit_decode():
    """Independent e2m1 decode from the bits: sign bit 3, exponent bits 2-1, mantissa bit 0."""
    w = torch.arange(256, dtype=torch.uint8).repeat(2, 4)  # every byte, [2, 1024]: K = 2048
    ws = torch.full((2, 128), 2.0).to(torch.float8_e4m3fn)
    got = nvfp4_dequantize_ref(w, ws, torch.tensor(0.5))

    def e2m1(c):
        sgn = -1.0 if c & 8 else 1.0
        e, m = (c >> 1) & 3, c & 1
        return sgn * (m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2))
    want = torch.tensor([[e2m1(int(b) & 15), e2m1(int(b) >> 4)] for b in w[0]]).flatten()
    assert torch.equal(got[0], want * 2.0 * 0.5)


def test_fp8_dequant_layouts():
    w = torch.randn(4, 128).to(torch.float8_e4m3fn)
    assert torch.equal(fp8_dequantize_ref(w, torch.tensor([2.0])), w.float() * 2)
    ch = torch.arange(1, 5).float()
    assert torch.equal(fp8_dequantize_ref(w, ch), w.float() * ch[:, None])
    blk = torch.tensor([[1.0, 3.0]]).repeat(4, 1)
    deq = fp8_dequantize_ref(w, blk)
    assert torch.equal(deq[:, :64], w.float()[:, :64]) and torch.equal(deq[:, 64:], 3 * w.float()[:, 64:])


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_nvfp4_interpreter(interp, M, N, K):
    g = T.gen(M * 1000 + N)
    x = T.randn((M, K), g)
    w = T.nvfp4_weight(N, K, g)
    assert T.rel_err(nvfp4_gemv(x, *w, interpret=True), nvfp4_gemv_ref(x, *w)) < INTERP_TOL


@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
@pytest.mark.parametrize("M,N,K", SHAPES + [(5, 7, 33)])
def test_fp8_interpreter(interp, mode, M, N, K):
    if mode == "block" and K % 64:
        pytest.skip("block scales need K % 64 == 0")
    g = T.gen(M * 1000 + N + K)
    x = T.randn((M, K), g)
    w = T.fp8_weight(N, K, mode, g)
    assert T.rel_err(fp8_gemv(x, *w, interpret=True), fp8_gemv_ref(x, *w)) < INTERP_TOL


def test_row_stride_and_cpu_path():
    g = T.gen(1)
    x = T.randn((4, 128), g)[:, :64]  # row stride 128, last dim contiguous
    w = T.fp8_weight(9, 64, "channel", g)
    assert torch.equal(fp8_gemv(x, *w), fp8_gemv_ref(x, *w))


def test_errors_name_the_argument():
    g = T.gen(2)
    x = T.randn((2, 64), g)
    w, ws, gs = T.nvfp4_weight(8, 64, g)
    with pytest.raises(ValueError, match="^x:"):
        nvfp4_gemv(T.randn((2, 40), g), w, ws, gs)
    with pytest.raises(ValueError, match="^weight_scale:"):
        nvfp4_gemv(x, w, ws.float(), gs)
    with pytest.raises(ValueError, match="^weight_scale_2:"):
        nvfp4_gemv(x, w, ws, torch.ones(2))
    w8, s8 = T.fp8_weight(8, 64, "tensor", g)
    with pytest.raises(ValueError, match="^weight:"):
        fp8_gemv(x, w8.float(), s8)
    with pytest.raises(ValueError, match="^weight_scale:"):
        fp8_gemv(x, w8, torch.ones(3))
    with pytest.raises(ValueError, match="^x:"):
        fp8_gemv(x.t(), w8, s8)
