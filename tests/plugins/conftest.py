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


@pytest.fixture
def interp_f64_dots(interp, monkeypatch):
    """``interp`` with the interpreter's dots accumulated in float64, then rounded to the
    accumulator's dtype.

    Triton 3.6's interpreter runs ``tl.dot`` as numpy's fp32 matmul, whose BLAS kernel (and
    with it the sum order) depends on the operands' shapes and on the CPU (OpenBLAS picks its
    kernels at run time): two tilings of the same rows may then differ in the last bit on one
    machine and not on another. In float64 the sum order changes the result far below fp32's
    last bit, so tests of "the tiling does not change a row's bits" hold on any CPU; on the
    GPU the same property is checked by bench/gpu_check.py.
    """
    import numpy as np
    import triton.runtime.interpreter as interpreter

    builder = interpreter.InterpreterBuilder
    orig = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
            return orig(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64))
        return interpreter.TensorHandle((acc + d.data).astype(d.data.dtype), d.dtype.scalar)
    monkeypatch.setattr(builder, "create_dot", create_dot)
    return True
