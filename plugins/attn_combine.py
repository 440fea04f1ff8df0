"""Second pass of split-KV paged attention: merge the per-partition partial results of each row.

The attention kernels (int4_paged_attention, fp8_paged_attention) cut every stream's keys at fixed
absolute partition boundaries (multiples of PART positions) and write, per query row (token,
head) and split j: m (running max of the scores, in log2 units), l (sum of 2^(s-m)) and acc
(sum of 2^(s-m)·v, fp32 [128]). A split that holds no key for the row has m = -inf; its l and
acc are never read. This kernel merges the splits of one row in a fixed order (chunks of SPLIT_CHUNK
from split 0), so a row's output does not depend on the batch it was computed in.
"""

from __future__ import annotations

import torch

from ._common import NAMESPACE, check_tensor, jit, kernel_path, launch, next_pow2, tl
from ._common import pdl_enter, pdl_release

SPLIT_CHUNK = 16


@jit
def _attn_combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, S,
                         S_P: tl.constexpr, SC: tl.constexpr, D: tl.constexpr,
                         PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    jj = tl.arange(0, S_P)
    m_all = tl.load(m_ptr + row * S + jj, mask=jj < S, other=float("-inf"))
    m_max = tl.max(m_all, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    d = tl.arange(0, D)
    acc = tl.zeros([D], dtype=tl.float32)
    l_tot = tl.zeros([SC], dtype=tl.float32)
    for c in range(0, S, SC):
        j = c + tl.arange(0, SC)
        mj = tl.load(m_ptr + row * S + j, mask=j < S, other=float("-inf"))
        ok = mj > float("-inf")
        w = tl.where(ok, tl.exp2(mj - m_max), 0.0)
        lj = tl.load(l_ptr + row * S + j, mask=ok, other=0.0)
        aj = tl.load(acc_ptr + (row * S + j)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        l_tot += w * lj
        acc += tl.sum(aj * w[:, None], 0)
    pdl_release(PDL)      # the next kernel may launch now (PDL 2)
    l_sum = tl.sum(l_tot, 0)
    out = acc / tl.where(l_sum > 0, l_sum, 1.0)
    tl.store(out_ptr + row * D + d, out.to(tl.bfloat16))


def attn_combine_ref(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """Torch reference: m, l fp32 [R, S] (log2 units, -inf = empty), acc fp32 [R, S, D] -> bf16 [R, D]."""
    ok = m > float("-inf")
    mm = torch.where(ok, m, torch.full_like(m, float("-inf"))).amax(1, keepdim=True)
    mm = torch.where(mm == float("-inf"), torch.zeros_like(mm), mm)
    w = torch.where(ok, torch.exp2(m - mm), torch.zeros_like(m))
    lsum = (w * torch.where(ok, l, torch.zeros_like(l))).sum(1, keepdim=True)
    a = (torch.where(ok[..., None], acc, torch.zeros_like(acc)) * w[..., None]).sum(1)
    return (a / torch.where(lsum > 0, lsum, torch.ones_like(lsum))).to(torch.bfloat16)


@torch.library.custom_op(f"{NAMESPACE}::attn_combine", mutates_args=())
def _attn_combine_op(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    if kernel_path(m, "attn_combine") == "ref":
        return attn_combine_ref(m, l, acc)
    return launch_attn_combine(m, l, acc, False)


@_attn_combine_op.register_fake
def _(m, l, acc):
    return torch.empty((m.shape[0], acc.shape[-1]), dtype=torch.bfloat16, device=m.device)


def launch_attn_combine(m, l, acc, interpret: bool = False, pdl_early: bool = False
                        ) -> torch.Tensor:
    """The merge kernel without argument checks or op dispatch, for the paged-attention ops'
    CUDA bodies (already inside their own op; they allocate m, l, acc as :func:`attn_combine`
    requires). Same arguments and result as :func:`attn_combine`; pdl_early: the launch's
    `_common.launch` option (the attention ops' group)."""
    R, S = m.shape
    D = acc.shape[-1]
    out = torch.empty((R, D), dtype=torch.bfloat16, device=m.device)
    if R:
        launch(_attn_combine_kernel, (R,), m, l, acc, out, S, S_P=next_pow2(S), SC=SPLIT_CHUNK,
               D=D, num_warps=4, interpret=interpret, pdl_early=pdl_early)
    return out


def attn_combine(m, l, acc, interpret: bool = False) -> torch.Tensor:
    """Merge split-KV partials.

    Args:
        m, l: fp32 [R, S] per row and split (m in log2 units; -inf marks a split without keys).
        acc: fp32 [R, S, D], D = 128.
    Returns: bf16 [R, D] = sum_j 2^(m_j-M)·acc_j / sum_j 2^(m_j-M)·l_j (0 for a row with no key).
    Raises: ValueError naming the argument on a wrong shape/dtype/stride.
    Source: flash-decoding split-KV merge; fixed order for batch invariance (issue 6).
    """
    check_tensor("m", m, torch.float32, (None, None))
    check_tensor("l", l, torch.float32, tuple(m.shape), m.device)
    check_tensor("acc", acc, torch.float32, (m.shape[0], m.shape[1], 128), m.device)
    if interpret:
        return launch_attn_combine(m, l, acc, True)
    return torch.ops.kolibri_plugins.attn_combine(m, l, acc)
