"""The Gluon wgmma GEMV probes (bench/gluon_gemv_probe.py, bench/gluon_nvfp4_probe.py), without a
GPU: the storage permutation and the in-register relabelling pair every logical K column with
its own weight, and both kernels still compile for sm_90 with the relabelled tile as a trivial
conversion to wgmma's A layout (`assert_trivial`: a Triton upgrade that changes the A layout
fails here, not on the H200)."""

import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")
BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
fp8_probe = pytest.importorskip("gluon_gemv_probe")
nvfp4_probe = pytest.importorskip("gluon_nvfp4_probe")


@pytest.mark.parametrize("bk", [128, 256])
def test_fp8_relabel_inverts_storage(bk):
    """to_storage moves bytes only, and _to_logical's permutation undoes it (check_relabel)."""
    w = torch.randint(0, 120, (3, 2 * bk), dtype=torch.uint8).view(torch.float8_e4m3fn)
    stored = fp8_probe.to_storage(w, bk).view(torch.uint8)
    assert torch.equal(stored.sort(dim=1).values, w.view(torch.uint8).sort(dim=1).values)
    assert not torch.equal(stored, w.view(torch.uint8))
    fp8_probe.check_relabel(bk)


def test_nvfp4_relabel_pairs_nibbles():
    """Every logical column of the NVFP4 tile is nibble k & 1 of pair k >> 1 (check_relabel);
    to_storage moves whole bytes within each block of 128."""
    w = torch.randint(0, 256, (2, 256), dtype=torch.uint8)
    stored = nvfp4_probe.to_storage(w)
    for blk in range(2):
        sl = slice(128 * blk, 128 * (blk + 1))
        assert torch.equal(stored[:, sl].sort(dim=1).values, w[:, sl].sort(dim=1).values)
    nvfp4_probe.check_relabel()


COMPILE = """
import gluon_gemv_probe as f, gluon_nvfp4_probe as n
for ck in (f.aot(8, 128, 1), f.aot(8, 128, 1, True), n.aot(8, 1)):
    assert "wgmma.mma_async" in ck.asm["ptx"] and "griddepcontrol" not in ck.asm["ptx"]
for ck in (f.aot(8, 128, 4, True, fixup=True, pdl=2), n.aot(8, 1, pdl=2)):
    ptx = ck.asm["ptx"].splitlines()
    at = [i for i, line in enumerate(ptx) if "griddepcontrol" in line]
    assert ["wait" in ptx[i] for i in at] == [True, False], at   # wait, then the release
    copies = [i for i, line in enumerate(ptx) if line.strip().startswith("cp.async.c")]
    commit = next(i for i, line in enumerate(ptx) if "cp.async.commit_group" in line)
    assert copies[0] < at[0] < commit        # the weights' first copies before the wait,
    assert any(at[0] < i < commit for i in copies)   # x's first ones after it, same group
print("ok")
"""


def test_probes_compile_for_sm90():
    """Both kernels compile for sm_90 at 8 token columns (one K split; the FP8 one also
    asynchronous, and in 4 K ranges with FIXUP), wgmma in the PTX; under PDL mode 2 the wait
    comes after the weights' first copies and the release once, later. In a fresh process:
    the interpreter, which other tests run, patches triton.language's builtins that Gluon's
    compiler shares."""
    done = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True,
                          timeout=600, cwd=BENCH)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
