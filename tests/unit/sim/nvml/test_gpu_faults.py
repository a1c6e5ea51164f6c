"""Injected hardware faults as the real pynvml wrappers read them, across a node's processes.

A node's agents are separate processes, each with its own simulated library over one state
file. Here each "process" is a library built on the same file; :func:`process` puts one under
pynvml, as that process's NVML.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpu_operator.agent.nvml import Nvml
from gpu_operator.sim.nvml import (
    SimulatedNvml,
    SimulationError,
    build_simulated_nvml,
    clear_faults,
    inject_fault,
    load_model,
    read_faults,
)
from gpu_operator.sim.nvml.health_calls import POWER_BRAKE_REASONS, THERMAL_REASONS
from tests.unit.conftest import Simulate

UNCORRECTED, CORRECTED = (
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
)
VOLATILE, AGGREGATE = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC


@pytest.fixture
def state(tmp_path: Path, simulate: Simulate) -> Path:
    """A node's state file; ``simulate`` uninstalls whatever library a test left under pynvml."""
    return tmp_path / "node.nvml.json"


def node_process(spec: str, state: Path) -> SimulatedNvml:
    """One more process of the node: its own library over the node's state file."""
    return build_simulated_nvml(spec, state_file=state, seed="node-1")


@contextmanager
def process(sim: SimulatedNvml) -> Iterator[None]:
    """Run the block as ``sim``'s process: pynvml calls reach ``sim``."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = sim
        pynvml._nvmlGetFunctionPointer_cache.clear()
    if sim.node.init_count == 0:
        pynvml.nvmlInit()
    yield


def watch(gpus: list[int]) -> Any:
    """A new XID event set of the current process, registered for ``gpus``."""
    events = pynvml.nvmlEventSetCreate()
    for index in gpus:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
    return events


def drain(events: Any) -> list[tuple[int, int]]:
    """Every (GPU, XID) the set has for its reader now; NVML's timeout ends it at once."""
    found = []
    while True:
        try:
            data = pynvml.nvmlEventSetWait(events, 0)
        except pynvml.NVMLError_Timeout:
            return found
        found.append((pynvml.nvmlDeviceGetIndex(data.device), data.eventData))


# -- XIDs ----------------------------------------------------------------------------------------
def test_every_process_and_every_set_receives_each_xid_once(state: Path) -> None:
    plugin, exporter = node_process("a100-40gb:2", state), node_process("a100-40gb:2", state)
    with process(plugin):
        plugin_set, plugin_other = watch([0, 1]), watch([1])
    with process(exporter):
        exporter_set = watch([1])
    inject_fault(state, 1, "xid", 79)  # from outside, by the file
    exporter.inject_xid(1, 48)  # in one process: through the same file
    with process(plugin):
        assert drain(plugin_set) == [(1, 79), (1, 48)]
        assert drain(plugin_other) == [(1, 79), (1, 48)]
        assert drain(plugin_set) == []
    with process(exporter):
        assert drain(exporter_set) == [(1, 79), (1, 48)]
        assert drain(exporter_set) == []


def test_a_set_or_process_that_comes_later_gets_only_later_xids(state: Path) -> None:
    early = node_process("h100-80gb:2", state)
    with process(early):
        early_set = watch([0])
    inject_fault(state, 0, "xid", 43)
    late = node_process("h100-80gb:2", state)  # a process started after XID 43
    with process(late):
        late_set = watch([0])
        assert drain(late_set) == []
    with process(early):
        assert drain(watch([0])) == []  # a set made after it, in a process that was there
    inject_fault(state, 0, "xid", 31)
    with process(late):
        assert drain(late_set) == [(0, 31)]
    with process(early):
        assert drain(early_set) == [(0, 43), (0, 31)]


