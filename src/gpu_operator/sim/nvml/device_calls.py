"""C entry points that describe a device, a full GPU or a MIG device: identity, memory, shape."""

from __future__ import annotations

from typing import Any

import pynvml

from . import telemetry
from .cabi import EntryPoints, dest, store_text
from .devices import NvmlFault
from .node import SimNode

ENTRY_POINTS = EntryPoints()

ARCH_CODES = {
    "kepler": pynvml.NVML_DEVICE_ARCH_KEPLER,
    "maxwell": pynvml.NVML_DEVICE_ARCH_MAXWELL,
    "pascal": pynvml.NVML_DEVICE_ARCH_PASCAL,
    "volta": pynvml.NVML_DEVICE_ARCH_VOLTA,
    "turing": pynvml.NVML_DEVICE_ARCH_TURING,
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "ada": pynvml.NVML_DEVICE_ARCH_ADA,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}


@ENTRY_POINTS.add
def nvmlDeviceGetIndex(node: SimNode, handle: Any, out: Any) -> None:
    dest(out).value = node.full_gpu(handle).index


@ENTRY_POINTS.add
def nvmlDeviceGetBrand(node: SimNode, handle: Any, out: Any) -> None:
    """Data-center GPUs report NVML_BRAND_NVIDIA on current drivers."""
    node.full_gpu(handle)
    dest(out).value = pynvml.NVML_BRAND_NVIDIA


@ENTRY_POINTS.add
def nvmlDeviceGetMinorNumber(node: SimNode, handle: Any, out: Any) -> None:
    dest(out).value = node.full_gpu(handle).index


@ENTRY_POINTS.add
def nvmlDeviceGetName(node: SimNode, handle: Any, buffer: Any, length: Any) -> None:
    gpu, gi, _ = node.device(handle)
    name = gpu.model.name
    if gi is not None:
        name = f"{name} MIG {gpu.profile_of(gi).name}"
    store_text(buffer, length, name)


@ENTRY_POINTS.add
def nvmlDeviceGetUUID(node: SimNode, handle: Any, buffer: Any, length: Any) -> None:
    gpu, gi, ci = node.device(handle)
    text = gpu.uuid
    if gi is not None and ci is not None:
        text = gpu.mig_uuid(gi, ci)
    store_text(buffer, length, text)


@ENTRY_POINTS.add
def nvmlDeviceGetPciInfo_v3(node: SimNode, handle: Any, out: Any) -> None:
    gpu = node.full_gpu(handle)
    info = dest(out)
    bus_id = gpu.pci_bus_id
    info.busIdLegacy = bus_id[4:].encode()
    info.busId = bus_id.encode()
    info.domain = 0
    info.bus = gpu.bus
    info.device = 0
    info.pciDeviceId = gpu.model.pci_device_id
    info.pciSubSystemId = gpu.model.pci_subsystem_id


@ENTRY_POINTS.add
def nvmlDeviceGetCudaComputeCapability(node: SimNode, handle: Any, major: Any, minor: Any) -> None:
    gpu, _, _ = node.device(handle)
    dest(major).value, dest(minor).value = gpu.model.compute_capability


@ENTRY_POINTS.add
def nvmlDeviceGetArchitecture(node: SimNode, handle: Any, out: Any) -> None:
    gpu, _, _ = node.device(handle)
    dest(out).value = ARCH_CODES[gpu.model.architecture]


@ENTRY_POINTS.add
def nvmlDeviceGetMemoryInfo(node: SimNode, handle: Any, out: Any) -> None:
    total, free, used, _ = _memory(node, handle)
    info = dest(out)
    info.total, info.free, info.used = total, free, used


@ENTRY_POINTS.add
def nvmlDeviceGetMemoryInfo_v2(node: SimNode, handle: Any, out: Any) -> None:
    info = dest(out)
    if info.version != pynvml.nvmlMemory_v2:
        raise NvmlFault(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    info.total, info.free, info.used, info.reserved = _memory(node, handle)


def _memory(node: SimNode, handle: Any) -> tuple[int, int, int, int]:
    gpu, gi, _ = node.device(handle)
    return telemetry.memory_bytes(gpu, gi, node.load(gpu.index))


@ENTRY_POINTS.add
def nvmlDeviceGetAttributes_v2(node: SimNode, handle: Any, out: Any) -> None:
    gpu, gi, ci = node.device(handle)
    attrs = dest(out)
    if gi is None or ci is None:
        attrs.multiprocessorCount = gpu.model.multiprocessors
        attrs.gpuInstanceSliceCount = gpu.model.compute_slices
        attrs.computeInstanceSliceCount = gpu.model.compute_slices
        attrs.memorySizeMB = gpu.model.memory_mib
        return
    profile = gpu.profile_of(gi)
    attrs.multiprocessorCount = profile.sms * ci.slices // profile.slices
    attrs.sharedCopyEngineCount = profile.engines["copy"]
    attrs.sharedDecoderCount = profile.engines["decoder"]
    attrs.sharedEncoderCount = profile.engines["encoder"]
    attrs.sharedJpegCount = profile.engines["jpeg"]
    attrs.sharedOfaCount = profile.engines["ofa"]
    attrs.gpuInstanceSliceCount = profile.slices
    attrs.computeInstanceSliceCount = ci.slices
    attrs.memorySizeMB = profile.memory_mib
