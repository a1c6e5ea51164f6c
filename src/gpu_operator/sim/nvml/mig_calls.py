"""C entry points for MIG: mode, GPU instances, compute instances and the MIG devices they make.

Arguments are checked and results written here; what is allowed is decided by :mod:`.mig`.
"""

from __future__ import annotations

from typing import Any

import pynvml

from . import mig
from .cabi import EntryPoints, Kind, as_int, dest, pack_handle, store_handle
from .devices import CI_SLICES, NvmlFault, SimCi, SimGi, SimGpu
from .node import SimNode
from .profiles import GiProfileSpec

ENTRY_POINTS = EntryPoints()


# -- MIG mode ------------------------------------------------------------------------------------
@ENTRY_POINTS.add
def nvmlDeviceGetMigMode(node: SimNode, handle: Any, current: Any, pending: Any) -> None:
    gpu = node.gpu(handle)
    mig.require_mig_capable(gpu)
    dest(current).value = int(gpu.mig_current)
    dest(pending).value = int(gpu.mig_pending)


@ENTRY_POINTS.add
def nvmlDeviceSetMigMode(node: SimNode, handle: Any, mode: Any, status: Any) -> None:
    gpu = node.gpu(handle)
    mig.require_mig_capable(gpu)
    with node.mutate():
        reset_needed = mig.set_mig_mode(gpu, as_int(mode) == pynvml.NVML_DEVICE_MIG_ENABLE)
    dest(status).value = pynvml.NVML_ERROR_RESET_REQUIRED if reset_needed else pynvml.NVML_SUCCESS


@ENTRY_POINTS.add
def nvmlDeviceIsMigDeviceHandle(node: SimNode, handle: Any, out: Any) -> None:
    _, gi, _ = node.device(handle)
    dest(out).value = int(gi is not None)


# -- GPU instance profiles -----------------------------------------------------------------------
def _profile_by_index(node: SimNode, handle: Any, index: int) -> GiProfileSpec:
    gpu = node.gpu(handle)
    mig.require_mig_capable(gpu)
    if not 0 <= index < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    profile = gpu.model.gi_profile(index=index)
    if profile is None:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return profile


def _profile_by_id(node: SimNode, handle: Any, profile_id: Any) -> tuple[SimGpu, GiProfileSpec]:
    gpu = node.gpu(handle)
    mig.require_mig_capable(gpu)
    profile = gpu.model.gi_profile(id=as_int(profile_id))
    if profile is None:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return gpu, profile


def _fill_gi_profile(info: Any, profile: GiProfileSpec, named: bool) -> None:
    info.id = profile.id
    info.isP2pSupported = 0
    info.sliceCount = profile.slices
    info.instanceCount = profile.max
    info.multiprocessorCount = profile.sms
    info.copyEngineCount = profile.engines["copy"]
    info.decoderCount = profile.engines["decoder"]
    info.encoderCount = profile.engines["encoder"]
    info.jpegCount = profile.engines["jpeg"]
    info.ofaCount = profile.engines["ofa"]
    info.memorySizeMB = profile.memory_mib
    if named:
        info.name = f"MIG {profile.name}".encode()


@ENTRY_POINTS.add
def nvmlDeviceGetGpuInstanceProfileInfo(node: SimNode, handle: Any, index: Any, out: Any) -> None:
    _fill_gi_profile(dest(out), _profile_by_index(node, handle, as_int(index)), named=False)


