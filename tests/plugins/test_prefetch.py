"""L2 prefetch before the PDL wait (plugins/_prefetch.py, PDL mode 4): ptxas accepts it for sm_90
and it compiles to one bulk prefetch (SASS UBLKPF) per region, in mode 4 only. No GPU: the
kernels are built ahead of time with Triton's bundled ptxas (bench/aot_sass.py)."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("aot_sass", ROOT / "bench" / "aot_sass.py")
AOT = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(AOT)

pytestmark = pytest.mark.skipif(not AOT.CUOBJDUMP.exists(), reason="Triton without cuobjdump")


def _ublkpf(preset: str, pdl: int) -> int:
    module, kernel, args, div = AOT.PRESETS[preset]
    ck = AOT.compile_sm90(module, kernel, dict(args, PDL=pdl), div, 4, 3)
    return AOT.cuobjdump(ck, "-sass").count("UBLKPF")


@pytest.mark.parametrize("preset,regions", [("fp8_qkv", 1), ("nvfp4_head", 2),
                                            ("moe_down", 2)])
def test_mode_4_prefetches_each_region_once(preset, regions):
    """fp8_gemv: its weight tile; nvfp4_gemv: codes and scales; the MoE's down projection: the
    shared expert's tile or the routed expert's (two branches)."""
    assert _ublkpf(preset, 4) == regions
    assert _ublkpf(preset, 2) == 0
