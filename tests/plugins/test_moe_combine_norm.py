"""The MoE's combine fused with the residual add and the next RMSNorm (plugins/moe_combine_norm.py)
and the uncombined MoE it reads (moe.moe_forward_parts): the same bits as moe_forward followed by
add_rms_norm, on the CPU path and in the interpreter."""

import pytest
import torch

from kolibri_trt_plugins import add_rms_norm, moe_combine_norm, moe_forward, moe_forward_parts
from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.moe import moe_combine_ref, moe_forward_ref
from kolibri_trt_plugins.moe_combine_norm import moe_combine_norm_ref

E, H, I_, IS, K = 8, 64, 32, 48, 2
EPS = 1e-6
# The interpreter sums squares in another order than torch (add_rms_norm's tests): y may move
# by one bf16 ulp in a few outputs; h (one fp32 add rounded once) is exact.
FLIP_FRAC = 1e-2


def case(m, shared, seed):
    g = T.gen(seed)
    wts = T.moe_weights(E, H, I_, IS if shared else 0, g)
    x = T.randn((m, H), g)
    resid = T.randn((m, H), g, scale=2.0)
    gain = (1 + 0.2 * torch.randn(H, generator=g)).to(torch.bfloat16)
    return wts, x, resid, gain


@pytest.mark.parametrize("m", [1, 3, 33])
@pytest.mark.parametrize("shared", [True, False])
def test_cpu_path_is_moe_forward_then_add_rms_norm(m, shared):
    wts, x, resid, gain = case(m, shared, 10 + m)
    parts, w = moe_forward_parts(x, *wts, top_k=K)
    assert parts.shape == (m, K + 1, H) and parts.dtype == w.dtype == torch.float32
    assert torch.equal(moe_combine_ref(parts, w, shared), moe_forward_ref(x, *wts, top_k=K))
    want = add_rms_norm(resid, moe_forward(x, *wts, top_k=K), gain, EPS)
    got = moe_combine_norm(parts, w, resid, gain, EPS, has_shared=shared)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("m", [1, 3, 70])
@pytest.mark.parametrize("shared", [True, False])
def test_interpreter_fused_equals_unfused_kernels(interp, m, shared):
    """moe_forward_parts + moe_combine_norm give the bits of moe_forward + add_rms_norm (the
    same helpers, the kernels in the interpreter); 70 tokens take two expert chunks."""
    wts, x, resid, gain = case(m, shared, 20 + m)
    parts, w = moe_forward_parts(x, *wts, top_k=K, interpret=True)
    h, y = moe_combine_norm(parts, w, resid, gain, EPS, has_shared=shared, interpret=True)
    out = moe_forward(x, *wts, top_k=K, interpret=True)
    h_want, y_want = add_rms_norm(resid, out, gain, EPS, interpret=True)
    assert torch.equal(h, h_want) and torch.equal(y, y_want)


@pytest.mark.parametrize("m", [1, 33])
def test_interpreter_matches_reference(interp_rne, m):
    g = T.gen(30 + m)
    parts = torch.randn((m, K + 1, H), generator=g)
    w = torch.rand((m, K), generator=g)
    resid = T.randn((m, H), g, scale=2.0)
    gain = (1 + 0.2 * torch.randn(H, generator=g)).to(torch.bfloat16)
    h, y = moe_combine_norm(parts, w, resid, gain, EPS, interpret=True)
    h_ref, y_ref = moe_combine_norm_ref(parts, w, resid, gain, EPS, True)
    assert torch.equal(h, h_ref)
    assert (y != y_ref).float().mean().item() <= FLIP_FRAC


def test_errors_name_the_argument():
    g = T.gen(1)
    parts, w = torch.zeros((3, K + 1, H)), torch.zeros((3, K))
    x, gain = T.randn((3, H), g), T.randn((H,), g)
    with pytest.raises(ValueError, match="^parts:"):
        moe_combine_norm(parts[:, :K].contiguous(), w, x, gain)
    with pytest.raises(ValueError, match="^weights:"):
        moe_combine_norm(parts, w.double(), x, gain)
    with pytest.raises(ValueError, match="^x:"):
        moe_combine_norm(parts, w, x.float(), gain)
    with pytest.raises(ValueError, match="^gain:"):
        moe_combine_norm(parts, w, x, gain[:5])
