"""nvfp4_gemv's DECODE 2 PTX (e2m1 -> bf16 through byte tables, times the block scale) run on
CPU through tests/plugins/ptx_emulator.py."""

import importlib

import pytest
import torch
from ptx_emulator import asm_text, bf16_bits, bf16_value, run_ptx

# the package re-exports nvfp4_gemv (the function) under the module's name: go by the module path
NV = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")


def _asm_text() -> str:
    return asm_text(NV.__file__, "_e2m1_pairs_to_bf16")


def _e2m1(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * NV.E2M1_VALUES[code & 7]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode2_ptx_equals_e2m1_times_scale(seed):
    """Every nibble of random words, with random e4m3 block scales (subnormal ones included):
    the PTX's bf16 outputs equal bf16(e2m1 · scale), and lo/hi carry the low/high nibbles of
    bytes 0..3 in element order."""
    g = torch.Generator().manual_seed(seed)
    asm = _asm_text()
    words = torch.randint(0, 2**32, (64,), generator=g, dtype=torch.int64)
    scales = torch.randint(0, 0x7F, (64, 4), generator=g, dtype=torch.int64)  # e4m3 >= 0
    scales[0] = torch.tensor([0x01, 0x07, 0x08, 0x7E])  # subnormal, largest subnormal, 448
    for w, sc in zip(words.tolist(), scales):
        f = sc.to(torch.uint8).view(torch.float8_e4m3fn).float()
        sb = [bf16_bits(x) for x in f]
        regs = run_ptx(asm, {"$4": w, "$5": sb[0] | (sb[1] << 16), "$6": sb[2] | (sb[3] << 16)})
        for j in range(4):
            byte = (w >> (8 * j)) & 0xFF
            for out, code in (("lo", byte & 15), ("hi", byte >> 4)):
                reg = regs[{"lo": "$0", "hi": "$2"}[out] if j < 2 else
                           {"lo": "$1", "hi": "$3"}[out]]
                got = (reg >> (16 * (j % 2))) & 0xFFFF
                want = bf16_bits(torch.tensor(_e2m1(code)) * f[j].double())
                assert got == want, (hex(w), j, out, hex(got), hex(want))


def test_decode2_tables_cover_every_code():
    """The byte tables give each magnitude code its e2m1 value exactly (scale 1.0)."""
    asm = _asm_text()
    one = bf16_bits(torch.tensor(1.0))
    for code in range(16):
        w = code | (code << 4)               # byte 0: both nibbles the same code
        regs = run_ptx(asm, {"$4": w, "$5": one | (one << 16), "$6": one | (one << 16)})
        value = bf16_value(regs["$0"] & 0xFFFF).item()
        assert value == _e2m1(code) and (regs["$2"] & 0xFFFF) == (regs["$0"] & 0xFFFF)
