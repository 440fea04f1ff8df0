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