def test_without_a_state_file_xids_reach_every_set_of_the_process(simulate: Simulate) -> None:
    sim = simulate("t4:2")
    pynvml.nvmlInit()
    try:
        one, other = watch([0, 1]), watch([1])
        assert drain(one) == []  # NVML_ERROR_TIMEOUT at once when nothing waits
        sim.inject_xid(1, 94)
        sim.inject_xid(0, 13)
        assert drain(one) == [(0, 13), (1, 94)]
        assert drain(other) == [(1, 94)]
    finally:
        pynvml.nvmlShutdown()


def test_clearing_xids_never_replays_old_ones(state: Path) -> None:
    sim = node_process("a100-40gb:1", state)
    with process(sim):
        events = watch([0])
        sim.inject_xid(0, 79)
        clear_faults(state, 0, "xid")  # not yet read: gone
        assert drain(events) == []
        sim.inject_xid(0, 48)
        clear_faults(state, 0)  # every fault; sequence numbers still go on
        sim.inject_xid(0, 63)
        assert drain(events) == [(0, 63)]
    assert read_faults(state, 0)[2].xid_seq == 3


# -- ECC and row remapping -----------------------------------------------------------------------
def ecc(handle: Any) -> tuple[int, int, int]:
    """(volatile uncorrected, aggregate uncorrected, volatile corrected)."""
    return (
        pynvml.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, VOLATILE),
        pynvml.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, AGGREGATE),
        pynvml.nvmlDeviceGetTotalEccErrors(handle, CORRECTED, VOLATILE),
    )


def test_ecc_errors_count_until_a_reset_and_stay_in_the_aggregate(state: Path) -> None:
    sim = node_process("a100-40gb:2", state)
    with process(sim):
        gpu0, gpu1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        assert pynvml.nvmlDeviceGetEccMode(gpu1) == [pynvml.NVML_FEATURE_ENABLED] * 2
        assert ecc(gpu1) == (0, 0, 0)
        inject_fault(state, 1, "ecc", 3)
        inject_fault(state, 1, "ecc")
        assert ecc(gpu1) == (4, 4, 0)
        assert ecc(gpu0) == (0, 0, 0)
        with Nvml() as nvml:
            nvml.reset_gpu(1)  # the session's reset: the simulated nvidia-smi --gpu-reset
        assert ecc(gpu1) == (0, 4, 0)


def test_a_model_without_ecc_does_not_support_it(simulate: Simulate) -> None:
    geforce = dataclasses.replace(load_model("l4"), key="l4", name="NVIDIA GeForce", ecc=False)
    sim = simulate([geforce])
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetEccMode(handle)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, VOLATILE)
        with pytest.raises(SimulationError, match="no ECC"):
            sim.inject_fault(0, "ecc")
    finally:
        pynvml.nvmlShutdown()


def test_every_profile_here_has_ecc() -> None:
    assert all(load_model(k).ecc for k in ("a100-40gb", "a100-80gb", "h100-80gb", "l4", "t4"))


def test_row_remapping_pending_until_a_reset_and_failure_until_cleared(state: Path) -> None:
    sim = node_process("a100-40gb:2", state)
    with process(sim):
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetRemappedRows(gpu) == (0, 0, 0, 0)
        inject_fault(state, 0, "remap-pending")
        assert pynvml.nvmlDeviceGetRemappedRows(gpu) == (0, 1, 1, 0)
        inject_fault(state, 0, "remap-failure")
        assert pynvml.nvmlDeviceGetRemappedRows(gpu) == (0, 2, 1, 1)
        assert pynvml.nvmlDeviceGetRemappedRows(pynvml.nvmlDeviceGetHandleByIndex(1)) == (0,) * 4
        sim.simulated_gpu_reset(0)
        assert pynvml.nvmlDeviceGetRemappedRows(gpu) == (0, 2, 0, 1)  # a new board, not a reset
        clear_faults(state, 0, "remap-failure")
        assert pynvml.nvmlDeviceGetRemappedRows(gpu) == (0, 2, 0, 0)


def test_remapping_faults_need_a_model_that_remaps(simulate: Simulate) -> None:
    sim = simulate("t4:1")
    with pytest.raises(SimulationError, match="no row remapping"):
        sim.inject_fault(0, "remap-pending")


