"""Shared helpers of the kolibri_trt_plugins kernels: Triton discovery, launching, argument checks.

Nothing here imports kolibri_trt; plugins depend on torch and (optionally, on CPU) triton only.

Launch policy (the contract every op in this package follows):
- CUDA tensors run the Triton kernel. If Triton cannot be imported, the op raises RuntimeError:
  nothing silently falls back to the torch reference on the GPU.
- CPU tensors run the plain-torch ``*_ref`` function (the reference path). Tests may instead run the
  Triton kernel on CPU tensors through Triton's interpreter with ``launch(..., interpret=True)``.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import torch

try:  # Triton is optional on CPU-only machines (the reference path needs only torch).
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_TRITON = True
except Exception:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    HAVE_TRITON = False



def ptx_constant(text: str):
    """Inline PTX text as a global a Triton kernel may read (tl.constexpr); the plain string
    where Triton is absent (the torch reference path never reads it)."""
    return tl.constexpr(text) if HAVE_TRITON else text


PDL_MODES = ("0", "1", "2", "3", "4")
PDL = os.environ.get("KOLIBRI_PDL", "4")
if PDL not in PDL_MODES:
    raise ValueError(f"KOLIBRI_PDL: must be one of {list(PDL_MODES)}, got {PDL!r}")
PDL = int(PDL)
"""Programmatic dependent launch (environment KOLIBRI_PDL) on GPUs of compute capability 9 and up: 0
off, 1 each kernel lets the next one launch at its first instruction, 2 after its main loop
(`pdl_release`, before the epilogue's stores), 3 once it has waited for the kernel before it (at
its start: at most one kernel waits while another runs), 4 (the default) as 2 but the kernels
launched with ``pdl_early=True`` as 3 (`early_launch`: by default the MoE's, in chunks of at most
PDL_EARLY_TOKENS tokens). A kernel with a ``PDL: tl.constexpr`` parameter starts with
:func:`pdl_enter` (only an L2 prefetch of static bytes from its arguments may come before it:
plugins/_prefetch.py, the MoE's combine), and :func:`launch` gives it ``PDL`` = the kernel's mode
and Triton's ``launch_pdl``: the GPU may start it while the kernel before it in the stream (or CUDA
graph) is still running, and it waits (``griddepcontrol.wait``) for that kernel's completion and
memory before it touches memory. Kernels without the parameter, and every torch op, launch as
before. Measured on the H200: a chain of small GEMVs in a CUDA graph 1.68 -> 1.30 µs per kernel
(bench/results/h200-2026-11-30l/ld/, bench/pdl_probe.py). Whole full-size decode steps at 1k
context, 1 / 4 / 16 / 64 streams: mode 2 against off 3.87 -> 3.44, 5.27 -> 5.06, 10.15 -> 9.96,
26.2 -> 26.3 ms (bench/results/h200-2026-11-30m/lf/); mode 1 slower (1 stream at 32k 3.93 -> 5.98
ms, `le/`); mode 3 against 2 2.608 -> 2.638, 4.111 -> 4.017, 8.834 -> 8.949, 20.661 -> 20.866 ms
(bench/results/h200-2026-12-01d/ny/); the MoE's kernels alone as 3, against 2 (`nz/`): 2.593 ->
2.563, 4.101 -> 3.993, 8.781 -> 8.682, 19.526 -> 20.035 ms, at 32k 2.818 -> 2.710, 4.216 -> 4.104,
9.567 -> 9.466, 22.842 -> 23.319 ms: early up to 16 tokens. Every gpu_check, gpu_runtime and
gpu_drafter check passed under modes 1, 2 and 4."""

PDL_GROUPS = ("moe", "gemv", "attn", "norm")
PDL_EARLY_GROUPS = tuple(g for g in os.environ.get("KOLIBRI_PDL_EARLY", "moe").split(",") if g)
if set(PDL_EARLY_GROUPS) - set(PDL_GROUPS):
    raise ValueError(f"KOLIBRI_PDL_EARLY: comma list of {list(PDL_GROUPS)}, got "
                     f"{os.environ.get('KOLIBRI_PDL_EARLY')!r}")
PDL_EARLY_TOKENS = os.environ.get("KOLIBRI_PDL_EARLY_TOKENS", "16")
if not PDL_EARLY_TOKENS.isdigit():
    raise ValueError(f"KOLIBRI_PDL_EARLY_TOKENS: a token count (digits), got {PDL_EARLY_TOKENS!r}")
PDL_EARLY_TOKENS = int(PDL_EARLY_TOKENS)
"""Mode 4: the kernel groups (environment KOLIBRI_PDL_EARLY, default the MoE's: router, top-k,
experts, combines) that launch the next kernel early (as mode 3) for launches of at most
PDL_EARLY_TOKENS tokens (KOLIBRI_PDL_EARLY_TOKENS; the MoE measured at 1, 4, 16 tokens faster,
64 slower). The other groups: "gemv" (fp8_gemv, nvfp4_gemv), "attn" (paged attention and its
merge), "norm" (add_rms_norm, the QK-norm kernels, fp8_kv_write); the drafter's and the
samplers' kernels always launch as mode 2."""


