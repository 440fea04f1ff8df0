"""Custom-op registration: schema/fake-tensor checks (opcheck) and torch.compile tracing on CPU."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.qk_norm_fold_int4 import fold_matrices, hadamard_rotation

OPS = torch.ops.kolibri_plugins


def op_cases():
    g = T.gen(0)
    bt, sl, cu, nb = T.paged_layout([5, 33], [1, 3], 16, g)
    q = T.randn((4, 4, 128), g)
    c4 = T.int4_cache(nb, 16, 2, g)
    kf, vf = T.fp8_cache(nb, 16, 2, g)
    one = torch.ones(1)
    mq, mk = fold_matrices(torch.ones(128), torch.ones(128), hadamard_rotation(0))
    fold_caches = ([torch.zeros(shape, dtype=torch.uint8) for shape in ((4, 2, 16, 64),
                                                                        (4, 2, 64, 16))]
                   + [torch.zeros((4, 2, 16, 2), dtype=torch.float16) for _ in range(2)])
    x = T.randn((3, 64), g)
    moe = T.moe_weights(4, 64, 32, 32, g)
    return {
        "int4_paged_attention": (q, *c4, bt, sl, cu, 0.088, 33, 3, 0, 512),
        "fp8_paged_attention": (q, kf, vf, one, one, bt, sl, cu, 0.088, 33, 3, 513, 256),
        "qk_norm_fold_int4": (T.randn((3, 4, 128), g), T.randn((3, 2, 128), g),
                              T.randn((3, 2, 128), g), mq, mk, torch.tensor([0, 5, -1]),
                              *fold_caches, 1e-6),
        "nvfp4_gemv": (x, *T.nvfp4_weight(5, 64, g)),
        "nvfp4_wgmma": (T.randn((3, 256), g), *T.nvfp4_weight(5, 256, g)),
        "fp8_gemv": (x, *T.fp8_weight(5, 64, "block", g)),
        "fp8_wgmma": (T.randn((3, 256), g), *T.fp8_weight(64, 256, "tensor", g)),
        "moe_route": (x, moe[0], 2, True),
        "moe_forward": (x, *moe, 2, True),
        "moe_forward+prefetch_next": (x, *moe, 2, True, T.randn((8, 64), g)),
        "attn_combine": (torch.randn(3, 2), torch.rand(3, 2), torch.randn(3, 2, 128)),
        "fp8_kv_write": (T.randn((3, 2, 128), g), T.randn((3, 2, 128), g),
                         torch.tensor([0, 17, -1]), *T.fp8_cache(4, 16, 2, g), one, one),
        "add_rms_norm": (x, T.randn((3, 64), g), T.randn((64,), g), 1e-6),
        "rms_norm": (x, T.randn((64,), g), 1e-6),
        "qk_norm_rope": (T.randn((3, 4, 128), g), T.randn((3, 2, 128), g), T.randn((128,), g),
                         T.randn((128,), g), torch.randn(3, 128), torch.randn(3, 128), 1e-6, True),
        "qk_norm_rope_kv_write": (T.randn((3, 4, 128), g), T.randn((3, 2, 128), g),
                                  T.randn((3, 2, 128), g), T.randn((128,), g),
                                  T.randn((128,), g), torch.randn(3, 128), torch.randn(3, 128),
                                  torch.tensor([0, 17, -1]), *T.fp8_cache(4, 16, 2, g), one,
                                  one, 1e-6, True),
        "gumbel_argmax": (torch.randn(3, 70, generator=g), torch.rand(3, generator=g) + 0.5,
                          torch.tensor([0, 222, 2**32 - 1])),
        "ring_attention": (T.randn((2, 4, 4, 64), g), T.randn((2, 4, 24, 2, 64), g),
                           torch.arange(96).view(4, 24), torch.tensor([1, 3]),
                           torch.tensor([5, 20]), torch.tensor([[5, 6, 7, 8], [20, 21, 22, 23]]),
                           8, 24),
        "rope_ring_write": (T.randn((3, 8 * 64), g), torch.randn(3, 2, 2, 32, generator=g),
                            T.randn((2, 4, 24, 2, 64), g), torch.tensor([1, 3, 3]),
                            torch.tensor([0, 7, 23]), 4),
    }


@pytest.mark.parametrize("name", sorted(op_cases()))
def test_opcheck(name):
    args = op_cases()[name]
    fp8_in = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    # opcheck's schema mode itself multiplies inputs, which CPU torch cannot do for float8
    utils = ("test_faketensor",) if fp8_in else ("test_schema", "test_faketensor")
    op = getattr(OPS, name.split("+")[0])   # "op+what": a case with an optional argument
    torch.library.opcheck(op.default, args, test_utils=utils)


def test_torch_compile_fullgraph():
    """Dynamo traces through the ops (fake tensors via register_fake) without graph breaks."""
    g = T.gen(1)
    x = T.randn((3, 64), g)
    w = T.fp8_weight(5, 64, "channel", g)
    nv = T.nvfp4_weight(7, 64, g)

    def f(x):
        return OPS.fp8_gemv(x, *w).float().sum() + OPS.nvfp4_gemv(x, *nv).float().sum()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.allclose(compiled(x), f(x))


def test_unsupported_device_is_an_error():
    from kolibri_trt_plugins._common import kernel_path
    with pytest.raises(ValueError, match="unsupported device"):
        kernel_path(torch.empty(1, device="meta"), "x")
