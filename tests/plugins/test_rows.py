"""`linear_rows`: the references' products are row-invariant (batch invariance on CPU)."""

import pytest
import torch

from kolibri_trt_plugins._rows import linear_rows


@pytest.mark.parametrize("n, k", [(96, 64), (131, 77), (512, 256), (40, 2560)])
def test_linear_rows_row_invariant(n, k):
    """A row's bits do not depend on how many rows share the call, from 1 to 40 rows, at any
    offset."""
    g = torch.Generator().manual_seed(n)
    w, x = torch.randn(n, k, generator=g), torch.randn(64, k, generator=g)
    full = linear_rows(x, w)
    assert torch.equal(full, linear_rows(x.view(8, 8, k), w).view(64, n))
    for m in range(1, 41):
        for start in (0, 3):
            assert torch.equal(linear_rows(x[start:start + m], w), full[start:start + m]), m


def test_dense_attention_reference_rows_do_not_depend_on_q_len():
    """paged_attention_dense_ref: the last query rows of a stream give the same bits whether the
    call holds 1, 2, 3, 5 or 8 query rows (the references of decode and verification agree)."""
    from kolibri_trt_plugins._paged import paged_attention_dense_ref
    g = torch.Generator().manual_seed(3)
    L, hq, hkv, blk = 45, 8, 2, 16
    q = torch.randn(8, hq, 128, generator=g).bfloat16()
    k, v = torch.randn(L, hkv, 128, generator=g), torch.randn(L, hkv, 128, generator=g)
    bt = torch.arange(3, dtype=torch.int32)[None]
    sl = torch.tensor([L], dtype=torch.int32)

    def run(t):
        cu = torch.tensor([0, t], dtype=torch.int32)
        return paged_attention_dense_ref(q[8 - t:], bt, sl, cu, blk, lambda s: (k[s], v[s]),
                                         0.088, 0)
    full = run(8)
    for t in (1, 2, 3, 5):
        assert torch.equal(run(t), full[8 - t:]), t
