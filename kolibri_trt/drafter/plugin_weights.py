"""The drafter's stored weights as the kernels take them, and its context K/V ring
(`DrafterPlugin` in `plugin_drafter.py` runs them; layouts: `plugins/LAYOUTS.md`).

`PluginLinear`: one body linear, "block_fp8" ([N, K] e4m3 + [N, K/64] fp32 scales, through
`fp8_gemv`; K padded with zero columns to a multiple of 64 at load) or "bf16" (`ops.linear`).
`PluginHead`: the draft-vocabulary head slice, "nvfp4" (`nvfp4_gemv`) or "bf16".
`DrafterRing`: per stream slot R = context_window + depth * block_size rows of K/V per layer
(one tensor for all layers) plus the absolute position each row holds (-1 = empty); the last
slot is a trash slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kolibri_trt_plugins import add_rms_norm, fp8_gemv, nvfp4_gemv
from kolibri_trt_plugins.fp8_gemv import interleave_rows
from kolibri_trt_plugins.vocab_argmax import KeyedRows

from ..model import ops
from .config import DrafterConfig

BODY_FORMATS = ("block_fp8", "bf16")
HEAD_FORMATS = ("nvfp4", "bf16")
BLOCK = 64           # block-FP8 group (engine_format.BLOCK_FP8_GROUP)
ATTN_IMPLS = ("dense", "sdpa", "kernel")   # DrafterPlugin's attn


class PluginLinear:
    """y = x Wᵀ (bf16 [M, K] -> bf16 [M, N]) for one stored linear.

    fmt "block_fp8": weight float8_e4m3fn [N, K], scale fp32 [N, ceil(K/64)] -> `fp8_gemv`;
    "bf16": weight bf16 [N, K] -> `ops.linear` (the reference drafter's product).
    """

    def __init__(self, fmt: str, weight: torch.Tensor, scale: torch.Tensor | None = None):
        if fmt not in BODY_FORMATS:
            raise ValueError(f"body format {fmt!r}: the drafter path runs {list(BODY_FORMATS)}")
        self.fmt, self.k = fmt, int(weight.shape[1])
        self.pad = -self.k % BLOCK if fmt == "block_fp8" else 0
        if self.pad:   # zero columns: their block scale multiplies zeros
            w8 = weight.view(torch.uint8)
            weight = torch.cat([w8, w8.new_zeros(w8.shape[0], self.pad)], 1)
            weight = weight.view(torch.float8_e4m3fn)
        self.weight = weight.contiguous()
        self.scale = None if scale is None else scale.float().contiguous()

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    def rows(self, lo: int, hi: int) -> "PluginLinear":
        """The linear of output rows lo..hi-1 (a view: rows of a row-major weight)."""
        out = PluginLinear.__new__(PluginLinear)
        out.fmt, out.k, out.pad = self.fmt, self.k, self.pad
        out.weight = self.weight[lo:hi]
        out.scale = None if self.scale is None else self.scale[lo:hi]
        return out

    def __call__(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-6,
                 act: str = "none", residual: torch.Tensor | None = None,
                 norm_segments: int = 1, x_rows: torch.Tensor | None = None) -> torch.Tensor:
        """y for x bf16 [M, K] with `fp8_gemv`'s fused glue: x_rows (int64 [M]: x is a table
        and row m reads x[x_rows[m]], an embedding lookup), norm (bf16 gain [K], RMSNorm of x
        first, add_rms_norm's maths; per K/norm_segments-column segment), residual (bf16
        [M, N], added), act ("silu" after the residual; "swiglu" for an `interleaved` gate/up
        linear: [M, N/2]). "bf16" and padded linears run the same steps as separate ops."""
        if self.fmt == "block_fp8" and not self.pad:
            return fp8_gemv(x, self.weight, self.scale, norm=norm, eps=eps, act=act,
                            residual=residual, norm_segments=norm_segments, x_rows=x_rows)
        if x_rows is not None:
            x = F.embedding(x_rows, x)
        if norm is not None:
            seg = x.shape[1] // norm_segments
            x = torch.cat([add_rms_norm(x[:, i * seg:(i + 1) * seg], None,
                                        norm[i * seg:(i + 1) * seg], eps)[1]
                           for i in range(norm_segments)], 1)
        if self.fmt == "bf16":
            y = ops.linear(x, self.weight)
        else:
            y = fp8_gemv(F.pad(x, (0, self.pad)), self.weight, self.scale)
        if act == "swiglu":
            return F.silu(y[:, 0::2]) * y[:, 1::2]
        y = y if residual is None else y + residual
        return F.silu(y) if act == "silu" else y

    @staticmethod
    def interleaved(gate: "PluginLinear", up: "PluginLinear") -> "PluginLinear":
        """gate and up (same shape and format) as one linear with rows interleaved (row 2i
        gate_i, 2i + 1 up_i; block scales likewise): the layout `act="swiglu"` reads."""
        out = PluginLinear.__new__(PluginLinear)
        out.fmt, out.k, out.pad = gate.fmt, gate.k, gate.pad
        if gate.fmt == "bf16":
            out.weight = interleave_rows(gate.weight, up.weight)
        else:
            out.weight = interleave_rows(gate.weight.view(torch.uint8),
                                         up.weight.view(torch.uint8)).view(torch.float8_e4m3fn)
        out.scale = None if gate.scale is None else interleave_rows(gate.scale, up.scale)
        return out

    @staticmethod
    def fused(parts: list["PluginLinear"]) -> "PluginLinear":
        """One linear whose output rows are the parts' rows in order (same K, same format)."""
        first = parts[0]
        out = PluginLinear.__new__(PluginLinear)
        out.fmt, out.k, out.pad = first.fmt, first.k, first.pad
        if first.fmt == "bf16":
            out.weight = torch.cat([p.weight for p in parts]).contiguous()
        else:
            out.weight = torch.cat([p.weight.view(torch.uint8) for p in parts]
                                   ).view(torch.float8_e4m3fn).contiguous()
        out.scale = None if first.scale is None else \
            torch.cat([p.scale for p in parts]).contiguous()
        return out


