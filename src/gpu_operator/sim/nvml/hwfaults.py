"""Hardware faults injected into one simulated GPU: plain values and the rules that change them.

A GPU's faults live beside its MIG state (in the node's state file when it has one), so every
process of the node reads the same: an XID log, volatile and aggregate uncorrectable ECC
counts, row-remapping state, fallen off the bus, and thermal or power-brake slowdown.

XIDs are a log with a sequence number, not a queue: NVML gives every event set registered for
a GPU every event after its registration, so each reader keeps its own position (see
:class:`~.faults.EventSets`) and nothing is taken out of the log. The log keeps only the latest
:data:`XID_LOG_LIMIT` entries, as NVML's event queues are bounded too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .profiles import GpuModel, SimulationError

XID = "xid"
ECC = "ecc"
REMAP_PENDING = "remap-pending"
REMAP_FAILURE = "remap-failure"
LOST = "lost"
THERMAL = "thermal"
POWER = "power"
FAULT_KINDS = (XID, ECC, REMAP_PENDING, REMAP_FAILURE, LOST, THERMAL, POWER)
"""What can be injected; ``clear`` takes one of them, or none for all."""

XID_LOG_LIMIT = 64


@dataclass(frozen=True)
class GpuFaults:
    """One GPU's injected faults; the default is a healthy GPU."""

    xid_seq: int = 0  # the sequence number of the latest XID ever logged: only grows
    xids: tuple[tuple[int, int], ...] = ()  # (sequence number, XID), oldest first
    ecc_volatile: int = 0  # uncorrected ECC errors since the last reset or driver load
    ecc_aggregate: int = 0  # uncorrected ECC errors over the board's life (a reset keeps them)
    remapped_rows: int = 0  # rows remapped for uncorrectable errors (kept in the InfoROM)
    remap_pending: bool = False  # a remapping waits for a GPU reset
    remap_failure: bool = False  # a remapping failed: no spare rows left, the board must go
    lost: bool = False  # fallen off the bus
    thermal: bool = False  # HW and SW thermal slowdown
    power: bool = False  # HW power brake slowdown


HEALTHY = GpuFaults()


def check(model: GpuModel, kind: str, value: int | None) -> None:
    """Refuse what the GPU cannot have or a malformed value, with a message a person reads."""
    if kind not in FAULT_KINDS:
        raise SimulationError(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
    if kind == XID and value is None:
        raise SimulationError("an xid fault needs its XID number (e.g. xid 79)")
    if kind in (XID, ECC, REMAP_PENDING, REMAP_FAILURE):
        if value is not None and value <= 0:
            raise SimulationError(f"{kind} takes a positive number, not {value}")
    elif value is not None:
        raise SimulationError(f"{kind} takes no value")
    if kind == ECC and not model.ecc:
        raise SimulationError(f"{model.name} has no ECC memory: no ECC errors to inject")
    if kind in (REMAP_PENDING, REMAP_FAILURE) and not model.row_remapping:
        raise SimulationError(f"{model.name} has no row remapping: nothing to remap")


def inject(faults: GpuFaults, kind: str, value: int | None = None) -> GpuFaults:
    """``faults`` with one more: an XID logged, ``value`` ECC errors (default 1) counted,
    ``value`` rows (default 1) remapped pending or failed, or a condition switched on."""
    count = 1 if value is None else value
    if kind == XID:
        assert value is not None
        seq = faults.xid_seq + 1
        log = (*faults.xids, (seq, value))[-XID_LOG_LIMIT:]
        return dataclasses.replace(faults, xid_seq=seq, xids=log)
    if kind == ECC:
        return dataclasses.replace(
            faults,
            ecc_volatile=faults.ecc_volatile + count,
            ecc_aggregate=faults.ecc_aggregate + count,
        )
    rows = faults.remapped_rows + count
    if kind == REMAP_PENDING:
        return dataclasses.replace(faults, remap_pending=True, remapped_rows=rows)
    if kind == REMAP_FAILURE:
        return dataclasses.replace(faults, remap_failure=True, remapped_rows=rows)
    if kind not in (LOST, THERMAL, POWER):
        raise SimulationError(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
    flag: dict[str, Any] = {kind: True}  # the field of that name
    return dataclasses.replace(faults, **flag)


def clear(faults: GpuFaults, kind: str | None = None) -> GpuFaults:
    """``faults`` without ``kind`` (the XIDs not yet read, the ECC counts, one remap state, a
    condition), or as a new board when None. XID sequence numbers never go back, so a reader
    never takes a later XID for one it has already seen."""
    if kind is None:
        return dataclasses.replace(HEALTHY, xid_seq=faults.xid_seq)
    if kind not in FAULT_KINDS:
        raise SimulationError(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
    changes: dict[str, Any] = {
        XID: {"xids": ()},
        ECC: {"ecc_volatile": 0, "ecc_aggregate": 0},
        REMAP_PENDING: {"remap_pending": False},
        REMAP_FAILURE: {"remap_failure": False},
        LOST: {"lost": False},
        THERMAL: {"thermal": False},
        POWER: {"power": False},
    }
    undone: dict[str, Any] = changes[kind]
    return dataclasses.replace(faults, **undone)


def reset(faults: GpuFaults) -> GpuFaults:
    """What a GPU reset does: the GPU is back on the bus, volatile ECC counts start again and a
    pending remapping takes effect. A failed remapping needs a new board; XIDs stay logged."""
    return dataclasses.replace(faults, lost=False, ecc_volatile=0, remap_pending=False)


def xids_after(faults: GpuFaults, seq: int) -> list[tuple[int, int]]:
    """The logged (sequence number, XID) pairs after ``seq``, oldest first."""
    return [entry for entry in faults.xids if entry[0] > seq]


# -- in the state file -----------------------------------------------------------------------
def to_doc(faults: GpuFaults) -> dict[str, Any]:
    doc = dataclasses.asdict(faults)
    doc["xids"] = [list(entry) for entry in faults.xids]
    return doc


def from_doc(doc: dict[str, Any] | None) -> GpuFaults:
    """A GPU's faults from its state-file entry; a file from before faults is a healthy GPU."""
    if not doc:
        return HEALTHY
    known = {f.name for f in dataclasses.fields(GpuFaults)}
    values = {k: v for k, v in doc.items() if k in known}
    values["xids"] = tuple((int(s), int(x)) for s, x in doc.get("xids", ()))
    return GpuFaults(**values)
