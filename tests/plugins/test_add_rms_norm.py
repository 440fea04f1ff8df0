"""Residual add + RMSNorm (plugins/add_rms_norm.py): the reference against the unfused
kolibri_trt.model.ops composition (bit for bit), the Triton kernel in the interpreter against the
reference, batch invariance of the kernel, argument checks."""

import pytest
import torch

from kolibri_trt.model import ops
from kolibri_trt_plugins import add_rms_norm
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.add_rms_norm import add_rms_norm_ref

EPS = 1e-6
# The interpreter (numpy) sums the squares in another order than torch and computes rsqrt
# another way: the fp32 scale may move by an ulp, so y may move by one bf16 ulp, rarely.
MAX_ULP = 1
FLIP_FRAC = 2e-3   # measured: 1 flip in 8448 outputs (N=256, T=33), none at N=2560
SIZES = [(t, n) for n in (256, 2560) for t in (1, 3, 33, 511)]


def inputs(t, n, seed, row_stride=None):
    g = T.gen(seed)
    width = row_stride or n
    x = T.randn((t, width), g, scale=2.0)[:, :n]      # row stride `width`, last dim stride 1
    r = T.randn((t, width), g, scale=0.5)[:, :n]
    w = (1 + 0.2 * torch.randn(n, generator=g)).to(torch.bfloat16)
    return x, r, w


def ulp_diff(a, b):
    """Largest distance in bf16 ulps (same-sign values; both exact zeros count 0)."""
    if not a.numel():
        return 0
    return int((a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max())


@pytest.mark.parametrize("t,n", SIZES)
@pytest.mark.parametrize("residual", [True, False])
def test_reference_is_the_ops_composition_bit_for_bit(t, n, residual):
    x, r, w = inputs(t, n, t + n, row_stride=n + 64)
    res = r if residual else None
    h_want = x + r if residual else x
    y_want = ops.rms_norm(h_want, w, EPS)
    for h, y in (add_rms_norm_ref(x, res, w, EPS), add_rms_norm(x, res, w, EPS)):  # ref, CPU op
        assert torch.equal(h, h_want) and torch.equal(y, y_want)
        assert y.is_contiguous() and h.dtype == y.dtype == torch.bfloat16
    if not residual:
        assert add_rms_norm(x, None, w, EPS)[0] is x


@pytest.mark.parametrize("t,n", SIZES)
@pytest.mark.parametrize("residual", [True, False])
def test_interpreter_matches_reference(interp_rne, t, n, residual):
    x, r, w = inputs(t, n, 7 * t + n, row_stride=n + 32 if t % 2 else None)
    res = r if residual else None
    h, y = add_rms_norm(x, res, w, EPS, interpret=True)
    h_ref, y_ref = add_rms_norm_ref(x, res, w, EPS)
    assert torch.equal(h, h_ref)          # one fp32 add rounded to bf16: exact
    assert (h.is_contiguous() if residual else h is x) and y.is_contiguous() and y.shape == (t, n)
    flips = (y != y_ref).float().mean().item()
    assert ulp_diff(y, y_ref) <= MAX_ULP and flips <= FLIP_FRAC, (flips, ulp_diff(y, y_ref))


@pytest.mark.parametrize("n", [256, 2560])
@pytest.mark.parametrize("residual", [True, False])
def test_kernel_rows_are_batch_invariant(interp, n, residual):
    """A row computed alone gives the same bits as inside a batch of 33 (interpreter)."""
    x, r, w = inputs(33, n, n + 1)
    res = r if residual else None
    h, y = add_rms_norm(x, res, w, EPS, interpret=True)
    for i in (0, 17, 32):
        one = add_rms_norm(x[i:i + 1], None if res is None else res[i:i + 1], w, EPS,
                           interpret=True)
        assert torch.equal(one[0], h[i:i + 1]) and torch.equal(one[1], y[i:i + 1])


def test_empty_batch():
    x, r, w = inputs(0, 256, 0)
    h, y = add_rms_norm(x, r, w, EPS)
    assert h.shape == y.shape == (0, 256)


def test_bad_arguments_name_themselves():
    x, r, w = inputs(3, 256, 1)
    with pytest.raises(ValueError, match="^x:"):
        add_rms_norm(x.float(), r, w, EPS)
    with pytest.raises(ValueError, match="^x:"):
        add_rms_norm(x.t().contiguous().t(), r, w, EPS)      # last dim not stride 1
    with pytest.raises(ValueError, match="^x:"):
        add_rms_norm(x[None], r, w, EPS)
    with pytest.raises(ValueError, match="^residual:"):
        add_rms_norm(x, r[:2], w, EPS)
    with pytest.raises(ValueError, match="^residual:"):
        add_rms_norm(x, r.half(), w, EPS)
    with pytest.raises(ValueError, match="^weight:"):
        add_rms_norm(x, r, w[:128], EPS)
    with pytest.raises(ValueError, match="^weight:"):
        add_rms_norm(x, r, w.float(), EPS)