class PluginHead:
    """The draft-vocabulary head slice: bf16 [M, H] -> fp32 logits [M, Vd].

    "nvfp4": weight uint8 [Vd, H/2], scale e4m3 [Vd, H/16], scale_2 fp32 [] -> `nvfp4_gemv`
    (bf16 logits, then fp32); "bf16": fp32 weight [Vd, H] and `ops.linear` in fp32 (the
    reference's head product)."""

    def __init__(self, fmt: str, weight: torch.Tensor, scale: torch.Tensor | None = None,
                 scale_2: torch.Tensor | None = None):
        if fmt not in HEAD_FORMATS:
            raise ValueError(f"head format {fmt!r}: the drafter path runs {list(HEAD_FORMATS)}")
        self.fmt = fmt
        self.weight = weight.float().contiguous() if fmt == "bf16" else weight.contiguous()
        self.scale, self.scale_2 = scale, scale_2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fmt == "bf16":
            return ops.linear(x.float(), self.weight)
        return nvfp4_gemv(x, self.weight, self.scale, self.scale_2).float()

    def into(self, x: torch.Tensor, out: torch.Tensor, norm: torch.Tensor | None = None,
             eps: float = 1e-6) -> None:
        """The logits of x into out, fp32 [M, Vd] (any row stride): the values of `self(x)`,
        the NVFP4 head's bf16 converted by the copy (no `.float()` and no stacking after).
        norm: bf16 [H] gain of an RMSNorm applied to x first (`scores`)."""
        out.copy_(self.scores(x, norm, eps))

    def scores(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-6
               ) -> torch.Tensor:
        """The logits of x in the product's own dtype, [M, Vd]: bf16 for "nvfp4" (the values
        `self(x)` converts exactly to fp32, so their argmax is the same index), fp32 for
        "bf16"; no conversion launch (the drafter's heads without logits). norm: bf16 [H]
        gain: x is RMS-normalised first (add_rms_norm's maths; fused into `nvfp4_gemv`)."""
        if self.fmt == "bf16":
            if norm is not None:
                x = add_rms_norm(x, None, norm, eps)[1]
            return ops.linear(x.float(), self.weight)
        return nvfp4_gemv(x, self.weight, self.scale, self.scale_2, norm=norm, eps=eps)


