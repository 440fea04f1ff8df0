"""nvfp4_wgmma on CPU: the weight permutation, the kernel's relabelling (every logical column
meets its own weight), the reference path against nvfp4_gemv's, and the wrapper's checks.
The Gluon kernel has no interpreter: it is compiled for sm_90 by tests/plugins/
test_gluon_probes.py (bench/gluon_nvfp4_probe.py --aot uses it) and checked against the
reference on the H200 by bench/gpu_check.py (`--only nvfp4wg`)."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv_ref
from kolibri_trt_plugins.nvfp4_wgmma import (from_wgmma_storage, nvfp4_wgmma, relabelled_columns,
                                             to_wgmma_storage)


def test_storage_round_trip_moves_bytes_within_blocks():
    w = torch.randint(0, 256, (3, 384), dtype=torch.uint8, generator=T.gen(1))
    stored = to_wgmma_storage(w)
    assert not torch.equal(stored, w)
    for blk in range(3):
        cols = slice(128 * blk, 128 * (blk + 1))
        assert torch.equal(stored[:, cols].sort(dim=1).values, w[:, cols].sort(dim=1).values)
    assert torch.equal(from_wgmma_storage(stored), w)


def test_relabelling_pairs_every_column_with_its_weight():
    assert torch.equal(relabelled_columns(), torch.arange(256))


@pytest.mark.parametrize("M,N,K", [(1, 7, 256), (3, 33, 512), (33, 5, 256), (144, 17, 768)])
def test_reference_equals_nvfp4_gemv_ref(M, N, K):
    """On CPU the op is nvfp4_gemv_ref on the weight in ModelOpt's order, bit for bit."""
    g = T.gen(M + N)
    x = T.randn((M, K), g)
    w, ws, ws2 = T.nvfp4_weight(N, K, g)
    y = nvfp4_wgmma(x, to_wgmma_storage(w), ws, ws2)
    assert y.dtype == torch.bfloat16 and y.shape == (M, N)
    assert torch.equal(y, nvfp4_gemv_ref(x, w, ws, ws2))


def test_zero_rows():
    w, ws, ws2 = T.nvfp4_weight(4, 256, T.gen(0))
    assert nvfp4_wgmma(torch.zeros((0, 256), dtype=torch.bfloat16), w, ws, ws2).shape == (0, 4)


@pytest.mark.parametrize("bad,match", [
    (dict(x=torch.zeros((2, 128), dtype=torch.bfloat16)), "x: K = 128"),
    (dict(x=torch.zeros((2, 256))), "x"),
    (dict(w=torch.zeros((4, 64), dtype=torch.uint8)), "weight_stored"),
    (dict(ws=torch.ones((4, 16))), "weight_scale"),
])
def test_wrapper_names_the_bad_argument(bad, match):
    w, ws, ws2 = T.nvfp4_weight(4, 256, T.gen(0))
    args = dict(x=torch.zeros((2, 256), dtype=torch.bfloat16), w=w, ws=ws, ws2=ws2) | bad
    with pytest.raises(ValueError, match=match):
        nvfp4_wgmma(args["x"], args["w"], args["ws"], args["ws2"])


def test_storage_rejects_a_partial_block():
    with pytest.raises(ValueError, match="weight"):
        to_wgmma_storage(torch.zeros((2, 100), dtype=torch.uint8))