@ENTRY_POINTS.add
def nvmlDeviceGetGpuInstanceProfileInfoV(node: SimNode, handle: Any, index: Any, out: Any) -> None:
    info = dest(out)
    if info.version != pynvml.nvmlGpuInstanceProfileInfo_v2:
        raise NvmlFault(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    _fill_gi_profile(info, _profile_by_index(node, handle, as_int(index)), named=True)


@ENTRY_POINTS.add
def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    node: SimNode, handle: Any, profile_id: Any, placements: Any, count: Any
) -> None:
    """With no array, only the count: how a caller learns how big an array to pass."""
    _, profile = _profile_by_id(node, handle, profile_id)
    out_count = dest(count)
    if placements is None:
        out_count.value = len(profile.starts)
        return
    array = dest(placements)
    if len(array) < len(profile.starts):
        raise NvmlFault(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, start in enumerate(profile.starts):
        array[i].start = start
        array[i].size = profile.size
    out_count.value = len(profile.starts)


@ENTRY_POINTS.add
def nvmlDeviceGetGpuInstanceRemainingCapacity(
    node: SimNode, handle: Any, profile_id: Any, count: Any
) -> None:
    gpu, profile = _profile_by_id(node, handle, profile_id)
    if not gpu.mig_current:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    dest(count).value = mig.remaining_gpu_instances(gpu, profile)


# -- GPU instances -------------------------------------------------------------------------------
def _create_gpu_instance(
    node: SimNode, handle: Any, profile_id: Any, start: int | None, out: Any
) -> None:
    gpu, profile = _profile_by_id(node, handle, profile_id)
    with node.mutate():
        gi = mig.create_gpu_instance(gpu, profile, start)
    store_handle(dest(out), pack_handle(Kind.GPU_INSTANCE, gpu.index, gi.id))


@ENTRY_POINTS.add
def nvmlDeviceCreateGpuInstance(node: SimNode, handle: Any, profile_id: Any, out: Any) -> None:
    _create_gpu_instance(node, handle, profile_id, None, out)


@ENTRY_POINTS.add
def nvmlDeviceCreateGpuInstanceWithPlacement(
    node: SimNode, handle: Any, profile_id: Any, placement: Any, out: Any
) -> None:
    where = dest(placement)
    _, profile = _profile_by_id(node, handle, profile_id)
    if where.size != profile.size:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    _create_gpu_instance(node, handle, profile_id, int(where.start), out)


@ENTRY_POINTS.add
def nvmlDeviceGetGpuInstances(
    node: SimNode, handle: Any, profile_id: Any, array: Any, count: Any
) -> None:
    gpu, profile = _profile_by_id(node, handle, profile_id)
    if not gpu.mig_current:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    found = [gi for gi in sorted(gpu.gis, key=lambda g: g.id) if gi.profile_index == profile.index]
    _store_handles(array, count, [pack_handle(Kind.GPU_INSTANCE, gpu.index, gi.id) for gi in found])


@ENTRY_POINTS.add
def nvmlDeviceGetGpuInstanceById(node: SimNode, handle: Any, gi_id: Any, out: Any) -> None:
    gpu = node.gpu(handle)
    mig.require_mig_capable(gpu)
    if not gpu.mig_current:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    gi = gpu.gi(as_int(gi_id))
    if gi is None:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_FOUND)
    store_handle(dest(out), pack_handle(Kind.GPU_INSTANCE, gpu.index, gi.id))


@ENTRY_POINTS.add
def nvmlGpuInstanceGetInfo(node: SimNode, handle: Any, out: Any) -> None:
    gpu, gi = node.gpu_instance(handle)
    info = dest(out)
    store_handle(info, pack_handle(Kind.DEVICE, gpu.index))  # .device is the first field
    info.id = gi.id
    info.profileId = gpu.profile_of(gi).id
    info.placement.start = gi.start
    info.placement.size = gi.size


@ENTRY_POINTS.add
def nvmlGpuInstanceDestroy(node: SimNode, handle: Any) -> None:
    gpu, gi = node.gpu_instance(handle)
    with node.mutate():
        mig.destroy_gpu_instance(gpu, gi.id)


# -- compute instances ---------------------------------------------------------------------------
def _ci_profile(node: SimNode, handle: Any, index: int) -> tuple[SimGpu, SimGi, int]:
    gpu, gi = node.gpu_instance(handle)
    return gpu, gi, mig.compute_slices(gpu, gi, index)


def _fill_ci_profile(node: SimNode, handle: Any, index: int, info: Any) -> None:
    gpu, gi, slices = _ci_profile(node, handle, index)
    profile = gpu.profile_of(gi)
    info.id = index
    info.sliceCount = slices
    info.instanceCount = profile.slices // slices
    info.multiprocessorCount = profile.sms * slices // profile.slices
    info.sharedCopyEngineCount = profile.engines["copy"]
    info.sharedDecoderCount = profile.engines["decoder"]
    info.sharedEncoderCount = profile.engines["encoder"]
    info.sharedJpegCount = profile.engines["jpeg"]
    info.sharedOfaCount = profile.engines["ofa"]


@ENTRY_POINTS.add
def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    node: SimNode, handle: Any, index: Any, engine: Any, out: Any
) -> None:
    info = dest(out)
    if info.version != pynvml.nvmlComputeInstanceProfileInfo_v2:
        raise NvmlFault(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    _fill_ci_profile(node, handle, as_int(index), info)
    gpu, gi = node.gpu_instance(handle)
    info.name = f"MIG {CI_SLICES[as_int(index)]}c.{gpu.profile_of(gi).name}".encode()


@ENTRY_POINTS.add
def nvmlGpuInstanceGetComputeInstanceProfileInfo(
    node: SimNode, handle: Any, index: Any, engine: Any, out: Any
) -> None:
    _fill_ci_profile(node, handle, as_int(index), dest(out))


@ENTRY_POINTS.add
def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    node: SimNode, handle: Any, profile_id: Any, count: Any
) -> None:
    gpu, gi, slices = _ci_profile(node, handle, as_int(profile_id))
    dest(count).value = mig.free_compute_slices(gpu, gi) // slices


