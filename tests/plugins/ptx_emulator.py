"""A small emulator of the PTX instructions the plugins' inline assembly uses (mov, and, shl,
shr, prmt, lop3, mul.rn.bf16x2), so tests can run that assembly on CPU: Triton's interpreter
cannot, and a wrong selector or table byte would otherwise show only on the GPU."""

import torch

MASK = 0xFFFFFFFF


def _prmt(a: int, b: int, c: int) -> int:
    """PTX prmt.b32 default mode: result byte i = byte (c >> 4i) & 7 of {b, a}; selector bit 3
    replicates that byte's sign bit."""
    src = (a | (b << 32)).to_bytes(8, "little")
    out = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = src[sel & 7]
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def bf16_bits(v: torch.Tensor) -> int:
    return int(v.to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def bf16_value(bits: int) -> torch.Tensor:
    """float64 value of the bf16 with these 16 bits."""
    return torch.tensor([bits - (1 << 16) if bits & 0x8000 else bits],
                        dtype=torch.int16).view(torch.bfloat16).double()


def _mul_bf16x2(a: int, b: int) -> int:
    """mul.rn.bf16x2: each half the bf16 product rounded to nearest (float64 product first)."""
    out = 0
    for h in range(2):
        x, y = ((v >> (16 * h)) & 0xFFFF for v in (a, b))
        fx, fy = (bf16_value(z) for z in (x, y))
        out |= bf16_bits(fx * fy) << (16 * h)
    return out


def run_ptx(asm: str, operands: dict[str, int]) -> dict[str, int]:
    """Execute the asm's instructions in order on 32-bit values; operands: '$n' -> value."""
    regs = dict(operands)

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0) & MASK

    body = asm.strip().strip("{}")
    for ins in (i.strip() for i in body.split(";")):
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        d, *src = [t.strip() for t in args.split(",")]
        v = [val(t) for t in src]
        if op == "mov.b32":
            r = v[0]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "shl.b32":
            r = (v[0] << v[1]) & MASK
        elif op == "prmt.b32":
            r = _prmt(*v)
        elif op == "lop3.b32":
            r = _lop3(*v)
        elif op == "mul.rn.bf16x2":
            r = _mul_bf16x2(*v)
        else:
            raise AssertionError(f"emulator: no instruction {op}")
        regs[d] = r
    return regs
