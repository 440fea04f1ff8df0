"""Row-invariant products for the plain-torch references: a row's result must not depend on how
many rows share the call (batch invariance: a stream's tokens may not change with the batch it
is served in; shared/spec and the speculative decoding issue).

Measured on CPU with torch 2.13: which GEMM kernel (and K order) an fp32 product takes depends
on its row count and on the processor. On one machine rows agreed for 4, 8 and >= 12 rows but
not for 1-3, 5-7 or 9-11; on an AVX-512 one (2026-12-07) 8 rows differed from 16 or more at
512x256, and at K = 2560 every row count up to about 320 differed from 1,024. So products run
in blocks of exactly ROW_MULTIPLE rows (the last padded with zeros): every row meets the same
kernel whatever the count. Attention's batched products over 128-wide heads agreed at 8, 16
and 24 query rows there; they pad to ROW_MULTIPLE only. tests/plugins/test_rows.py checks both
on the machine it runs on.
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
    """x @ w^T in blocks of ROW_MULTIPLE rows (the last padded): x [..., K], w [N, K] (same
    dtype) -> [..., N]. Source: measured (module docstring)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    n = x2.shape[0]
    y = torch.cat([F.linear(block, w) for block in pad_rows(x2).split(ROW_MULTIPLE)])
    return y[:n].reshape(*shape[:-1], w.shape[0])
