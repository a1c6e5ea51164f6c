"""MIG C functions through pynvml's own wrappers: handles, arrays, versions, refusals."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml
import pytest

from tests.unit.conftest import Simulate

GI_1G, GI_3G, GI_7G = 0, 2, 4  # A100 GPU-instance profile indexes
GI_ID_3G = 9  # A100 3g.20gb profile id
CI_1C, CI_2C, CI_3C, CI_4C = 0, 1, 2, 3


@pytest.fixture
def a100(simulate: Simulate) -> Iterator[object]:
    """An A100 with MIG on, and a T4 beside it."""
    simulate("a100-40gb:1,t4:1")
    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE)
    yield gpu
    pynvml.nvmlShutdown()


def test_profiles_by_index_in_both_versions(a100: object) -> None:
    v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, GI_3G, version=1)
    v2 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, GI_3G)
    assert (v1.id, v1.sliceCount, v1.memorySizeMB) == (GI_ID_3G, 3, 19968)
    assert (v2.id, v2.name) == (GI_ID_3G, "MIG 3g.20gb")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, 5)  # an index the A100 lacks
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, 99)
    t4 = pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(t4, GI_1G)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(t4)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(t4) == 0


def test_a_wrong_struct_version_is_a_version_mismatch(a100: object) -> None:
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 1
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    assert fn(a100, GI_3G, ctypes.byref(info)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_placements_count_first_then_fill(a100: object) -> None:
    count = ctypes.c_uint()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(a100, GI_ID_3G, None, ctypes.byref(count))
    assert count.value == 2
    too_small = (pynvml.c_nvmlGpuInstancePlacement_t * 1)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            a100, GI_ID_3G, too_small, ctypes.byref(count)
        )
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(a100, 77, None, ctypes.byref(count))


def test_instances_without_a_placement_and_their_lookups(a100: object) -> None:
    seven = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, GI_7G).id
    one = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(a100, GI_1G).id
    for while_pending in (
        pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity,
        pynvml.nvmlDeviceCreateGpuInstance,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            while_pending(a100, one)  # MIG waits for a reset on an A100
    pynvml.nvmlLib.simulated_gpu_reset(0)  # the hook Nvml.reset_gpu calls
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(a100, one) == 7
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(a100, seven) == 1
    gi = pynvml.nvmlDeviceCreateGpuInstance(a100, one)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(a100, one) == 6
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(a100, seven) == 0
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.placement.start, info.placement.size) == (7, 0, 1)
    same = pynvml.nvmlDeviceGetGpuInstanceById(a100, 7)
    assert pynvml.nvmlGpuInstanceGetInfo(same).id == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetGpuInstanceById(a100, 8)
    pynvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetInfo(gi)  # a stale handle


def test_compute_instances_and_the_mig_devices_they_make(a100: object) -> None:
    pynvml.nvmlLib.simulated_gpu_reset(0)
    gi = pynvml.nvmlDeviceCreateGpuInstance(a100, GI_ID_3G)
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, CI_1C) == 3
    v1 = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, CI_2C, 0, version=1)
    assert (v1.sliceCount, v1.instanceCount, v1.multiprocessorCount) == (2, 1, 28)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, CI_4C, 0)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI_2C)
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, CI_1C) == 1
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, CI_2C) == 0
    by_id = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    assert pynvml.nvmlComputeInstanceGetInfo(by_id).placement.size == 2
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 1)

    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 0)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig) and not pynvml.nvmlDeviceIsMigDeviceHandle(a100)
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 1  # a 3g at slice 0
    assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(a100)
    assert pynvml.nvmlDeviceGetAttributes(mig).multiprocessorCount == 28
    assert pynvml.nvmlDeviceGetAttributes(a100).multiprocessorCount == 108
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)  # metrics: full GPUs only
    for not_mig in (
        pynvml.nvmlDeviceGetGpuInstanceId,
        pynvml.nvmlDeviceGetComputeInstanceId,
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
    ):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            not_mig(a100)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 7)  # past the GPU's compute slices
    pynvml.nvmlComputeInstanceDestroy(ci)
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, CI_3C) == 1


def test_events_are_xid_critical_errors_only(simulate: Simulate) -> None:
    sim = simulate("t4:2")
    pynvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetSupportedEventTypes(gpu) == pynvml.nvmlEventTypeXidCriticalError
        events = pynvml.nvmlEventSetCreate()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceRegisterEvents(gpu, pynvml.nvmlEventTypeClock, events)
        pynvml.nvmlDeviceRegisterEvents(gpu, pynvml.nvmlEventTypeXidCriticalError, events)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait(events, 0)
        sim.inject_xid(1, 94)
        data = pynvml.nvmlEventSetWait(events, 0)
        assert (pynvml.nvmlDeviceGetIndex(data.device), data.eventData) == (1, 94)
        pynvml.nvmlEventSetFree(events)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlEventSetFree(events)
    finally:
        pynvml.nvmlShutdown()
