#!/usr/bin/env python3
"""One plugin kernel at a full Kolibri-1 decode shape, launched a few times, for Nsight Compute:

    ncu --clock-control none -k regex:<kernel> --launch-skip 2 -c 1 --set full -o REP \\
        python3 bench/ncu_targets.py TARGET

TARGET is one of TARGETS (below): INT4 / FP8 full-causal attention at B=16, 32k (decode, and
for INT4 also 4 query tokens per stream and 16-token pages), FP8 sliding-window attention
(window 513) at B=1, moe_forward at one token and at 256 (one chunk, units by expert; also
with per-expert row lists), the NVFP4 LM head at one row, fp8_gemv at QKV's shape (one and 64
rows), qk_norm_fold_int4 at one token, and the Gluon probes' wgmma forms of the LM head and
of QKV at one row. Each runs LAUNCHES launches eagerly
(no CUDA graph: ncu profiles launch by launch) with the inputs bench/plugins.py uses (random
codes, random paged tables). `bench/gpu_session.sh` parts `na` and `nr` profile them and write
each report's details and per-instruction source counters as text.
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plugin_timing as PT  # noqa: E402
from gpu_check import load_plugins  # noqa: E402

load_plugins()
from kolibri_trt_plugins.fp8_gemv import fp8_gemv  # noqa: E402
from kolibri_trt_plugins.fp8_paged_attention import fp8_paged_attention  # noqa: E402
from kolibri_trt_plugins.int4_paged_attention import int4_paged_attention  # noqa: E402
from kolibri_trt_plugins.moe import moe_forward  # noqa: E402
from kolibri_trt_plugins.nvfp4_gemv import nvfp4_gemv  # noqa: E402
from kolibri_trt_plugins.qk_norm_fold_int4 import (  # noqa: E402
    fold_matrices,
    hadamard_rotation,
    qk_norm_fold_int4,
)

DEV, HQ, HKV, BLK, CTX = "cuda", 20, 4, 64, 32768
LAUNCHES = 5   # ncu skips the first 2 (compilation, first touch) and profiles the next


def attn_call(kind: str, B: int, q_len: int, window: int = 0, block: int = BLK):
    sl = torch.full((B,), CTX, dtype=torch.int32, device=DEV)
    cu = torch.arange(0, B + 1, dtype=torch.int32, device=DEV) * q_len
    bt, nb = PT.paged_tables(B, CTX, block)
    q = torch.randn((B * q_len, HQ, 128), device=DEV).bfloat16()
    if kind == "int4":
        kc, vc = [torch.randint(0, 256, shape, dtype=torch.uint8, device=DEV)   # values dim-major
                  for shape in ((nb, HKV, block, 64), (nb, HKV, 64, block))]
        km, vm = [torch.stack([torch.rand((nb, HKV, block), device=DEV) * 0.3 + 0.01,
                               -torch.rand((nb, HKV, block), device=DEV)], -1).half()
                  for _ in range(2)]
        return lambda: int4_paged_attention(q, kc, vc, km, vm, bt, sl, cu, CTX, q_len)
    kf, vf = [torch.randn((nb, block, HKV, 128), device=DEV).to(PT.E4M3) for _ in range(2)]
    one = torch.ones(1, device=DEV)
    return lambda: fp8_paged_attention(q, kf, vf, one, one, bt, sl, cu, CTX, q_len, window=window)


def moe_call(M: int, align_tokens: int | None = None):
    """moe_forward at M tokens; align_tokens: moe_experts.ALIGN_TOKENS for this process."""
    if align_tokens is not None:
        import importlib
        importlib.import_module("kolibri_trt_plugins.moe_experts").ALIGN_TOKENS = align_tokens
    wts = PT.moe_weights()
    x = torch.randn((M, 2560), device=DEV).bfloat16()
    return lambda: moe_forward(x, *wts, top_k=6)


def nvfp4_call(M: int):
    N, K = 131072, 2560
    w = (torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=DEV),
         (torch.rand((N, K // 16), device=DEV) + 0.25).to(PT.E4M3), torch.tensor([0.02], device=DEV))
    x = torch.randn((M, K), device=DEV).bfloat16()
    return lambda: nvfp4_gemv(x, *w)


def fp8_gemv_call(M: int, N: int = 3584, K: int = 2560):
    w = (torch.randn((N, K), device=DEV).to(PT.E4M3), torch.tensor([0.02], device=DEV))
    x = torch.randn((M, K), device=DEV).bfloat16()
    return lambda: fp8_gemv(x, *w)


def gluon_nvfp4_call(M: int):
    """bench/gluon_nvfp4_probe.py's wgmma form of the LM head (SPLIT 1, rings of 2)."""
    from gluon_nvfp4_probe import to_storage, wgmma_nvfp4
    N, K = 131072, 2560
    w = (to_storage(torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=DEV)),
         (torch.rand((N, K // 16), device=DEV) + 0.25).to(PT.E4M3), torch.tensor([0.02], device=DEV))
    x = torch.randn((M, K), device=DEV).bfloat16()
    return lambda: wgmma_nvfp4(x, *w, 1, False, 2)


def gluon_fp8_call(M: int, N: int = 3584, K: int = 2560):
    """bench/gluon_gemv_probe.py's wgmma form at QKV's shape (4 K ranges, ASYNC, FIXUP)."""
    from gluon_gemv_probe import to_storage, wgmma_gemv
    w = to_storage(torch.randn((N, K), device=DEV).to(PT.E4M3), 128)
    x = torch.randn((M, K), device=DEV).bfloat16()
    return lambda: wgmma_gemv(x, w, torch.tensor([0.02], device=DEV), 4, 128, True, 4, True)


def fold_call(T: int):
    mq, mk = [m.to(DEV) for m in fold_matrices(torch.ones(128), torch.ones(128),
                                               hadamard_rotation(3))]
    caches = [torch.zeros((4096, HKV, BLK, 64), dtype=torch.uint8, device=DEV) for _ in range(2)]
    caches += [torch.zeros((4096, HKV, BLK, 2), dtype=torch.float16, device=DEV) for _ in range(2)]
    qkv = torch.randn((T, HQ + 2 * HKV, 128), device=DEV).bfloat16()
    slots = torch.randperm(4096 * BLK, device=DEV)[:T]
    q, k, v = qkv[:, :HQ], qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:]
    return lambda: qk_norm_fold_int4(q, k, v, mq, mk, slots, *caches)


TARGETS = {  # name -> (kernel-name regex for ncu, builder)
    "int4_b1": ("_int4_attn_kernel", lambda: attn_call("int4", 1, 1)),
    "int4_b16": ("_int4_attn_kernel", lambda: attn_call("int4", 16, 1)),
    "int4_b16_q4": ("_int4_attn_kernel", lambda: attn_call("int4", 16, 4)),
    "int4_b16_blk16": ("_int4_attn_kernel", lambda: attn_call("int4", 16, 1, block=16)),
    "fp8_b16": ("_fp8_attn_kernel", lambda: attn_call("fp8", 16, 1)),
    "sliding_b1": ("_fp8_attn_kernel", lambda: attn_call("fp8", 1, 1, window=513)),
    "moe_m1": ("_moe_expert_kernel", lambda: moe_call(1)),
    "moe_m256": ("_moe_expert_kernel", lambda: moe_call(256)),
    "moe_m256_scan": ("_moe_expert_kernel", lambda: moe_call(256, 1 << 30)),  # no row lists
    "nvfp4_m1": ("_nvfp4_gemv_kernel", lambda: nvfp4_call(1)),
    "qkv_m1": ("_fp8_gemv_kernel", lambda: fp8_gemv_call(1)),
    "qkv_m64": ("_fp8_gemv_kernel", lambda: fp8_gemv_call(64)),
    "fold_t1": ("_qk_fold_int4_kernel", lambda: fold_call(1)),
    "gluon_nvfp4_m1": ("_wgmma_nvfp4", lambda: gluon_nvfp4_call(1)),
    "gluon_qkv_m1": ("_wgmma_gemv", lambda: gluon_fp8_call(1)),
}


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in TARGETS:
        print(f"usage: ncu_targets.py {{{','.join(TARGETS)}}}", file=sys.stderr)
        return 2
    fn = TARGETS[sys.argv[1]][1]()
    for _ in range(LAUNCHES):
        fn()
    torch.cuda.synchronize()
    print(f"{sys.argv[1]}: {LAUNCHES} launches done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
