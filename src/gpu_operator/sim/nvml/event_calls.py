"""C entry points for NVML events: XID critical errors, read from an event set.

Each set delivers every XID its GPUs log after they were registered in it (by any process of
the node: the log is in the shared state), once; see :class:`~.faults.EventSets`.
"""

from __future__ import annotations

from typing import Any

import pynvml

from . import hwfaults
from .cabi import EntryPoints, Kind, as_int, dest, pack_handle, store_handle, unpack_handle
from .devices import NvmlFault
from .node import SimNode

ENTRY_POINTS = EntryPoints()


@ENTRY_POINTS.add
def nvmlEventSetCreate(node: SimNode, out: Any) -> None:
    store_handle(dest(out), pack_handle(Kind.EVENT_SET, node.events.create()))


@ENTRY_POINTS.add
def nvmlDeviceGetSupportedEventTypes(node: SimNode, handle: Any, out: Any) -> None:
    node.full_gpu(handle)
    dest(out).value = pynvml.nvmlEventTypeXidCriticalError


@ENTRY_POINTS.add
def nvmlDeviceRegisterEvents(node: SimNode, handle: Any, types: Any, events: Any) -> None:
    gpu = node.full_gpu(handle)
    if not as_int(types) & pynvml.nvmlEventTypeXidCriticalError:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    node.events.register(_event_set(events), gpu.index, gpu.faults.xid_seq)


@ENTRY_POINTS.add
def nvmlEventSetWait_v2(node: SimNode, events: Any, out: Any, timeout: Any) -> None:
    """The next pending XID, or a timeout at once (waiting would hold the library's lock)."""
    set_id = _event_set(events)
    node.sync()
    found = node.events.next_xid(
        set_id, lambda gpu, seq: hwfaults.xids_after(node.gpus[gpu].faults, seq)
    )
    if found is None:
        raise NvmlFault(pynvml.NVML_ERROR_TIMEOUT)
    index, xid = found
    data = dest(out)
    store_handle(data, pack_handle(Kind.DEVICE, index))
    data.eventType = pynvml.nvmlEventTypeXidCriticalError
    data.eventData = xid
    data.gpuInstanceId = 0xFFFFFFFF
    data.computeInstanceId = 0xFFFFFFFF


@ENTRY_POINTS.add
def nvmlEventSetFree(node: SimNode, events: Any) -> None:
    _, set_id, _, _ = unpack_handle(events)
    node.events.free(set_id)


def _event_set(handle: Any) -> int:
    kind, set_id, _, _ = unpack_handle(handle)
    if kind != Kind.EVENT_SET:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return set_id
