"""Random-input builders shared by tests/plugins, bench/plugins.py and bench/gpu_check.py.

Everything is drawn from a torch.Generator on the CPU and then moved, so the same seed gives the
same inputs on every device. Nothing here is used by the serving path.
"""

from __future__ import annotations

import torch

from ._common import cdiv

E4M3 = torch.float8_e4m3fn


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, g, dtype=torch.bfloat16, device="cpu", scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere gives inf)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def paged_layout(seq_lens, q_lens, block_size, g, device="cpu", spare_blocks=3):
    """Block tables over a shuffled pool of physical blocks + the int32 metadata tensors.

    Returns (block_tables int32 [S, max_blocks], seq_lens int32 [S], cu_q_lens int32 [S+1],
    num_blocks). Every stream owns distinct physical blocks (random order)."""
    nbs = [cdiv(L, block_size) for L in seq_lens]
    maxb = max(max(nbs), 1)
    total = sum(nbs) + spare_blocks
    perm = torch.randperm(total, generator=g)
    bt = torch.zeros((len(seq_lens), maxb), dtype=torch.int32)
    o = 0
    for s, nb in enumerate(nbs):
        bt[s, :nb] = perm[o:o + nb].int()
        o += nb
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0).int()
    return (bt.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device),
            cu.to(device), total)


def int4_cache(num_blocks, block_size, hkv, g, device="cpu"):
    """Random head-major (k_codes, v_codes, k_meta, v_meta): k_codes uint8 [num_blocks, hkv,
    block_size, 64], v_codes uint8 [num_blocks, hkv, 64, block_size] (dim-major), meta fp16
    [num_blocks, hkv, block_size, 2] with scales in [0.01, 0.31] and offsets in [-2, 0]."""
    out = []
    for shape in ((num_blocks, hkv, block_size, 64), (num_blocks, hkv, 64, block_size)):
        out.append(torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(device))
    for _ in range(2):
        sc = torch.rand((num_blocks, hkv, block_size), generator=g) * 0.3 + 0.01
        off = -torch.rand((num_blocks, hkv, block_size), generator=g) * 2.0
        out.append(torch.stack([sc, off], -1).half().to(device))
    return tuple(out)


def fp8_cache(num_blocks, block_size, hkv, g, device="cpu"):
    """Random e4m3 (k_cache, v_cache) [num_blocks, block_size, hkv, 128], N(0, 1) before the cast."""
    return tuple(torch.randn((num_blocks, block_size, hkv, 128), generator=g).to(E4M3).to(device)
                 for _ in range(2))


def nvfp4_weight(n, k, g, device="cpu"):
    """Random NVFP4 (weight uint8 [n, k/2], weight_scale e4m3 [n, k/16], weight_scale_2 fp32 [1])."""
    w = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    ws = (torch.rand((n, k // 16), generator=g) * 1.5 + 0.25).to(E4M3)
    return w.to(device), ws.to(device), torch.tensor([0.02]).to(device)


def fp8_weight(n, k, mode, g, device="cpu"):
    """Random e4m3 weight [n, k] and scale: mode 'tensor' (one element), 'channel' [n], 'block'
    [n, k/64]."""
    w = torch.randn((n, k), generator=g).to(E4M3)
    if mode == "tensor":
        s = torch.tensor([0.03])
    elif mode == "channel":
        s = torch.rand(n, generator=g) * 0.05 + 0.01
    else:
        s = torch.rand((n, k // 64), generator=g) * 0.05 + 0.01
    return w.to(device), s.to(device)


def moe_weights(E, H, inter, inter_sh, g, device="cpu"):
    """Random MoE weights: router bf16 [E, H]; w13 e4m3 [E, 2I, H], scales fp32 [E]; w2 e4m3
    [E, H, I], scales [E]; shared (same format, E = 1) or None when inter_sh == 0."""
    def q(shape, lead):
        w = torch.randn(shape, generator=g).to(E4M3)
        return w.to(device), (torch.rand(lead, generator=g) * 0.02 + 0.01).to(device)

    rw = (torch.randn((E, H), generator=g) * 0.05).to(torch.bfloat16).to(device)
    w13, s13 = q((E, 2 * inter, H), E)
    w2, s2 = q((E, H, inter), E)
    if inter_sh:
        sw13, ss13 = q((1, 2 * inter_sh, H), 1)
        sw2, ss2 = q((1, H, inter_sh), 1)
    else:
        sw13 = ss13 = sw2 = ss2 = None
    return rw, w13, s13, w2, s2, sw13, ss13, sw2, ss2