@dataclass(frozen=True)
class DrafterLayerWeights:
    """One body layer in kernel layouts."""

    input_norm: torch.Tensor                 # fp32 [H] (bf16 values)
    post_norm: torch.Tensor                  # fp32 [H] (bf16 values)
    qkv: PluginLinear                        # [(Hq + 2 Hkv) D, H]: q_proj, k_proj, v_proj rows
    kv: PluginLinear                         # the k_proj, v_proj rows of qkv (a view)
    o_proj: PluginLinear                     # [H, Hq D]
    w13: PluginLinear                        # [2 I, H]: gate_proj, up_proj rows interleaved
    down: PluginLinear                       # [H, I]
    spine: tuple[torch.Tensor, PluginLinear, PluginLinear] | None   # (norm fp32 [H], A, U)


@dataclass
class DrafterRing:
    """The drafter's context K/V in static buffers (module docstring).

    kv: bf16 [layers, 2, slots + 1, R, Hkv, D], per layer the keys (with RoPE) then the
    values, one tensor so that a commit writes every layer's rows with one index_put and a
    round gathers a layer's keys and values with one index_select; k, v: per layer views
    kv[i, 0], kv[i, 1] [slots + 1, R, Hkv, D]; pos: int64 [slots + 1, R], the absolute position
    each ring row holds, -1 = empty. Row `trash` = slots is written by padding and never read
    by a real stream. Per slot, how its stream's heads pick (`keyed`, the tables of
    kolibri_trt_plugins.vocab_argmax.KeyedRows): temperature fp32 [slots + 1] (0 = greedy),
    seed_key int64 [slots + 1], base int64 [slots + 1] (output position = position - base)."""

    kv: torch.Tensor
    pos: torch.Tensor
    k: list[torch.Tensor] = field(init=False, repr=False)
    v: list[torch.Tensor] = field(init=False, repr=False)
    temperature: torch.Tensor = field(init=False, repr=False)
    seed_key: torch.Tensor = field(init=False, repr=False)
    base: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        self.k = [self.kv[i, 0] for i in range(self.kv.shape[0])]
        self.v = [self.kv[i, 1] for i in range(self.kv.shape[0])]
        z, dev = self.pos.shape[0], self.pos.device
        self.temperature = torch.zeros(z, dtype=torch.float32, device=dev)
        self.seed_key = torch.zeros(z, dtype=torch.long, device=dev)
        self.base = torch.zeros(z, dtype=torch.long, device=dev)

    def keyed(self, slots: torch.Tensor, positions: torch.Tensor) -> KeyedRows:
        """The heads' `KeyedRows` for rows of slots int64 [N] at positions int64 [N] (the
        block rows' own positions p + j; their drafts stand at p + j + 2)."""
        return KeyedRows(slots, positions, self.temperature, self.seed_key, self.base)

    def set_keys(self, slot: int, temperature: float, seed_key: int, base: int) -> None:
        """How `slot`'s heads pick from now on (class docstring): fills on the device, no host
        sync (call between rounds, on the rounds' stream)."""
        self.temperature[slot] = temperature
        self.seed_key[slot] = seed_key
        self.base[slot] = base

    @property
    def size(self) -> int:
        return int(self.pos.shape[1])

    @property
    def trash(self) -> int:
        return int(self.pos.shape[0]) - 1

    @classmethod
    def allocate(cls, config: DrafterConfig, num_slots: int, depth: int,
                 device: str | torch.device) -> "DrafterRing":
        c = config
        r = c.context_window + depth * c.block_size
        shape = (c.num_hidden_layers, 2, num_slots + 1, r, c.num_key_value_heads, c.head_dim)
        return cls(torch.zeros(shape, dtype=torch.bfloat16, device=device),
                   torch.full((num_slots + 1, r), -1, dtype=torch.long, device=device))

    def clear(self, slot: int) -> None:
        """Forget every row of `slot` (a stream slot handed to a new stream)."""
        self.pos[slot].fill_(-1)
