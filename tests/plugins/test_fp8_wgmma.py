"""fp8_wgmma on CPU: the weight permutation and the kernel's relabelling (every logical column
meets its own weight), the reference path against fp8_gemv's, the K ranges by shape, and the
wrapper's checks. The Gluon kernel has no interpreter: it is compiled for sm_90 by
tests/plugins/test_gluon_probes.py (bench/gluon_gemv_probe.py --aot uses it) and checked on the
H200 by bench/gpu_check.py (`--only fp8wg`)."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.fp8_gemv import fp8_gemv_ref
from kolibri_trt_plugins.fp8_wgmma import (from_wgmma_storage, fp8_wgmma, relabelled_columns,
                                           split_for, to_wgmma_storage)


@pytest.mark.parametrize("bk", [128, 256])
def test_storage_round_trip_and_relabelling(bk):
    w = torch.randn((3, 2 * bk), generator=T.gen(2)).to(torch.float8_e4m3fn)
    stored = to_wgmma_storage(w, bk)
    assert not torch.equal(stored.view(torch.uint8), w.view(torch.uint8))
    assert torch.equal(from_wgmma_storage(stored, bk).view(torch.uint8), w.view(torch.uint8))
    assert torch.equal(relabelled_columns(bk), torch.arange(bk))


@pytest.mark.parametrize("M,N,K", [(1, 64, 128), (3, 128, 640), (17, 64, 256), (144, 192, 384)])
def test_reference_equals_fp8_gemv_ref(M, N, K):
    g = T.gen(M + N)
    x = T.randn((M, K), g)
    w, s = T.fp8_weight(N, K, "tensor", g)
    y = fp8_wgmma(x, to_wgmma_storage(w), s)
    assert y.dtype == torch.bfloat16 and y.shape == (M, N)
    assert torch.equal(y, fp8_gemv_ref(x, w, s))


def test_k_ranges_follow_the_shape_only():
    assert split_for(3584, 2560) == 4 and split_for(2560, 2560) == 5 and split_for(64, 128) == 1


@pytest.mark.parametrize("bad,match", [
    (dict(x=torch.zeros((2, 128))), "x"),
    (dict(w=torch.zeros((64, 128), dtype=torch.uint8)), "w_stored"),
    (dict(w=torch.zeros((48, 128)).to(torch.float8_e4m3fn)), "N = 48"),
    (dict(x=torch.zeros((2, 2560), dtype=torch.bfloat16),
          w=torch.zeros((2560, 2560)).to(torch.float8_e4m3fn)), None),
    (dict(s=torch.ones(3)), "scale"),
])
def test_wrapper_names_the_bad_argument(bad, match):
    args = dict(x=torch.zeros((2, 128), dtype=torch.bfloat16),
                w=torch.zeros((64, 128)).to(torch.float8_e4m3fn), s=torch.ones(1)) | bad
    if match is None:      # a good call (o_proj's shape, 5 K ranges of 512): no error
        assert fp8_wgmma(args["x"], args["w"], args["s"]).shape == (2, 2560)
        return
    with pytest.raises(ValueError, match=match):
        fp8_wgmma(args["x"], args["w"], args["s"])


def test_storage_rejects_a_partial_block():
    with pytest.raises(ValueError, match="w:"):
        to_wgmma_storage(torch.zeros((2, 100)).to(torch.float8_e4m3fn))


@pytest.mark.parametrize("one_launch", [8, 64])
def test_row_segments_cover_each_row_once(one_launch, monkeypatch):
    """The row launches of both wgmma GEMVs at 1-299 rows: every row in exactly one
    power-of-two tile of 8-128 rows, one launch up to ONE_LAUNCH_ROWS rows past the full
    128-row tiles, no launch of which more than half is padding past 8 rows."""
    pytest.importorskip("triton.experimental.gluon")
    from kolibri_trt_plugins import _wgmma_gluon
    monkeypatch.setattr(_wgmma_gluon, "ONE_LAUNCH_ROWS", one_launch)
    row_segments, ONE_LAUNCH_ROWS = _wgmma_gluon.row_segments, one_launch
    assert len(row_segments(9)) == (2 if one_launch == 8 else 1)
    for m in range(1, 300):
        segs = row_segments(m)
        rows, end = [], 0
        for m0, mt, tiles in segs:
            assert m0 == end and mt in (8, 16, 32, 64, 128) and tiles >= 1, (m, segs)
            end = m0 + mt * tiles
            rows += list(range(m0, min(end, m)))
            assert mt == 8 or min(end, m) - m0 > mt * tiles // 2, (m, segs)
        assert rows == list(range(m)) and end >= m, (m, segs)
        rest = m % 128 if m > 128 else m
        if rest and rest <= ONE_LAUNCH_ROWS:
            assert len(segs) == (1 if m <= 128 else 2), (m, segs)
