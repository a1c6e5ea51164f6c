"""The NVML adapter against the simulated library, through the real pynvml wrappers."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gpu_operator.agent.inventory import Placement
from gpu_operator.agent.nvml import (
    InsufficientResources,
    InUse,
    InvalidArgument,
    NoPermission,
    NotSupported,
    Nvml,
    NvmlError,
    NvmlUnavailable,
)
from gpu_operator.sim.nvml import SimulationError, parse_spec, uninstall_simulated_nvml

from .conftest import Simulate


def test_inventory_of_a_dgx_a100(simulate: Simulate) -> None:
    simulate("a100-40gb:8")
    with Nvml() as nvml:
        inv = nvml.inventory()
    assert inv.driver_version == "580.95.05"
    assert inv.cuda_driver_version == 13000
    assert (inv.cuda_major, inv.cuda_minor) == (13, 0)
    assert len(inv.gpus) == 8
    gpu = inv.gpus[0]
    assert gpu.name == "NVIDIA A100-SXM4-40GB"
    assert gpu.pci_device_id == 0x20B010DE
    assert gpu.device_filter_id == "0x20B010DE"
    assert gpu.memory_mib == 40960
    assert (gpu.compute_major, gpu.compute_minor) == (8, 0)
    assert gpu.architecture == "ampere"
    assert gpu.pci_bus_id == "00000000:07:00.0"
    assert gpu.uuid.startswith("GPU-")
    assert len({g.uuid for g in inv.gpus}) == 8
    assert gpu.mig_capable and not gpu.mig_current and not gpu.mig_pending
    assert [g.minor_number for g in inv.gpus] == list(range(8))


def test_mig_profiles_follow_the_a100_table(simulate: Simulate) -> None:
    simulate("a100-40gb:1")
    with Nvml() as nvml:
        profiles = {p.name: p for p in nvml.inventory().gpus[0].mig_profiles}
    expected = {  # name: (index, id, memory MiB, max, SMs, placement starts, size)
        "1g.5gb": (0, 19, 4864, 7, 14, (0, 1, 2, 3, 4, 5, 6), 1),
        "1g.5gb+me": (7, 20, 4864, 1, 14, (0, 1, 2, 3, 4, 5, 6), 1),
        "1g.10gb": (9, 15, 9856, 4, 14, (0, 2, 4, 6), 2),
        "2g.10gb": (1, 14, 9856, 3, 28, (0, 2, 4), 2),
        "3g.20gb": (2, 9, 19968, 2, 42, (0, 4), 4),
        "4g.20gb": (3, 5, 19968, 1, 56, (0,), 4),
        "7g.40gb": (4, 0, 40192, 1, 98, (0,), 8),
    }
    assert set(profiles) == set(expected)
    for name, (index, pid, mem, top, sms, starts, size) in expected.items():
        p = profiles[name]
        assert (p.index, p.id, p.memory_mib, p.max_count, p.sm_count) == (index, pid, mem, top, sms)
        assert p.placements == tuple(Placement(s, size) for s in starts)


def test_h100_and_non_mig_gpus(simulate: Simulate) -> None:
    simulate("h100-80gb:1,t4:1,l4:1")
    with Nvml() as nvml:
        h100, t4, l4 = nvml.inventory().gpus
    assert (h100.name, h100.pci_device_id, h100.compute_major) == (
        "NVIDIA H100 80GB HBM3",
        0x233010DE,
        9,
    )
    assert {p.name: p.sm_count for p in h100.mig_profiles} == {
        "1g.10gb": 16,
        "1g.10gb+me": 16,
        "1g.20gb": 26,
        "2g.20gb": 32,
        "3g.40gb": 60,
        "4g.40gb": 64,
        "7g.80gb": 132,
    }
    assert (t4.name, t4.memory_mib, t4.compute_major, t4.compute_minor) == ("Tesla T4", 15360, 7, 5)
    assert not t4.mig_capable and t4.mig_profiles == ()
    assert (l4.name, l4.memory_mib, l4.architecture) == ("NVIDIA L4", 23034, "ada")
    assert (l4.compute_major, l4.compute_minor) == (8, 9)


def test_mig_mode_on_a100_stays_pending_until_reset(simulate: Simulate) -> None:
    sim = simulate("a100-40gb:1")
    with Nvml() as nvml:
        assert nvml.set_mig_mode(0, True) == (False, True)
        gpu = nvml.gpu(0)
        assert (gpu.mig_current, gpu.mig_pending) == (False, True)
        nvml.reset_gpu(0)
        gpu = nvml.gpu(0)
        assert (gpu.mig_current, gpu.mig_pending) == (True, True)
    assert sim.gpus[0].mig_current


def test_mig_mode_on_h100_applies_at_once(simulate: Simulate) -> None:
    simulate("h100-80gb:1")
    with Nvml() as nvml:
        assert nvml.set_mig_mode(0, True) == (True, True)


def test_gpu_instances_obey_placement_rules(simulate: Simulate) -> None:
    simulate("h100-80gb:1")
    with Nvml() as nvml:
        nvml.set_mig_mode(0, True)
        gi = nvml.create_gpu_instance(0, 2, Placement(4, 4))  # 3g.40gb on slices 4-7
        nvml.create_compute_instance(0, gi, 3)
        with pytest.raises(InsufficientResources, match="CreateGpuInstanceWithPlacement"):
            nvml.create_gpu_instance(0, 4, Placement(0, 8))  # 7g overlaps the 3g
        with pytest.raises(InsufficientResources):
            nvml.create_gpu_instance(0, 0, Placement(5, 1))  # 1g inside the 3g
        with pytest.raises(InvalidArgument):
            nvml.create_gpu_instance(0, 2, Placement(2, 4))  # not a 3g placement
        for start in (0, 1, 2, 3):
            gi1 = nvml.create_gpu_instance(0, 0, Placement(start, 1))
            nvml.create_compute_instance(0, gi1, 1)
        gpu = nvml.gpu(0)
        assert sorted(gi.profile for gi in gpu.gpu_instances) == ["1g.10gb"] * 4 + ["3g.40gb"]
        assert len(gpu.mig_devices) == 5
        three = next(d for d in gpu.mig_devices if d.profile == "3g.40gb")
        assert (three.sm_count, three.slices_gi, three.slices_ci, three.memory_mib) == (
            60,
            3,
            3,
            40448,
        )
        assert three.placement == Placement(4, 4)
        assert three.uuid.startswith("MIG-")
        with pytest.raises(InUse):
            nvml.set_mig_mode(0, False)  # instances still there
        assert nvml.destroy_mig_instances(0) == 5
        assert nvml.gpu(0).gpu_instances == ()


def test_max_count_is_enforced(simulate: Simulate) -> None:
    simulate("a100-40gb:1")
    with Nvml() as nvml:
        nvml.set_mig_mode(0, True)
        nvml.reset_gpu(0)
        nvml.create_gpu_instance(0, 7, Placement(0, 1))  # 1g.5gb+me, at most one
        with pytest.raises(InsufficientResources):
            nvml.create_gpu_instance(0, 7, Placement(1, 1))


def test_errors_are_typed(simulate: Simulate) -> None:
    sim = simulate("a100-40gb:1")
    sim.fail("nvmlInitWithFlags", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, times=1)
    with pytest.raises(NvmlUnavailable, match="nvmlInit"):
        Nvml().open()
    with Nvml() as nvml:
        sim.fail("nvmlDeviceSetMigMode", pynvml.NVML_ERROR_NO_PERMISSION, times=1)
        with pytest.raises(NoPermission) as caught:
            nvml.set_mig_mode(0, True)
        assert caught.value.code == pynvml.NVML_ERROR_NO_PERMISSION
        assert caught.value.function == "nvmlDeviceSetMigMode"
        sim.fail("nvmlDeviceGetCudaComputeCapability", pynvml.NVML_ERROR_NOT_SUPPORTED)
        with pytest.raises(NotSupported):
            nvml.inventory()
        sim.clear_failures()
        sim.fail("nvmlDeviceGetName", pynvml.NVML_ERROR_UNKNOWN)
        with pytest.raises(NvmlError) as unknown:
            nvml.inventory()
        assert type(unknown.value) is NvmlError and unknown.value.code == pynvml.NVML_ERROR_UNKNOWN


def test_no_driver_is_nvml_unavailable(simulate: Simulate) -> None:
    uninstall_simulated_nvml()
    with pytest.raises(NvmlUnavailable, match="libnvidia-ml"):
        Nvml().open()


def test_calls_before_open_are_refused(simulate: Simulate) -> None:
    simulate("t4:1")
    with pytest.raises(NvmlUnavailable):
        Nvml().inventory()


def test_unsupported_metrics_read_as_none(simulate: Simulate) -> None:
    sim = simulate("a100-40gb:1,t4:1")
    with Nvml() as nvml:
        inv = nvml.inventory()
        sim.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED)
        a100, t4 = nvml.metrics(inv)[0]
    assert a100.power_w is None and t4.power_w is None
    assert a100.memory_temp_c is not None and t4.memory_temp_c is None  # HBM vs GDDR6
    assert a100.remapped_rows_correctable == 0 and t4.remapped_rows_correctable is None
    assert a100.fb_reserved_mib == 589


def test_metrics_vary_and_energy_only_grows(simulate: Simulate) -> None:
    now = [1000.0]
    simulate("h100-80gb:2", clock=lambda: now[0])
    with Nvml() as nvml:
        inv = nvml.inventory()
        readings = []
        for _ in range(6):
            readings.append(nvml.metrics(inv)[0][0])
            now[0] += 17.0
    utils = {r.gpu_util_pct for r in readings}
    energies = [r.energy_mj for r in readings]
    assert len(utils) > 1
    assert all(b is not None and a is not None and b > a for a, b in itertools.pairwise(energies))
    for r in readings:
        assert r.power_w is not None and 72 <= r.power_w <= 700
        assert r.gpu_temp_c is not None and 20 < r.gpu_temp_c < 90
        assert r.sm_clock_mhz is not None and 345 <= r.sm_clock_mhz <= 1980
        assert r.fb_used_mib is not None and r.fb_free_mib is not None
        assert r.fb_used_mib + r.fb_free_mib + 535 == pytest.approx(81559, abs=1)


def test_last_xid_comes_from_events(simulate: Simulate) -> None:
    sim = simulate("a100-40gb:2")
    with Nvml() as nvml:
        inv = nvml.inventory()
        assert [m.last_xid for m in nvml.metrics(inv)[0]] == [0, 0]
        sim.inject_xid(1, 79)
        sim.inject_xid(1, 48)
        assert [m.last_xid for m in nvml.metrics(inv)[0]] == [0, 48]
        assert [m.last_xid for m in nvml.metrics(inv)[0]] == [0, 48]  # stays the last seen


def test_spec_parsing() -> None:
    assert [m.key for m in parse_spec("a100-40gb:2,t4:1")] == ["a100-40gb", "a100-40gb", "t4"]
    assert [m.key for m in parse_spec(["h100-80gb:1", "l4"])] == ["h100-80gb", "l4"]
    with pytest.raises(SimulationError, match="unknown simulated GPU profile 'v100'"):
        parse_spec("v100:1")
    with pytest.raises(SimulationError, match="bad GPU count"):
        parse_spec("t4:x")


def test_state_file_is_shared_between_processes(simulate: Simulate, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    simulate("h100-80gb:2", state_file=state)
    with Nvml() as nvml:
        nvml.set_mig_mode(1, True)
        gi = nvml.create_gpu_instance(1, 4, Placement(0, 8))
        nvml.create_compute_instance(1, gi, 7)
    code = (
        "from gpu_operator.sim.nvml import install_simulated_nvml\n"
        "from gpu_operator.agent.nvml import Nvml\n"
        f"install_simulated_nvml('h100-80gb:2', state_file={str(state)!r}, seed='test-node')\n"
        "with Nvml() as n:\n"
        "    g = n.gpu(1)\n"
        "    print(g.mig_current, [d.profile for d in g.mig_devices])\n"
        "    n.destroy_mig_instances(1)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True ['7g.80gb']"
    with Nvml() as nvml:  # the other process's destroy is visible here
        assert nvml.gpu(1).gpu_instances == ()
