"""Dequantize engine weights to float32 with plain torch (the runtime's CPU path imports this).

Formats: `kolibri_trt/engine_format.py`; sources: `shared/notes/modelopt.md` (ModelOpt 0.47.0
Hugging Face export) and `shared/spec/block-drafter.md` §Serving quantisation.

NVFP4 storage, bit for bit:
- code table (E2M1, 1 sign + 2 exponent + 1 mantissa bit): a 4-bit code c holds the value
  (-1)^(c >> 3) * E2M1_MAGNITUDES[c & 7], E2M1_MAGNITUDES = (0, 0.5, 1, 1.5, 2, 3, 4, 6);
  code 8 is -0.0 (it dequantizes to 0). `E2M1_VALUES[c]` lists all 16.
- nibble order: byte i of a row holds element 2i in its low nibble (bits 0-3) and element
  2i+1 in its high nibble (bits 4-7): `packed = (code[2i+1] << 4) | code[2i]`.
- w[n, k] = E2M1_VALUES[code[n, k]] * (float(weight_scale[n, k // 16]) * weight_scale_2), the
  block scale being float8_e4m3fn and weight_scale_2 a float32 scalar (ModelOpt's order).
FP8: w = float(weight) * weight_scale (per tensor, fp32 scalar, = amax / 448).
Block FP8: w[n, k] = float(weight[n, k]) * weight_scale[n, k // 64] (fp32 [N, ceil(K/64)]).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..engine_format import BLOCK_FP8_GROUP, NVFP4_GROUP

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES)
E2M1_MAX = 6.0
E4M3_MAX = 448.0


def fp8_to_float(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Per-tensor FP8 -> float32: weight float8_e4m3fn [N, K], weight_scale fp32 [] (or [N]
    per output row). Returns fp32 [N, K]."""
    _check_dtype(weight, torch.float8_e4m3fn, "weight")
    scale = weight_scale.float()
    if scale.dim() == 1:
        scale = scale[:, None]
    return weight.float() * scale


def block_fp8_to_float(weight: torch.Tensor, weight_scale: torch.Tensor,
                       group: int = BLOCK_FP8_GROUP) -> torch.Tensor:
    """Block FP8 -> float32: weight float8_e4m3fn [N, K], weight_scale fp32 [N, ceil(K/group)]
    (one scale per output row and per `group` inputs; a last partial block has its own).
    Returns fp32 [N, K]. Raises ValueError on a scale shape that does not fit."""
    _check_dtype(weight, torch.float8_e4m3fn, "weight")
    n, k = weight.shape
    blocks = -(-k // group)
    if tuple(weight_scale.shape) != (n, blocks):
        raise ValueError(f"weight_scale shape {tuple(weight_scale.shape)}, expected {(n, blocks)}")
    scale = weight_scale.float().repeat_interleave(group, dim=1)[:, :k]
    return weight.float() * scale


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K]; element 2i from the low nibble of byte i."""
    _check_dtype(packed, torch.uint8, "packed weight")
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, values 0..15) -> float32 by the table `E2M1_VALUES`."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def nvfp4_to_float(weight: torch.Tensor, weight_scale: torch.Tensor,
                   weight_scale_2: torch.Tensor, group: int = NVFP4_GROUP) -> torch.Tensor:
    """NVFP4 -> float32: weight uint8 [N, K/2], weight_scale float8_e4m3fn [N, K/16],
    weight_scale_2 fp32 []. Returns fp32 [N, K] = e2m1 * (weight_scale * weight_scale_2).
    Raises ValueError on mismatched shapes or dtypes."""
    _check_dtype(weight_scale, torch.float8_e4m3fn, "weight_scale")
    values = e2m1_to_float(unpack_e2m1(weight))
    n, k = values.shape
    if tuple(weight_scale.shape) != (n, k // group):
        raise ValueError(f"weight_scale shape {tuple(weight_scale.shape)}, "
                         f"expected {(n, k // group)}")
    scale = weight_scale.float() * weight_scale_2.float()
    return (values.view(n, k // group, group) * scale[..., None]).view(n, k)


def dequantize_linear(fmt: str, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The float32 weight [N, K] of one linear stored in format `fmt` ("bf16", "fp8",
    "block_fp8", "nvfp4"; from the manifest, never guessed). `tensors` holds that linear's
    tensors by suffix: "weight", "weight_scale", "weight_scale_2" (others are ignored).

    Raises:
        KeyError: a tensor the format needs is missing (names it).
        ValueError: unknown format, or shapes / dtypes that do not fit.
    """
    def get(suffix: str) -> torch.Tensor:
        if suffix not in tensors:
            raise KeyError(f"{suffix!r} missing for format {fmt!r}")
        return tensors[suffix]

    if fmt == "bf16":
        return get("weight").float()
    if fmt == "fp8":
        return fp8_to_float(get("weight"), get("weight_scale"))
    if fmt == "block_fp8":
        return block_fp8_to_float(get("weight"), get("weight_scale"))
    if fmt == "nvfp4":
        return nvfp4_to_float(get("weight"), get("weight_scale"), get("weight_scale_2"))
    raise ValueError(f"unknown weight format {fmt!r}")


def dequantize(tensors: Mapping[str, torch.Tensor], prefix: str, fmt: str) -> torch.Tensor:
    """`dequantize_linear` for linear `prefix` (e.g. "model.layers.0.self_attn.q_proj") of a
    whole engine folder's tensors by full name. Raises as `dequantize_linear`, naming prefix."""
    base = prefix + "."
    sub = {k[len(base):]: v for k, v in tensors.items() if k.startswith(base)}
    try:
        return dequantize_linear(fmt, sub)
    except (KeyError, ValueError) as exc:
        raise type(exc)(f"{prefix}: {exc}") from None


def _check_dtype(t: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    if t.dtype != dtype:
        raise ValueError(f"{what} must be {dtype}, got {t.dtype}")
