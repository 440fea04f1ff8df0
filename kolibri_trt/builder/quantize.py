"""Our own quantizers (plain torch), for what ModelOpt cannot write and to check what it does.

- `quantize_block_fp8`: the drafter body's 1x64 block FP8 (`shared/spec/block-drafter.md`);
  ModelOpt calibrates the per-block amax, its exporter cannot write the 1x64 layout.
- `quantize_nvfp4`: an independent NVFP4 implementation (round-to-nearest-even by distance,
  not ModelOpt's search table) that equals `NVFP4QTensor.quantize(w, 16)` bit for bit (tested);
  the runtime's GPU machine has no ModelOpt.
- `round_amax_up`: the calibration grid that makes input scales machine-independent.
Layouts and the E2M1 table: `dequant.py`. All three run on the device of their input (the
synthetic full-size engine, `synthetic.py`, quantizes on the GPU).
"""

from __future__ import annotations

import math

import torch

from ..engine_format import BLOCK_FP8_GROUP, NVFP4_GROUP
from .dequant import E2M1_MAGNITUDES, E2M1_MAX, E4M3_MAX

E4M3_MIN_BLOCK_SCALE = 2.0 ** -9  # ModelOpt clamps NVFP4 block scales to [2^-9, 448]
_ROWS_PER_CHUNK = 2048


def block_amax(w: torch.Tensor, group: int = BLOCK_FP8_GROUP) -> torch.Tensor:
    """max |w| per output row and per `group` inputs: w [N, K] -> fp32 [N, ceil(K/group)]
    (a last partial block covers the remaining K % group inputs)."""
    n, k = w.shape
    blocks = -(-k // group)
    padded = torch.zeros(n, blocks * group, dtype=torch.float32, device=w.device)
    padded[:, :k] = w.float().abs()
    return padded.view(n, blocks, group).amax(dim=-1)


def quantize_block_fp8(w: torch.Tensor, amax: torch.Tensor | None = None,
                       group: int = BLOCK_FP8_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Block FP8 (e4m3, one fp32 scale per output row and per `group` inputs).

    w: [N, K] float; amax: fp32 [N, ceil(K/group)] (ModelOpt's calibrated block amax) or None
    to compute it here. scale = amax / 448 (1.0 for an all-zero block); q = e4m3(w / scale)
    with the division in fp32, round-to-nearest-even, clamped to ±448.
    Returns (q float8_e4m3fn [N, K], scale fp32 [N, ceil(K/group)]).
    """
    n, k = w.shape
    amax = block_amax(w, group) if amax is None else amax.float().reshape(n, -1)
    scale = amax / E4M3_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    full = scale.repeat_interleave(group, dim=1)[:, :k]
    q = (w.float() / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_nvfp4(w: torch.Tensor, group: int = NVFP4_GROUP
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 as ModelOpt 0.47.0 makes it (`shared/notes/modelopt.md`).

    global = amax(|w|) / (6 * 448) (fp32); block = amax16 / (6 * global), 1.0 where zero,
    clamped to [2^-9, 448], cast to e4m3 (RNE); element = e2m1(w / (float(block) * global)),
    nearest value, ties to the even code, saturating at 6.
    w: [N, K] float (K % 16 == 0). Returns (packed uint8 [N, K/2], block scale
    float8_e4m3fn [N, K/16], global scale fp32 []). Raises ValueError if K % 16 != 0.
    """
    n, k = w.shape
    if k % group:
        raise ValueError(f"NVFP4 needs K % {group} == 0, got K = {k}")
    global_scale = w.abs().amax().float() / (E2M1_MAX * E4M3_MAX)
    amax16 = w.abs().reshape(n, k // group, group).amax(dim=-1).float()
    block = amax16 / (E2M1_MAX * global_scale)
    block = torch.where(block == 0, torch.ones_like(block), block)
    block = block.clamp(min=E4M3_MIN_BLOCK_SCALE, max=E4M3_MAX).to(torch.float8_e4m3fn)
    packed = torch.empty(n, k // 2, dtype=torch.uint8, device=w.device)
    for r in range(0, n, _ROWS_PER_CHUNK):
        rows = slice(r, r + _ROWS_PER_CHUNK)
        x = w[rows].reshape(-1, k // group, group) / (block[rows].float() * global_scale)[..., None]
        codes = _e2m1_codes(x.reshape(-1, k))
        packed[rows] = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed, block, global_scale


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code of each fp32 element, ties to the even magnitude index (RNE), |x| > 6
    saturating to 6; sign bit 3 set for x < 0. Returns uint8 codes of x's shape."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=x.device)
    dist = (x.abs()[..., None] - mags).abs()
    nearest = dist == dist.amin(dim=-1, keepdim=True)
    even = nearest & (torch.arange(8, device=x.device) % 2 == 0)
    idx = torch.where(even.any(-1), even.to(torch.uint8).argmax(-1),
                      nearest.to(torch.uint8).argmax(-1))
    return idx.to(torch.uint8) | ((x < 0).to(torch.uint8) << 3)


def round_amax_up(amax: float, steps_per_octave: int) -> float:
    """Round a calibrated amax up to the grid 2^(j / steps_per_octave) (j integer).

    Calibration runs matmuls whose last bits depend on the CPU and its thread count; snapping
    the amax up to a coarse grid (at most 2^(1/steps) - 1 larger: 4.4 % for 16 steps) makes the
    stored input scales the same on every machine. amax <= 0 is returned unchanged.
    """
    if not amax > 0:
        return amax
    j = math.ceil(math.log2(amax) * steps_per_octave - 1e-9)
    return 2.0 ** (j / steps_per_octave)
