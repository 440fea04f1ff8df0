"""plugins/_e4m3_decode.py's DECODE 3 PTX (e4m3 -> bf16 by bit placement and one bf16 multiply)
run on CPU through tests/plugins/ptx_emulator.py, over every e4m3 code but the NaNs."""

import importlib

import torch
from ptx_emulator import bf16_bits, run_ptx

D = importlib.import_module("kolibri_trt_plugins._e4m3_decode")
NAN_CODES = (0x7F, 0xFF)


def _decode(word: int) -> list[int]:
    """The four bf16 bit patterns the PTX makes of a word of four e4m3 bytes (element order)."""
    regs = run_ptx(D.E4M3_BF16_PTX, {"$2": word})
    return [(regs["$0"] >> s) & 0xFFFF for s in (0, 16)] + \
           [(regs["$1"] >> s) & 0xFFFF for s in (0, 16)]


def test_every_code_equals_the_conversion():
    """Each code at each of the four byte positions gives torch's e4m3 -> bf16 bits: signs,
    zeros, subnormals (exponent 0), the largest value 448."""
    codes = [c for c in range(256) if c not in NAN_CODES]
    for pos in range(4):
        for c in codes:
            word = (c << (8 * pos)) | (0x38 << (8 * ((pos + 1) % 4)))  # a 1.0 beside it
            want = bf16_bits(torch.tensor([c], dtype=torch.uint8).view(torch.float8_e4m3fn)
                             .to(torch.bfloat16))
            got = _decode(word)
            assert got[pos] == want, (hex(c), pos, hex(got[pos]), hex(want))
            assert got[(pos + 1) % 4] == 0x3F80          # the neighbour is untouched: 1.0


def test_random_words():
    g = torch.Generator().manual_seed(0)
    words = torch.randint(0, 256, (200, 4), generator=g, dtype=torch.uint8)
    words[(words == 0x7F) | (words == 0xFF)] = 0x40
    want = words.view(torch.float8_e4m3fn).to(torch.bfloat16).view(torch.int16).int() & 0xFFFF
    for row, w in zip(words, want):
        word = int.from_bytes(bytes(row.tolist()), "little")
        assert _decode(word) == w.tolist()
