"""C entry points of the library itself: init and shutdown, versions, finding devices."""

from __future__ import annotations

from typing import Any

import pynvml

from .cabi import EntryPoints, Kind, as_int, dest, pack_handle, store_handle, store_text
from .devices import NvmlFault
from .node import SimNode

ENTRY_POINTS = EntryPoints()

NO_INIT_NEEDED = frozenset({"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlErrorString"})
"""What a program may call before ``nvmlInit``; everything else is ``UNINITIALIZED`` then."""


@ENTRY_POINTS.add
def nvmlInitWithFlags(node: SimNode, flags: Any) -> None:
    node.init_count += 1


@ENTRY_POINTS.add
def nvmlInit_v2(node: SimNode) -> None:
    node.init_count += 1


@ENTRY_POINTS.add
def nvmlShutdown(node: SimNode) -> None:
    if node.init_count == 0:
        raise NvmlFault(pynvml.NVML_ERROR_UNINITIALIZED)
    node.init_count -= 1


@ENTRY_POINTS.add
def nvmlErrorString(node: SimNode, code: Any) -> bytes:
    return f"Simulated NVML error {as_int(code)}".encode()


@ENTRY_POINTS.add
def nvmlSystemGetDriverVersion(node: SimNode, buffer: Any, length: Any) -> None:
    store_text(buffer, length, node.driver_version)


@ENTRY_POINTS.add
def nvmlSystemGetNVMLVersion(node: SimNode, buffer: Any, length: Any) -> None:
    store_text(buffer, length, "13." + node.driver_version)


@ENTRY_POINTS.add
def nvmlSystemGetCudaDriverVersion(node: SimNode, out: Any) -> None:
    dest(out).value = node.cuda_version


@ENTRY_POINTS.add
def nvmlSystemGetCudaDriverVersion_v2(node: SimNode, out: Any) -> None:
    dest(out).value = node.cuda_version


@ENTRY_POINTS.add
def nvmlDeviceGetCount_v2(node: SimNode, out: Any) -> None:
    """Every GPU, a lost one too: NVML counts what the driver probed at load."""
    dest(out).value = len(node.gpus)


@ENTRY_POINTS.add
def nvmlDeviceGetHandleByIndex_v2(node: SimNode, index: Any, out: Any) -> None:
    gpu = node.gpu_at(as_int(index))
    store_handle(dest(out), pack_handle(Kind.DEVICE, gpu.index))


@ENTRY_POINTS.add
def nvmlDeviceGetHandleByUUID(node: SimNode, text: Any, out: Any) -> None:
    raw = text if isinstance(text, bytes) else dest(text).value
    wanted = raw.decode()
    for gpu in node.gpus:
        if gpu.uuid == wanted:
            node.gpu_at(gpu.index)  # fallen off the bus: NVML_ERROR_GPU_IS_LOST
            store_handle(dest(out), pack_handle(Kind.DEVICE, gpu.index))
            return
    raise NvmlFault(pynvml.NVML_ERROR_NOT_FOUND)