def early_launch(group: str, tokens: int) -> bool:
    """`launch`'s ``pdl_early`` for a kernel of ``group`` (one of PDL_GROUPS) over ``tokens``
    rows: in PDL_EARLY_GROUPS and at most PDL_EARLY_TOKENS. Raises ValueError on an unknown
    group."""
    if group not in PDL_GROUPS:
        raise ValueError(f"early_launch: group {group!r} is not one of {list(PDL_GROUPS)}")
    return group in PDL_EARLY_GROUPS and tokens <= PDL_EARLY_TOKENS


_SM90_DEVICES: dict[int, bool] = {}

NAMESPACE = "kolibri_plugins"
"""torch.library namespace of every op in this package: ``torch.ops.kolibri_plugins.<name>``."""

_INTERPRETED: dict = {}


def jit(fn):
    """``triton.jit`` when Triton is importable, else the plain function (never launched)."""
    if HAVE_TRITON:
        return triton.jit(fn)
    return fn


@jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel's first statement (its launch mode, module's PDL): mode 1 lets the next kernel
    launch; modes 1-3 wait for the previous kernel to finish and its writes to be visible;
    mode 3 then lets the next kernel launch. Nothing in mode 0, in the interpreter or on GPUs
    before compute capability 9."""
    if PDL == 1:
        gdc_launch_dependents()
    if PDL != 0:
        gdc_wait()
    if PDL == 3:
        gdc_launch_dependents()


@jit
def pdl_release(PDL: tl.constexpr):
    """Mode 2: let the next kernel launch (placed after a kernel's main loop). Any placement
    is safe: the next kernel waits in `pdl_enter` for this one's completion."""
    if PDL == 2:
        gdc_launch_dependents()


def kernel_pdl(early: bool) -> int:
    """A kernel's launch mode (its PDL constexpr) under the module's PDL: mode 4 gives the
    kernels launched with ``pdl_early`` true mode 3 and the others mode 2."""
    if PDL == 4:
        return 3 if early else 2
    return PDL


def _pdl_here() -> bool:
    """PDL on (modes 1-4) and the current CUDA device of compute capability >= 9 (cached per
    device)."""
    if not PDL:
        return False
    return sm90_or_later(torch.cuda.current_device())


def sm90_or_later(dev: int | torch.device) -> bool:
    """CUDA device `dev` (an index or a torch.device; no index: the current one) has compute
    capability >= 9: PDL and the bulk L2 prefetch (plugins/_prefetch.py). Cached per device."""
    if isinstance(dev, torch.device):
        dev = torch.cuda.current_device() if dev.index is None else dev.index
    if dev not in _SM90_DEVICES:
        _SM90_DEVICES[dev] = torch.cuda.get_device_capability(dev)[0] >= 9
    return _SM90_DEVICES[dev]


def require_triton(what: str) -> None:
    """Raise RuntimeError if Triton is missing: CUDA tensors never fall back to the reference."""
    if not HAVE_TRITON:
        raise RuntimeError(f"{what}: CUDA tensors need Triton, which could not be imported")


def interpreter_ready() -> bool:
    """True when TRITON_INTERPRET=1 was set before triton was first imported (Triton decides at
    import time whether tl.sum & co. are interpreted). :func:`launch` works either way."""
    if not HAVE_TRITON:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.sum, InterpretedFunction)


