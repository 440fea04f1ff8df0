"""tests/plugins: CPU reference path + Triton's interpreter at tiny sizes; GPU checks skip on CPU.

The interpreter runs the real Triton kernels on CPU tensors through
``kolibri_trt_plugins._common.launch(..., interpret=True)``, whether or not TRITON_INTERPRET was
set before triton was imported. The full GPU check is bench/gpu_check.py (H200).
"""

import pytest

from kolibri_trt_plugins._common import HAVE_TRITON


@pytest.fixture
def interp():
    """Skip unless Triton is importable (its interpreter runs the kernels on CPU tensors)."""
    if not HAVE_TRITON:
        pytest.skip("triton is not installed: interpreter runs need it (pip install triton==3.6.0)")
    return True


def pytest_configure(config):
    # the interpreter's numpy emulation warns on every program (deprecations, 1/0 guarded by where)
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.*")
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.*")


@pytest.fixture
def interp_rne(interp, monkeypatch):
    """``interp`` with round-to-nearest-even fp32 -> bf16 casts in the interpreter.

    Triton 3.6's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), which
    hides whether a kernel rounds at the same points as its reference. With torch's cast
    swapped in, a kernel can be compared with its reference bit for bit, up to fp32 sum order.
    """
    import numpy as np
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    orig = getattr(interpreter, "_convert_float", None)
    if orig is None:
        pytest.skip("this Triton's interpreter has no _convert_float to patch")

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(torch.bfloat16)
            return t.view(torch.int16).numpy().view(np.uint16).reshape(np.shape(data))
        return orig(data, src, dst, rounding_mode)

    monkeypatch.setattr(interpreter, "_convert_float", convert)
    return True