# -- fallen off the bus --------------------------------------------------------------------------
def test_a_lost_gpu_fails_every_call_while_the_others_answer(state: Path) -> None:
    sim = node_process("h100-80gb:3", state)
    with process(sim):
        lost = pynvml.nvmlDeviceGetHandleByIndex(1)
        uuid = pynvml.nvmlDeviceGetUUID(lost)
        pynvml.nvmlDeviceSetMigMode(lost, pynvml.NVML_DEVICE_MIG_ENABLE)  # Hopper: at once
        profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(lost, 0)
        gi = pynvml.nvmlDeviceCreateGpuInstance(lost, profile.id)
        inject_fault(state, 1, "lost")
        for call in (
            lambda: pynvml.nvmlDeviceGetName(lost),
            lambda: pynvml.nvmlDeviceGetMemoryInfo(lost),
            lambda: pynvml.nvmlDeviceGetPowerUsage(lost),
            lambda: pynvml.nvmlGpuInstanceGetInfo(gi),
            lambda: pynvml.nvmlDeviceGetHandleByIndex(1),
            lambda: pynvml.nvmlDeviceGetHandleByUUID(uuid),
        ):
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                call()
        assert pynvml.nvmlDeviceGetCount() == 3  # NVML still counts it
        for index in (0, 2):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
        sim.reset_gpu(1)
        assert pynvml.nvmlDeviceGetName(lost) == "NVIDIA H100 80GB HBM3"


def test_a_process_sees_a_gpu_lost_in_another(state: Path) -> None:
    ours, theirs = node_process("a100-40gb:2", state), node_process("a100-40gb:2", state)
    with process(ours):
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    theirs.inject_fault(0, "lost")
    with process(ours), pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(handle)
    with process(theirs):
        theirs.clear_faults(0, "lost")
    with process(ours):
        assert pynvml.nvmlDeviceGetUUID(handle).startswith("GPU-")


# -- clock slowdowns -----------------------------------------------------------------------------
def test_thermal_and_power_brake_slowdowns_are_the_clock_event_reasons(state: Path) -> None:
    sim = node_process("h100-80gb:2", state)
    with process(sim):
        gpu, other = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))

        def reasons(handle: Any) -> tuple[int, int]:
            return (
                pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
            )

        assert reasons(gpu) == (pynvml.nvmlClocksEventReasonNone,) * 2
        inject_fault(state, 0, "thermal")
        now, old_name = reasons(gpu)
        assert now == old_name == THERMAL_REASONS
        assert now & pynvml.nvmlClocksEventReasonHwThermalSlowdown
        assert now & pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
        assert not now & pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
        inject_fault(state, 0, "power")
        assert reasons(gpu)[0] == THERMAL_REASONS | POWER_BRAKE_REASONS
        clear_faults(state, 0, "thermal")
        assert reasons(gpu)[0] & pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
        assert not reasons(gpu)[0] & pynvml.nvmlClocksEventReasonHwThermalSlowdown
        assert reasons(other) == (0, 0)
        sim.reset_gpu(0)
        assert reasons(gpu)[0] == POWER_BRAKE_REASONS  # the brake is outside the GPU


def test_a_reset_clears_lost_volatile_ecc_and_pending_remaps_only(state: Path) -> None:
    sim = node_process("a100-80gb:1", state)
    for kind, value in [
        ("xid", 79),
        ("lost", None),
        ("ecc", 2),
        ("remap-pending", None),
        ("remap-failure", None),
        ("thermal", None),
    ]:
        inject_fault(state, 0, kind, value)
    sim.simulated_gpu_reset(0)
    faults = read_faults(state, 0)[2]
    assert (faults.lost, faults.ecc_volatile, faults.remap_pending) == (False, 0, False)
    assert (faults.ecc_aggregate, faults.remap_failure, faults.thermal) == (2, True, True)
    assert faults.xids == ((1, 79),)
