"""Row-invariant products for the plain-torch references: a row's result must not depend on how
many rows share the call (batch invariance: a stream's tokens may not change with the batch it
is served in; shared/spec and the speculative decoding issue).

Measured on CPU with torch 2.13: an fp32 GEMM gives bit-identical rows for 4, 8 and >= 12 rows
but not for 1-3, 5-7 or 9-11 (other kernels), and so do the batched products of attention over
1-3 query rows; padding the rows with zeros to a multiple of ROW_MULTIPLE makes every row count
agree. tests/plugins/test_rows.py checks the property on the
machine it runs on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ROW_MULTIPLE = 8


def pad_rows(x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """x [n, ...] with rows of ``fill`` appended up to a multiple of ROW_MULTIPLE."""
    pad = -x.shape[0] % ROW_MULTIPLE
    return torch.cat([x, x.new_full((pad, *x.shape[1:]), fill)]) if pad else x


def linear_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T with rows padded to a multiple of ROW_MULTIPLE: x [..., K], w [N, K] (same
    dtype) -> [..., N]. Source: measured (module docstring)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    n = x2.shape[0]
    return F.linear(pad_rows(x2), w)[:n].reshape(*shape[:-1], w.shape[0])
