"""nvfp4_gemv's DECODE 3 (e2m1 -> bf16 by bit placement and one bf16 multiply by the block
scale): the PTX through tests/plugins/ptx_emulator.py over every byte, and the kernel in the
interpreter bit-identical to DECODE 1."""

import importlib

import pytest
import torch
from ptx_emulator import bf16_bits, run_ptx

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.nvfp4_gemv import E2M1_VALUES, nvfp4_gemv

NV = importlib.import_module("kolibri_trt_plugins.nvfp4_gemv")
E2M1 = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float64)
SCALES = (0.001953125, 0.0136, 0.25, 1.0, 1.625, 17.5, 448.0)   # e4m3 values, 2^-9 to the max


def _sb(scale: float) -> int:
    """bf16 bits of scale · 2^110, as the kernel builds its multiplier."""
    return bf16_bits(torch.tensor([scale * 2.0 ** 110]).to(torch.bfloat16))


def _decode(word: int, s01: int, s23: int) -> tuple[list[int], list[int]]:
    regs = run_ptx(NV.E2M1_BF16_PTX,
                   {"$4": word, "$5": s01, "$6": s23})
    halves = lambda a, b: [(regs[a] >> 0) & 0xFFFF, regs[a] >> 16, regs[b] & 0xFFFF,  # noqa: E731
                           regs[b] >> 16]
    return halves("$0", "$1"), halves("$2", "$3")


@pytest.mark.parametrize("scale", SCALES)
def test_every_byte_at_every_position(scale):
    """Low and high nibble of each byte value, at each of the four byte positions: bf16 of
    e2m1 · scale · 2^-16 (exact), the neighbours' halves untouched."""
    s = _sb(scale)
    pair = s | (s << 16)
    for pos in range(4):
        for b in range(256):
            word = (b << (8 * pos)) | (0x22 << (8 * ((pos + 1) % 4)))   # 1.0 | 1.0 beside it
            lo, hi = _decode(word, pair, pair)
            for got, code in ((lo, b & 15), (hi, b >> 4)):
                want = bf16_bits(torch.tensor([float(E2M1[code]) * scale * 2.0 ** -16])
                                 .to(torch.bfloat16))
                assert got[pos] == want, (b, pos, scale, hex(got[pos]), hex(want))
            one = bf16_bits(torch.tensor([scale * 2.0 ** -16]).to(torch.bfloat16))
            assert lo[(pos + 1) % 4] == one and hi[(pos + 1) % 4] == one


def test_each_half_takes_its_own_scale():
    lo, hi = _decode(0x22222222, _sb(1.0) | (_sb(2.0) << 16), _sb(4.0) | (_sb(8.0) << 16))
    want = [bf16_bits(torch.tensor([v * 2.0 ** -16]).to(torch.bfloat16)) for v in (1, 2, 4, 8)]
    assert lo == want and hi == want


@pytest.mark.parametrize("M,N,K,norm", [(1, 72, 64, False), (17, 40, 96, False),
                                        (3, 48, 64, True)])
@pytest.mark.parametrize("swap_rows", [0, 8])
def test_interpreter_decode_3_equals_decode_1(interp, monkeypatch, M, N, K, norm, swap_rows):
    """Also with the rows as the MMA's N (SWAP_ROWS 8: M <= 8 as W·x^T)."""
    monkeypatch.setattr(NV, "SWAP_ROWS", swap_rows)
    g = T.gen(M + N + K)
    x = T.randn((M, K), g)
    w = T.nvfp4_weight(N, K, g)
    kw = dict(norm=T.randn((K,), g)) if norm else {}
    monkeypatch.setattr(NV, "DECODE", 1)
    want = nvfp4_gemv(x, *w, interpret=True, **kw)
    monkeypatch.setattr(NV, "DECODE", 3)
    assert torch.equal(nvfp4_gemv(x, *w, interpret=True, **kw), want)