def _interpret_patch(kernel_fn):
    """Interpreter support after a plain ``import triton`` (TRITON_INTERPRET unset at import):
    swap every @triton.jit helper that an interpreted kernel may call (Triton's standard library,
    the kernel module's own helpers and, module by module, the helpers those call) for an
    InterpretedFunction; returns an undo list."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    import triton.language.math as tl_math
    import triton.language.standard as tl_std

    try:  # imported lazily by the interpreter; it must see the original JIT functions
        import triton.experimental.gluon  # noqa: F401
    except Exception:  # pragma: no cover
        pass
    undo = []
    spaces = [vars(tl), vars(tl_std), vars(tl_math), kernel_fn.__globals__]
    seen = {id(sp) for sp in spaces}
    for space in spaces:          # grows: the modules of the helpers found (helpers' helpers)
        for name, obj in list(space.items()):
            if isinstance(obj, JITFunction):
                undo.append((space, name, obj))
                space[name] = InterpretedFunction(obj.fn)
                if id(obj.fn.__globals__) not in seen:
                    seen.add(id(obj.fn.__globals__))
                    spaces.append(obj.fn.__globals__)
    return undo


def launch(kernel, grid: Sequence[int], *args, interpret: bool = False, **kwargs) -> None:
    """Launch ``kernel[grid](*args, **kwargs)``; with ``interpret=True`` run it in Triton's
    interpreter on CPU tensors (tests only; works whether or not TRITON_INTERPRET was set).
    A kernel with a ``PDL`` parameter launches with programmatic dependent launch where the
    GPU has it (mode :func:`kernel_pdl` of ``pdl_early``); in the interpreter it keeps its
    default (0)."""
    require_triton(getattr(kernel, "__name__", "kernel"))
    early = kwargs.pop("pdl_early", False)
    if not interpret:
        if "PDL" in getattr(kernel, "arg_names", ()) and _pdl_here():
            kwargs = dict(kwargs, PDL=kernel_pdl(early), launch_pdl=True)
        kernel[tuple(grid)](*args, **kwargs)
        return
    from triton.runtime.interpreter import InterpretedFunction

    kwargs = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages", "maxnreg")}
    if isinstance(kernel, InterpretedFunction):  # TRITON_INTERPRET=1 was set before import
        kernel[tuple(grid)](*args, **kwargs)
        return
    undo = [] if interpreter_ready() else _interpret_patch(kernel.fn)
    try:
        InterpretedFunction(kernel.fn)[tuple(grid)](*args, **kwargs)
    finally:
        for space, name, obj in reversed(undo):
            space[name] = obj


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_tensor(
    name: str,
    t,
    dtype: torch.dtype | Iterable[torch.dtype] | None = None,
    shape: Sequence | None = None,
    device: torch.device | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """Validate one tensor argument; raise ValueError naming ``name`` on any mismatch.

    ``shape`` entries may be ints (must match) or None (any size). ``contiguous`` demands
    row-major strides (the kernels index with the layout's natural strides).
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            raise ValueError(f"{name}: dtype {t.dtype}, expected one of {allowed}")
    if shape is not None:
        if t.dim() != len(shape):
            raise ValueError(f"{name}: {t.dim()} dims {tuple(t.shape)}, expected {len(shape)} dims")
        for i, (got, want) in enumerate(zip(t.shape, shape)):
            if want is not None and got != want:
                raise ValueError(f"{name}: shape {tuple(t.shape)}, dim {i} should be {want}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, expected {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: strides {t.stride()} are not contiguous (row-major) for shape "
                         f"{tuple(t.shape)}")
    return t


def check_scalar_tensor(name: str, t, device: torch.device) -> torch.Tensor:
    """A per-layer fp32 scale passed as a one-element tensor (0-dim or [1]) on ``device``."""
    check_tensor(name, t, torch.float32, device=device, contiguous=True)
    if t.numel() != 1:
        raise ValueError(f"{name}: expected one element (0-dim or [1]), got shape {tuple(t.shape)}")
    return t


def kernel_path(t: torch.Tensor, what: str) -> str:
    """'triton' for CUDA tensors (Triton required), 'ref' for CPU tensors, else ValueError."""
    if t.device.type == "cuda":
        require_triton(what)
        return "triton"
    if t.device.type == "cpu":
        return "ref"
    raise ValueError(f"{what}: unsupported device {t.device}")
