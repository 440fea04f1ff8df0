"""GPU checks: the all-in-one H200 script (eager, CUDA graph replayed twice, batch invariance)."""

import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: run `python3 bench/gpu_check.py` on the H200")
def test_gpu_check_small():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--small"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
