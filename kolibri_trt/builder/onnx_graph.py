"""A small ONNX graph builder (opset 17) for the drafter export: primitives and initializers.

Quantized linears become custom nodes in the `kolibri` domain (the TensorRT plugin path):
- `kolibri.Fp8Linear(x, weight f8e4m3 [N, K], weight_scale f32 [])`
- `kolibri.BlockFp8Linear(x, weight f8e4m3 [N, K], weight_scale f32 [N, ceil(K/64)])`,
  attribute group_size = 64
- `kolibri.Nvfp4Linear(x, weight u8 [N, K/2], weight_scale f8e4m3 [N, K/16],
  weight_scale_2 f32 [])`, attribute group_size = 16
each computing y = x · dequant(w)^T (x float [M, K] -> y float [M, N]; formats:
`kolibri_trt/builder/dequant.py`). bf16 linears are Cast(bf16 -> f32) + Gemm(transB=1), which
onnxruntime runs on CPU.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from onnx import TensorProto, helper

OPSET = 17
DOMAIN = "kolibri"
_DTYPES = {torch.bfloat16: TensorProto.BFLOAT16, torch.float32: TensorProto.FLOAT,
           torch.float8_e4m3fn: TensorProto.FLOAT8E4M3FN, torch.uint8: TensorProto.UINT8,
           torch.int64: TensorProto.INT64, torch.float64: TensorProto.DOUBLE}
CUSTOM = {"fp8": "Fp8Linear", "block_fp8": "BlockFp8Linear", "nvfp4": "Nvfp4Linear"}


class Graph:
    """Nodes and initializers of one ONNX graph; every method returns output value names."""

    def __init__(self):
        self.nodes, self.inits, self._n, self._names = [], [], 0, set()

    def op(self, op_type: str, *inputs: str, domain: str = "", **attrs) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], domain=domain, **attrs))
        return out

    def tensor(self, name: str, t: torch.Tensor) -> str:
        """An initializer from a torch tensor (raw little-endian bytes, exact for bf16/fp8);
        a name already added is reused."""
        if name in self._names:
            return name
        self._names.add(name)
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.uint8) if t.dtype in (torch.bfloat16, torch.float8_e4m3fn) else t
        data = raw.numpy().tobytes() if raw.dim() else np.array(raw.item(),
                                                                dtype=raw.numpy().dtype).tobytes()
        self.inits.append(helper.make_tensor(name, _DTYPES[t.dtype], list(t.shape), data,
                                             raw=True))
        return name

    def const(self, value, dtype=torch.float32) -> str:
        self._n += 1
        return self.tensor(f"const_{self._n}", torch.as_tensor(value, dtype=dtype))

    # ---- primitives ---------------------------------------------------------------------
    def rms_norm(self, x: str, weight: str, eps: float) -> str:
        """x * 1/sqrt(mean(x^2, -1) + eps) * float(weight) (fp32, like `ops.rms_norm`)."""
        ms = self.op("ReduceMean", self.op("Mul", x, x), axes=[-1], keepdims=1)
        inv = self.op("Reciprocal", self.op("Sqrt", self.op("Add", ms, self.const(eps))))
        return self.op("Mul", self.op("Mul", x, inv), self.op("Cast", weight, to=TensorProto.FLOAT))

    def silu(self, x: str) -> str:
        return self.op("Mul", x, self.op("Sigmoid", x))

    def linear(self, x: str, prefix: str, tensors: dict, fmt: str | None) -> str:
        """y = x · W^T for linear `prefix`: Gemm on bf16 weights, or a `kolibri` custom node."""
        if fmt in (None, "bf16"):
            w = self.tensor(f"{prefix}.weight", tensors[f"{prefix}.weight"].to(torch.bfloat16))
            return self.op("Gemm", x, self.op("Cast", w, to=TensorProto.FLOAT), transB=1)
        names = ["weight", "weight_scale"] + (["weight_scale_2"] if fmt == "nvfp4" else [])
        inputs = [self.tensor(f"{prefix}.{n}", tensors[f"{prefix}.{n}"]) for n in names]
        group = {"fp8": 0, "block_fp8": 64, "nvfp4": 16}[fmt]
        return self.op(CUSTOM[fmt], x, *inputs, domain=DOMAIN, group_size=group)

    def rope_tables(self, positions: str, head_dim: int, theta: float) -> tuple[str, str]:
        """cos, sin fp32 [T, D] for int64 positions [T]: rotate-half tables with
        inv_freq_i = theta^(-2i/D), angles in float64 (as `ops.rope_cos_sin`)."""
        i = torch.arange(0, head_dim, 2, dtype=torch.float64)
        inv = self.const(theta ** (-i / head_dim), torch.float64)
        pos = self.op("Unsqueeze", self.op("Cast", positions, to=TensorProto.DOUBLE),
                      self.const([1], torch.int64))
        ang = self.op("Mul", pos, inv)
        ang = self.op("Concat", ang, ang, axis=-1)
        cos = self.op("Cast", self.op("Cos", ang), to=TensorProto.FLOAT)
        sin = self.op("Cast", self.op("Sin", ang), to=TensorProto.FLOAT)
        return cos, sin

    def rope(self, x: str, cos: str, sin: str, head_dim: int) -> str:
        """x [T, h, D]: x * cos + rotate_half(x) * sin, tables broadcast over heads."""
        half = head_dim // 2
        lo = self.slice(x, 0, half, axis=2)
        hi = self.slice(x, half, head_dim, axis=2)
        rotated = self.op("Concat", self.op("Neg", hi), lo, axis=2)
        one = self.const([1], torch.int64)
        c, s = self.op("Unsqueeze", cos, one), self.op("Unsqueeze", sin, one)
        return self.op("Add", self.op("Mul", x, c), self.op("Mul", rotated, s))

    def slice(self, x: str, start, end, axis: int) -> str:
        """x[start:end] along `axis`; start / end are ints or int64 [1] value names."""
        def val(v):
            return v if isinstance(v, str) else self.const([v], torch.int64)
        return self.op("Slice", x, val(start), val(end), self.const([axis], torch.int64))

    def reshape(self, x: str, shape: list[int]) -> str:
        return self.op("Reshape", x, self.const(shape, torch.int64))

    def attention(self, q: str, k: str, v: str, allowed: str, heads: int, kv_heads: int,
                  head_dim: int) -> str:
        """softmax(q k^T / sqrt(D), masked) v with GQA (query head n reads KV head n // g).
        q [B, Hq, D], k / v [T, Hkv, D], allowed bool [B, T] -> [B, Hq * D]."""
        g = heads // kv_heads
        if g > 1:
            def rep(t):
                e = self.op("Unsqueeze", t, self.const([2], torch.int64))
                e = self.op("Expand", e, self.op("Concat", self.op("Shape", t, end=2),
                                                 self.const([g, head_dim], torch.int64), axis=0))
                return self.reshape(e, [0, heads, head_dim])
            k, v = rep(k), rep(v)
        qt = self.op("Transpose", q, perm=[1, 0, 2])
        kt = self.op("Transpose", k, perm=[1, 2, 0])
        scores = self.op("Div", self.op("MatMul", qt, kt), self.const(math.sqrt(head_dim)))
        scores = self.op("Where", allowed, scores, self.const(float("-inf")))
        probs = self.op("Softmax", scores, axis=-1)
        out = self.op("MatMul", probs, self.op("Transpose", v, perm=[1, 0, 2]))
        return self.reshape(self.op("Transpose", out, perm=[1, 0, 2]), [0, heads * head_dim])
