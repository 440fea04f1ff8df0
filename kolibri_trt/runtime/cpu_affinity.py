"""Pinning the engine's host thread to CPUs (`EngineArgs.cpu_affinity`).

A decode step of a small model is host-bound: Python, the step's metadata and the driver calls
that launch CUDA graphs. On the H200 machine one process's host speed drifted by up to 2x
within a call and between processes (bench/results/h200-2026-11-30e/, h200-2026-11-30f/zd/), as
it does when a thread migrates between cores or runs on a core far from the GPU. Serving stacks
bind their workers to the CPUs next to their GPU for that reason (SGLang's NUMA binding,
`numactl` in TensorRT-LLM's performance guide). Specs:
- None: leave the affinity as it is (default);
- "gpu-local": the CPUs Linux lists as local to the engine's GPU
  (/sys/bus/pci/devices/<PCI address>/local_cpulist);
- a Linux CPU list, e.g. "2" or "0-3,8".
The calling thread is pinned (`os.sched_setaffinity(0, ...)`); threads it starts later inherit it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

GPU_LOCAL = "gpu-local"
SYSFS_PCI = Path("/sys/bus/pci/devices")


def parse_cpulist(text: str) -> set[int]:
    """A Linux CPU list ("0-3,8") -> {0, 1, 2, 3, 8}. Raises ValueError naming the text for a
    malformed list, a descending range or an empty set."""
    cpus: set[int] = set()
    try:
        for part in text.strip().split(","):
            lo, dash, hi = part.strip().partition("-")
            a, b = int(lo), int(hi if dash else lo)
            if a < 0 or b < a:
                raise ValueError
            cpus.update(range(a, b + 1))
    except ValueError:
        raise ValueError(f"cpu_affinity: {text!r} is not a CPU list such as '0-3,8'") from None
    return cpus


def check_spec(spec: str | None) -> None:
    """ValueError unless spec is None, "gpu-local" or a CPU list (`parse_cpulist`)."""
    if spec is not None and spec != GPU_LOCAL:
        if not isinstance(spec, str):
            raise ValueError(f"cpu_affinity: must be None, {GPU_LOCAL!r} or a CPU list, got "
                             f"{spec!r}")
        parse_cpulist(spec)


def gpu_local_cpus(device: torch.device, sysfs: Path = SYSFS_PCI) -> set[int]:
    """The CPUs local to CUDA `device`, from its PCI address's local_cpulist. Raises
    ValueError for a non-CUDA device, RuntimeError when torch gives no PCI address or the
    file cannot be read."""
    if device.type != "cuda":
        raise ValueError(f"cpu_affinity={GPU_LOCAL!r}: needs a CUDA device, got {device}")
    props = torch.cuda.get_device_properties(device)
    try:
        addr = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:
        raise RuntimeError(f"cpu_affinity={GPU_LOCAL!r}: torch {torch.__version__} gives no PCI "
                           "address for the GPU; pass a CPU list instead") from None
    path = sysfs / addr / "local_cpulist"
    try:
        return parse_cpulist(path.read_text())
    except OSError as e:
        raise RuntimeError(f"cpu_affinity={GPU_LOCAL!r}: cannot read {path} ({e}); pass a CPU "
                           "list instead") from None


def apply(spec: str | None, device: torch.device) -> set[int] | None:
    """Pin the calling thread per `spec` (module docstring); returns the CPUs it may run on
    now, or None for spec None (nothing changed). "gpu-local" takes those of the GPU's CPUs
    this process may use. Raises ValueError for a bad spec, a listed CPU this process may not
    use, or no usable GPU-local CPU; RuntimeError from `gpu_local_cpus`."""
    if spec is None:
        return None
    check_spec(spec)
    allowed = os.sched_getaffinity(0)
    if spec == GPU_LOCAL:
        local = gpu_local_cpus(device)
        cpus = local & allowed
        if not cpus:
            raise ValueError(f"cpu_affinity={GPU_LOCAL!r}: the GPU's CPUs {sorted(local)} are "
                             f"not available to this process (it may use {sorted(allowed)})")
    else:
        cpus = parse_cpulist(spec)
        if cpus - allowed:
            raise ValueError(f"cpu_affinity: CPUs {sorted(cpus - allowed)} of {spec!r} are not "
                             f"available to this process (it may use {sorted(allowed)})")
    os.sched_setaffinity(0, cpus)
    return cpus
