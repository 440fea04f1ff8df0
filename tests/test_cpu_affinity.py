"""`EngineArgs.cpu_affinity` (runtime/cpu_affinity.py): CPU lists, the GPU-local CPUs read from
a (fake) sysfs, the pinning itself and its errors, and the engine applying it. Every test that
pins restores the affinity it found."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from kolibri_trt import LLM
from kolibri_trt.runtime import cpu_affinity
from kolibri_trt.runtime.engine_args import EngineArgs

from runtime_engines import small_target, write_engine


@pytest.fixture
def restore_affinity():
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


def test_cpu_lists_parse_and_bad_ones_raise():
    assert cpu_affinity.parse_cpulist("0-3,8") == {0, 1, 2, 3, 8}
    assert cpu_affinity.parse_cpulist(" 2\n") == {2}
    for bad in ("3-1", "a", "", "1,,2", "-1"):
        with pytest.raises(ValueError, match="^cpu_affinity"):
            cpu_affinity.parse_cpulist(bad)
    EngineArgs(cpu_affinity="0")
    EngineArgs(cpu_affinity="gpu-local")
    for bad in ("gpu", "0-", 3):
        with pytest.raises(ValueError, match="^cpu_affinity"):
            EngineArgs(cpu_affinity=bad)


def test_apply_pins_the_thread_to_a_cpu_list(restore_affinity):
    cpu = min(restore_affinity)
    assert cpu_affinity.apply(None, torch.device("cpu")) is None
    assert os.sched_getaffinity(0) == restore_affinity
    assert cpu_affinity.apply(str(cpu), torch.device("cpu")) == {cpu}
    assert os.sched_getaffinity(0) == {cpu}
    with pytest.raises(ValueError, match="not available"):
        cpu_affinity.apply("4000-4001", torch.device("cpu"))


def test_gpu_local_cpus_come_from_the_gpus_pci_address(tmp_path, monkeypatch, restore_affinity):
    """The GPU's local_cpulist under its PCI address (domain:bus:device.0), intersected with
    the CPUs this process may use; a CPU device, an unreadable file or no usable CPU raise."""
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1b, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    folder = tmp_path / "0000:1b:00.0"
    folder.mkdir()
    cpu = min(restore_affinity)
    (folder / "local_cpulist").write_text(f"{cpu},4000-4003\n")
    dev = torch.device("cuda", 0)
    assert cpu_affinity.gpu_local_cpus(dev, tmp_path) == {cpu, 4000, 4001, 4002, 4003}
    with pytest.raises(ValueError, match="needs a CUDA device"):
        cpu_affinity.gpu_local_cpus(torch.device("cpu"), tmp_path)
    with pytest.raises(RuntimeError, match="cannot read"):
        cpu_affinity.gpu_local_cpus(dev, tmp_path / "missing")
    monkeypatch.setattr(cpu_affinity, "SYSFS_PCI", tmp_path)
    monkeypatch.setattr(cpu_affinity, "gpu_local_cpus",
                        lambda device, sysfs=tmp_path: {cpu, 4000})
    assert cpu_affinity.apply("gpu-local", dev) == {cpu}
    assert os.sched_getaffinity(0) == {cpu}
    monkeypatch.setattr(cpu_affinity, "gpu_local_cpus", lambda device, sysfs=tmp_path: {4000})
    with pytest.raises(ValueError, match="not available"):
        cpu_affinity.apply("gpu-local", dev)


def test_the_engine_pins_itself(tmp_path, restore_affinity):
    engine = write_engine(tmp_path, small_target())
    cpu = min(restore_affinity)
    llm = LLM(engine, speculative="off", cpu_affinity=str(cpu))
    assert llm.engine.cpus == {cpu} and os.sched_getaffinity(0) == {cpu}
    os.sched_setaffinity(0, restore_affinity)
    assert LLM(engine, speculative="off").engine.cpus is None
    assert os.sched_getaffinity(0) == restore_affinity