@ENTRY_POINTS.add
def nvmlGpuInstanceCreateComputeInstance(
    node: SimNode, handle: Any, profile_id: Any, out: Any
) -> None:
    gpu, gi, _ = _ci_profile(node, handle, as_int(profile_id))
    with node.mutate():
        ci = mig.create_compute_instance(gpu, gi.id, as_int(profile_id))
    store_handle(dest(out), pack_handle(Kind.COMPUTE_INSTANCE, gpu.index, gi.id, ci.id))


@ENTRY_POINTS.add
def nvmlGpuInstanceGetComputeInstances(
    node: SimNode, handle: Any, profile_id: Any, array: Any, count: Any
) -> None:
    gpu, gi, _ = _ci_profile(node, handle, as_int(profile_id))
    wanted = as_int(profile_id)
    found = [c for c in sorted(gi.cis, key=lambda c: c.id) if c.profile_index == wanted]
    _store_handles(
        array,
        count,
        [pack_handle(Kind.COMPUTE_INSTANCE, gpu.index, gi.id, ci.id) for ci in found],
    )


@ENTRY_POINTS.add
def nvmlGpuInstanceGetComputeInstanceById(node: SimNode, handle: Any, ci_id: Any, out: Any) -> None:
    gpu, gi = node.gpu_instance(handle)
    ci = gi.ci(as_int(ci_id))
    if ci is None:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_FOUND)
    store_handle(dest(out), pack_handle(Kind.COMPUTE_INSTANCE, gpu.index, gi.id, ci.id))


@ENTRY_POINTS.add
def nvmlComputeInstanceGetInfo_v2(node: SimNode, handle: Any, out: Any) -> None:
    gpu, gi, ci = node.compute_instance(handle)
    info = dest(out)
    store_handle(info, pack_handle(Kind.DEVICE, gpu.index))  # .device, then .gpuInstance
    store_handle(info, pack_handle(Kind.GPU_INSTANCE, gpu.index, gi.id), 1)
    info.id = ci.id
    info.profileId = ci.profile_index
    info.placement.start = mig.compute_instance_start(gi, ci)
    info.placement.size = ci.slices


@ENTRY_POINTS.add
def nvmlComputeInstanceDestroy(node: SimNode, handle: Any) -> None:
    gpu, gi, ci = node.compute_instance(handle)
    with node.mutate():
        mig.destroy_compute_instance(gpu, gi.id, ci.id)


# -- MIG devices ---------------------------------------------------------------------------------
@ENTRY_POINTS.add
def nvmlDeviceGetMaxMigDeviceCount(node: SimNode, handle: Any, out: Any) -> None:
    gpu = node.gpu(handle)
    dest(out).value = gpu.model.compute_slices if gpu.model.mig_capable else 0


@ENTRY_POINTS.add
def nvmlDeviceGetMigDeviceHandleByIndex(node: SimNode, handle: Any, index: Any, out: Any) -> None:
    gpu = node.gpu(handle)
    mig.require_mig_capable(gpu)
    if not gpu.mig_current:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_FOUND)
    devices = gpu.mig_devices()
    i = as_int(index)
    if i >= gpu.model.compute_slices:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if i >= len(devices):
        raise NvmlFault(pynvml.NVML_ERROR_NOT_FOUND)
    gi, ci = devices[i]
    store_handle(dest(out), pack_handle(Kind.MIG_DEVICE, gpu.index, gi.id, ci.id))


@ENTRY_POINTS.add
def nvmlDeviceGetGpuInstanceId(node: SimNode, handle: Any, out: Any) -> None:
    _, gi, _ = _mig_device(node, handle)
    dest(out).value = gi.id


@ENTRY_POINTS.add
def nvmlDeviceGetComputeInstanceId(node: SimNode, handle: Any, out: Any) -> None:
    _, _, ci = _mig_device(node, handle)
    dest(out).value = ci.id


@ENTRY_POINTS.add
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(node: SimNode, handle: Any, out: Any) -> None:
    gpu, _, _ = _mig_device(node, handle)
    store_handle(dest(out), pack_handle(Kind.DEVICE, gpu.index))


def _mig_device(node: SimNode, handle: Any) -> tuple[SimGpu, SimGi, SimCi]:
    """A MIG device's handle; a full GPU's is an invalid argument here."""
    gpu, gi, ci = node.device(handle)
    if gi is None or ci is None:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return gpu, gi, ci


def _store_handles(array: Any, count: Any, handles: list[int]) -> None:
    target = dest(array)
    if len(target) < len(handles):
        raise NvmlFault(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, handle in enumerate(handles):
        store_handle(target, handle, i)
    dest(count).value = len(handles)
