"""o_proj with the residual add + RMSNorm after it in its split-K sum (plugins/gemv_add_rms_norm.py):
the reference is the unfused composition bit for bit, the Triton kernel in the interpreter gives
the bits of the unfused kernels (fp8_gemv's split-K reduce, then add_rms_norm), rows are batch
invariant, and bad arguments are named."""

import importlib

import pytest
import torch

from kolibri_trt_plugins import add_rms_norm, fp8_gemv
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.gemv_add_rms_norm import fp8_gemv_add_rms_norm

FG = importlib.import_module("kolibri_trt_plugins.fp8_gemv")
EPS = 1e-6


def gemv_case(M, N, Kd, mode, seed):
    g = T.gen(seed)
    x = T.randn((M, Kd), g)
    w = T.fp8_weight(N, Kd, mode, g)
    res = T.randn((M, N + 16), g, scale=2.0)[:, :N]     # strided residual rows
    gain = (1 + 0.2 * torch.randn(N, generator=g)).to(torch.bfloat16)
    return x, w, res, gain


@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
@pytest.mark.parametrize("M,N,Kd", [(1, 70, 512), (3, 33, 320), (33, 64, 768)])
def test_gemv_reference_is_the_composition(mode, M, N, Kd):
    x, w, res, gain = gemv_case(M, N, Kd, mode, M + N + Kd)
    h, y = fp8_gemv_add_rms_norm(x, *w, res, gain, EPS)      # CPU: the reference path
    hw, yw = add_rms_norm(res, fp8_gemv(x, *w), gain, EPS)
    assert torch.equal(h, hw) and torch.equal(y, yw)
    assert h.is_contiguous() and y.is_contiguous() and h.shape == y.shape == (M, N)


@pytest.mark.parametrize("split", [1, 2, 3])
@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
@pytest.mark.parametrize("M,N,Kd", [(1, 70, 512), (3, 33, 768), (17, 64, 512)])
def test_gemv_interpreter_keeps_the_unfused_bits(interp_rne, monkeypatch, split, mode, M, N, Kd):
    """Split 2 / 3: this file's kernel against fp8_gemv's reduce + add_rms_norm; split 1: the
    unsplit shape's two launches."""
    monkeypatch.setattr(FG, "SPLIT_K", split)
    x, w, res, gain = gemv_case(M, N, Kd, mode, 7 * M + N + split)
    h, y = fp8_gemv_add_rms_norm(x, *w, res, gain, EPS, interpret=True)
    hw, yw = add_rms_norm(res, fp8_gemv(x, *w, interpret=True), gain, EPS, interpret=True)
    assert torch.equal(h, hw) and torch.equal(y, yw)
    if split > 1:
        want = (FG.num_splits(Kd, split, FG.BLOCK_K), M, N)   # empty K ranges dropped
        assert FG.launch_partials(x, *w, interpret=True).shape == want
    else:
        assert FG.launch_partials(x, *w, interpret=True) is None


def test_gemv_rows_are_batch_invariant(interp_rne, monkeypatch):
    monkeypatch.setattr(FG, "SPLIT_K", 3)
    x, w, res, gain = gemv_case(9, 40, 768, "tensor", 5)
    h, y = fp8_gemv_add_rms_norm(x, *w, res, gain, EPS, interpret=True)
    for i in (0, 4, 8):
        hi, yi = fp8_gemv_add_rms_norm(x[i:i + 1], *w, res[i:i + 1], gain, EPS, interpret=True)
        assert torch.equal(hi, h[i:i + 1]) and torch.equal(yi, y[i:i + 1])


def test_errors_name_the_argument():
    x, w, res, gain = gemv_case(2, 32, 256, "tensor", 1)
    with pytest.raises(ValueError, match="residual"):
        fp8_gemv_add_rms_norm(x, *w, res[:1], gain)
    with pytest.raises(ValueError, match="norm_weight"):
        fp8_gemv_add_rms_norm(x, *w, res, gain.float())
    with pytest.raises(ValueError, match="weight_scale"):
        fp8_gemv_add_rms_norm(x, w[0], torch.ones(3), res, gain)
