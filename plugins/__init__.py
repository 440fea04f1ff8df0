"""kolibri_trt_plugins: Triton kernels (registered as torch custom ops) for Kolibri-1 serving.

Installed from ``plugins/`` as ``kolibri_trt_plugins``. Depends on torch (and Triton on CUDA);
never imports kolibri_trt. Every op is ``torch.ops.kolibri_plugins.<name>``; CPU tensors take the
plain-torch reference path, CUDA tensors the Triton kernel (no silent fallback). Data layouts:
plugins/LAYOUTS.md. Measurements: plugins/NOTES.md.

Ops (module: public function):
    qk_norm_fold_int4: qk_norm_fold_int4      QK-norm + rotation fold, INT4 K/V cache write
    int4_paged_attention: int4_paged_attention paged attention over the rotated INT4 cache
    fp8_paged_attention: fp8_paged_attention   paged sliding-window attention, FP8 cache
    fp8_kv_write: fp8_kv_write                 new K/V into the FP8 paged cache
    attn_combine: attn_combine                 split-KV merge used by both attention ops
    nvfp4_gemv: nvfp4_gemv                     NVFP4 weight-only GEMM (LM head, drafter head)
    nvfp4_wgmma: nvfp4_wgmma                   the same on wgmma (Hopper, Gluon; weights by
                                               nvfp4_wgmma.to_wgmma_storage; lm_head_kernel)
    fp8_gemv: fp8_gemv                         FP8 per-tensor / per-channel / block-1x64 GEMM
    fp8_wgmma: fp8_wgmma                       the same (per-tensor scale) on wgmma (Hopper, Gluon;
                                               weights by fp8_wgmma.to_wgmma_storage;
                                               attention_linear_kernel)
    gemv_add_rms_norm: fp8_gemv_add_rms_norm   fp8_gemv, then residual add + RMSNorm (o_proj)
    moe_route: moe_route                       router + top-k
    moe: moe_forward                           routed FP8 experts + shared expert
    add_rms_norm: add_rms_norm                 residual add + RMSNorm (decoder norms, final norm)
    qk_norm_rope: qk_norm_rope                 per-head QK RMSNorm + RoPE (FP8-cache layers)
    qk_norm_rope_kv_write: qk_norm_rope_kv_write  the same + the FP8 cache write of K/V
    gumbel_argmax: gumbel_argmax               position-keyed Gumbel-max sampling, one id per row
    ring_attention: ring_attention             the block drafter's ring attention (one launch)
    rope_ring_write: rope_ring_write           the drafter's q/k RoPE + K/V ring write (one launch)
    vocab_argmax: vocab_argmax                 greedy pick over a draft vocabulary (the heads)
    chain_index: chain_index                   a chained drafter round's index columns
"""

from .add_rms_norm import add_rms_norm
from .attn_combine import attn_combine
from .chain_index import chain_index
from .fp8_gemv import fp8_gemv
from .fp8_wgmma import fp8_wgmma
from .fp8_kv_write import fp8_kv_write
from .fp8_paged_attention import fp8_paged_attention
from .gumbel_argmax import gumbel_argmax
from .int4_paged_attention import int4_paged_attention
from .gemv_add_rms_norm import fp8_gemv_add_rms_norm
from .moe import moe_forward
from .moe_route import moe_route
from .nvfp4_gemv import nvfp4_gemv
from .nvfp4_wgmma import nvfp4_wgmma
from .qk_norm_fold_int4 import fold_matrices, hadamard_rotation, qk_norm_fold_int4
from .qk_norm_rope import qk_norm_rope
from .qk_norm_rope_kv_write import qk_norm_rope_kv_write
from .ring_attention import ring_attention
from .rope_ring_write import rope_ring_write
from .vocab_argmax import vocab_argmax

__all__ = [
    "add_rms_norm", "attn_combine", "chain_index", "fp8_gemv", "fp8_gemv_add_rms_norm",
    "fp8_wgmma",
    "fp8_kv_write", "fp8_paged_attention", "gumbel_argmax", "int4_paged_attention",
    "moe_forward", "moe_route", "nvfp4_gemv", "nvfp4_wgmma",
    "qk_norm_fold_int4", "qk_norm_rope", "qk_norm_rope_kv_write", "ring_attention",
    "rope_ring_write", "vocab_argmax",
    "fold_matrices", "hadamard_rotation",
]
