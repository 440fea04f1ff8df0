#!/usr/bin/env python3
"""All-in-one H200 check of kolibri_trt_plugins: every op against its torch reference (fp32 on
the GPU), eager and inside a CUDA graph replayed twice (bit-identical to eager), and batch
invariance (a row computed alone equals the same row inside a larger batch, bit for bit).

    python3 bench/gpu_check.py [--only fold,int4,fp8attn,nvfp4,nvfp4wg,fp8wg,fp8gemv,fp8fused,moe,
        moepf,splitk,norm,normfused,qknorm,gumbel,ringattn,ropering,vocabargmax,chainindex]
        [--log FILE]
    python3 bench/gpu_check.py --device cpu --small     # dry run of the script on the ref path

Exit status 1 if any check fails. Tolerances: see TOL.

The checks live in gpu_check_attn.py (fold, int4, fp8attn, int4_noasm), gpu_check_gemm.py
(nvfp4, nvfp4wg, fp8wg, fp8gemv, fp8fused, moe, moepf, splitk), gpu_check_misc.py (norm, normfused, qknorm,
gumbel, vocabargmax)
and
gpu_check_drafter.py (ringattn, ropering, chainindex); the
shared state (RESULTS, DEV, GRAPHS), TOL and the record / graph helpers in gpu_check_base.py.
They are all importable from here as before (``gpu_check.load_plugins``, ``.RESULTS``,
``.check_attention``, ...); ``gpu_check.DEV`` / ``.GRAPHS`` read the current values.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import traceback

import gpu_check_base as B
import torch

# the names below are re-exported: other bench scripts use gpu_check.<name> (F401)
from gpu_check_attn import (  # noqa: F401
    attn_cases,
    attn_inputs,
    check_attention,
    check_attention_invariance,
    check_fold,
    check_int4_noasm,
    fold_case,
    run_attn,
)
from gpu_check_base import (  # noqa: F401
    CODE_FLIP_FRAC,
    GUMBEL_FLIP_FRAC,
    NORM_FLIP_FRAC,
    RESULTS,
    TOL,
    check_graph,
    graph_replay,
    load_plugins,
    record,
    same,
)
from gpu_check_drafter import (check_chain_index, check_ring_attention,
                               check_rope_ring_write)
from gpu_check_gemm import (  # noqa: F401
    check_fp8fused,
    check_fp8_wgmma,
    check_fp8gemv,
    check_gemv_invariance,
    check_moe,
    check_moe_prefetch,
    check_nvfp4,
    check_nvfp4_wgmma,
    check_split_k,
)
from gpu_check_misc import (  # noqa: F401
    check_gumbel,
    check_norm,
    check_norm_fused,
    check_vocab_argmax,
    check_vocab_argmax_keyed,
    check_qk_norm_rope,
    flip_frac,
    gumbel_case,
    qk_case,
)
from kolibri_trt_plugins import testing as T
from plugin_settings import apply_settings

ROOT = pathlib.Path(__file__).resolve().parents[1]


def __getattr__(name):
    """gpu_check.DEV / gpu_check.GRAPHS: the values main() set (they live in gpu_check_base)."""
    if name in ("DEV", "GRAPHS"):
        return getattr(B, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SECTIONS = {
    "fold": lambda g, small: check_fold(g),
    "int4": lambda g, small: check_attention("int4", g, small),
    "fp8attn": lambda g, small: check_attention("fp8", g, small),
    "int4_noasm": lambda g, small: check_int4_noasm(g, small),
    "nvfp4": check_nvfp4,
    "nvfp4wg": check_nvfp4_wgmma,
    "fp8wg": check_fp8_wgmma,
    "fp8gemv": check_fp8gemv,
    "fp8fused": check_fp8fused,
    "moe": check_moe,
    "moepf": check_moe_prefetch,
    "splitk": check_split_k,
    "norm": check_norm,
    "normfused": check_norm_fused,
    "qknorm": check_qk_norm_rope,
    "gumbel": check_gumbel,
    "ringattn": check_ring_attention,
    "ropering": check_rope_ring_write,
    "vocabargmax": lambda g, small: (check_vocab_argmax(g, small),
                                     check_vocab_argmax_keyed(g, small)),
    "chainindex": check_chain_index,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                    help="a plugin module setting for this run, e.g. moe_experts.SWAP_TOKENS=0")
    args = ap.parse_args()
    apply_settings(args.set)
    B.DEV = args.device   # the check modules read B.DEV / B.GRAPHS when they run
    B.GRAPHS = B.DEV == "cuda"
    if B.DEV == "cuda":
        print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for sec in args.only.split(","):
        t0 = time.time()
        try:
            SECTIONS[sec](T.gen(1000 + list(SECTIONS).index(sec)), args.small)
        except Exception as exc:  # keep going: one broken op must not hide the others' results
            traceback.print_exc()
            record(f"{sec} (crashed)", False, repr(exc)[:300])
        print(f"-- {sec}: {time.time() - t0:.1f} s", flush=True)
    bad = [r for r in RESULTS if not r[1]]
    print(f"\nSUMMARY: {len(RESULTS) - len(bad)}/{len(RESULTS)} passed")
    for name, _, msg in bad:
        print(f"  FAIL {name}: {msg}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
