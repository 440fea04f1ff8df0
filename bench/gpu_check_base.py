"""State and helpers shared by bench/gpu_check.py and its check modules (gpu_check_attn,
gpu_check_gemm, gpu_check_misc): the results list, tolerances, record / CUDA-graph helpers, and
the run-time switches DEV and GRAPHS that gpu_check.main() sets here.

Read DEV / GRAPHS as ``B.DEV`` / ``B.GRAPHS`` (``import gpu_check_base as B``) when a check
runs; ``from gpu_check_base import DEV`` would copy the value at import time. This module, not
gpu_check.py, holds them because gpu_check.py runs as ``__main__``: a check module that did
``import gpu_check`` would get a second copy of it, with its own globals.
"""

from __future__ import annotations

import torch


def load_plugins():
    """import kolibri_trt_plugins, mapped onto ./plugins when the repo is not pip-installed
    (`standalone.py`)."""
    import standalone  # noqa: F401, I001  (first: it maps kolibri_trt_plugins)
    import kolibri_trt_plugins
    return kolibri_trt_plugins


load_plugins()

TOL = {  # relative error vs the fp32 reference
    "attn": 1e-2,   # bf16 output (2^-9) + fp16 P·V operands; measured ~4e-3
    "gemv": 1e-2,   # bf16 output rounding; products are exact, fp32 sums in another order
    "moe": 2e-2,    # bf16 intermediate activation may round differently, then bf16 output
    "fold_q": 1e-2,  # bf16 output of an fp32 128x128 product
    "norm": 4e-3,   # bf16 outputs; fp32 sum order of mean(x²) (and rsqrt's last bit) may differ
}
CODE_FLIP_FRAC = 1e-3  # INT4 codes may differ by one step at rounding boundaries (fp32 order)
NORM_FLIP_FRAC = 2e-2  # norm outputs may move by one bf16 ulp at rounding boundaries (sum order)
GUMBEL_FLIP_FRAC = 0.0  # sampled ids: IEEE div as torch; tl.log is libdevice logf (FTZ build)

RESULTS: list[tuple[str, bool, str]] = []
DEV = "cuda"     # set by gpu_check.main() (--device)
GRAPHS = True    # set by gpu_check.main(): CUDA graph replays only on cuda


def record(name, ok, msg):
    RESULTS.append((name, bool(ok), msg))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)


def graph_replay(fn):
    """Capture fn() in a CUDA graph, replay twice; return the two replays' outputs (cloned)."""
    if not GRAPHS:
        return None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    res = []
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        res.append([o.clone() for o in (out if isinstance(out, (tuple, list)) else [out])])
    return res


def same(a, b):
    return all(torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x, y.view(torch.uint8)
               if y.dtype.itemsize == 1 else y) for x, y in zip(a, b))


def check_graph(name, fn, eager):
    reps = graph_replay(fn)
    if reps is None:
        return "graph=skipped"
    eager = eager if isinstance(eager, (tuple, list)) else [eager]
    ok = same(reps[0], eager) and same(reps[1], eager)
    if not ok:
        record(name + " graph", False, "CUDA graph replay differs from eager")
    return "graph=ok" if ok else "graph=DIFF"
