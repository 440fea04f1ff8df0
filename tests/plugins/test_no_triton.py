"""Without Triton (the README's first command installs none on a CPU machine) the plugins
import and their ops run the torch references: a subprocess where `import triton` fails."""

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["triton"] = None            # `import triton` raises ImportError from here on
import torch
import kolibri_trt_plugins as P
from kolibri_trt_plugins._common import HAVE_TRITON
import kolibri_trt.drafter.block_drafter  # noqa: F401  (build.py's first plugin import)
assert not HAVE_TRITON
x = torch.randn(3, 64).bfloat16()
w = torch.randn(32, 64).to(torch.float8_e4m3fn)
y = P.fp8_gemv(x, w, torch.tensor([0.5]))
assert y.shape == (3, 32) and y.dtype == torch.bfloat16
w4 = torch.randint(0, 256, (5, 128), dtype=torch.uint8)
s4 = torch.ones(5, 16).to(torch.float8_e4m3fn)
y = P.nvfp4_wgmma(torch.randn(2, 256).bfloat16(), w4, s4, torch.tensor([0.5]))
assert y.shape == (2, 5) and y.dtype == torch.bfloat16
print("ok")
"""


def test_plugins_import_and_run_without_triton():
    """The package, the drafter that build.py imports first, and fp8_gemv's and nvfp4_wgmma's
    reference paths (nvfp4_wgmma's Gluon kernel is imported only at launch)."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
