"""Injecting hardware faults into a simulated node from outside its processes, by its state file
(and changing its NVLink fabric the same way).

A node's agents each run their own simulated NVML over one state file; a fault written there
(under the file's lock, so it may happen while they run) is what every one of them reads next.
The file must exist: it names the node's GPUs, and the node's simulated NVML writes it when its
first agent starts (a file made here would be overwritten by it).

``gpu`` is an index or a UUID (``GPU-...``): UUIDs derive from the node's seed, so they are
resolved through the ``uuid`` the simulated NVML records per GPU in the file; a file written
before UUIDs were recorded takes indexes only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import fabric, hwfaults
from .hwfaults import GpuFaults
from .persistence import StateFile, read_doc
from .profiles import SimulationError, load_model


def inject_fault(
    state_file: str | Path, gpu: int | str, fault: str, value: int | None = None
) -> int:
    """Inject ``fault`` (:data:`~.hwfaults.FAULT_KINDS`; ``value``: the XID, or how many ECC
    errors or remapped rows) into ``gpu`` of the node whose state is ``state_file``; returns
    the GPU's index. Raises :class:`~.profiles.SimulationError` with a message to show."""
    path = Path(state_file)
    with StateFile(path).edit() as doc:
        index = resolve_gpu(doc, gpu, path)
        entry = doc["gpus"][index]
        hwfaults.check(load_model(entry["model"]), fault, value)
        entry["faults"] = hwfaults.to_doc(
            hwfaults.inject(hwfaults.from_doc(entry.get("faults")), fault, value)
        )
    return index


def clear_faults(state_file: str | Path, gpu: int | str, kind: str | None = None) -> int:
    """Take fault ``kind`` (None: every fault) off ``gpu``; returns the GPU's index."""
    path = Path(state_file)
    with StateFile(path).edit() as doc:
        index = resolve_gpu(doc, gpu, path)
        entry = doc["gpus"][index]
        entry["faults"] = hwfaults.to_doc(
            hwfaults.clear(hwfaults.from_doc(entry.get("faults")), kind)
        )
    return index


def set_fabric(
    state_file: str | Path,
    gpu: int | str | None = None,
    *,
    state: str | None = None,
    status: str | None = None,
) -> list[int]:
    """Put the NVLink fabric of ``gpu`` (None: every GPU with one) in ``state`` and/or
    ``status`` (see :meth:`~.library.SimulatedNvml.set_fabric`); returns the GPUs' indexes."""
    path = Path(state_file)
    with StateFile(path).edit() as doc:
        if gpu is None:
            indexes = [i for i, entry in enumerate(doc["gpus"]) if entry.get("fabric")]
        else:
            indexes = [resolve_gpu(doc, gpu, path)]
        for index in indexes:
            entry = doc["gpus"][index]
            now = fabric.changed(fabric.from_doc(entry.get("fabric")), state=state, status=status)
            entry["fabric"] = fabric.to_doc(now)
    return indexes


def read_faults(state_file: str | Path, gpu: int | str) -> tuple[int, str | None, GpuFaults]:
    """(index, UUID if recorded, faults) of ``gpu`` as the file has them now."""
    path = Path(state_file)
    doc = read_doc(path)
    index = resolve_gpu(doc, gpu, path)
    entry = doc["gpus"][index]
    return index, entry.get("uuid"), hwfaults.from_doc(entry.get("faults"))


def resolve_gpu(doc: dict[str, Any], gpu: int | str, path: Path) -> int:
    """The index of ``gpu`` (an index, its text, or a UUID) among the file's GPUs."""
    gpus = doc["gpus"]
    text = str(gpu).strip()
    if isinstance(gpu, int) or text.isdigit():
        index = int(text)
        if not 0 <= index < len(gpus):
            raise SimulationError(f"no GPU {index} in {path}: the node has {len(gpus)}")
        return index
    uuids = [entry.get("uuid") for entry in gpus]
    if not all(uuids):
        raise SimulationError(
            f"{path} does not record GPU UUIDs (written before they were): give an index"
        )
    if text not in uuids:
        raise SimulationError(f"no GPU {text} in {path}")
    return uuids.index(text)
