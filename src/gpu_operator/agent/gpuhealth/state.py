"""Per-GPU health from one poll's readings and XIDs: pure, ``now`` in epoch seconds.

A GPU turns unhealthy at once on a fault seen now: an XID that counts, more volatile
uncorrected ECC errors than the last reading, a row remap pending or failed, no answer from
NVML (or another GPU at its index, or gone from the inventory), and, where enabled, a thermal
or power-brake slowdown present without a break for the debounce. It turns healthy again only
once ``quiet_s`` has passed since the last fault seen *and* this poll saw none: a lost GPU or a
pending remap is seen on every poll, so it stays unhealthy however long it waits.

What was seen is kept per GPU, each with the time it was *first* seen in this unhealthy spell:
the condition's message is built from it, and must not change on every poll (the agent writes
the condition only when it changes).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpu_operator.agent.gpuhealth.settings import HealthSettings
from gpu_operator.agent.inventory import XidEvent
from gpu_operator.agent.nvml.health import HealthReading

MAX_SEEN = 4  # per GPU in the message: the latest distinct faults


class FaultKind(enum.IntEnum):
    """What was seen; a higher value is more severe and names the condition's reason."""

    POWER = 1
    THERMAL = 2
    ROW_REMAP = 3
    ECC = 4
    XID = 5
    LOST = 6


@dataclass(frozen=True)
class Seen:
    kind: FaultKind
    what: str  # "XID 79", "row remap pending"
    at: float | None  # first seen in this spell; None: carried over from before a restart


@dataclass(frozen=True)
class GpuHealth:
    uuid: str
    index: int
    healthy: bool = True
    last_fault_s: float | None = None  # the latest poll that saw a fault
    seen: tuple[Seen, ...] = ()  # since the GPU turned unhealthy; empty when healthy
    ecc_baseline: int | None = None  # the volatile uncorrected count last read
    thermal_since: float | None = None  # a thermal slowdown present without a break since
    power_since: float | None = None


NodeHealth = Mapping[str, GpuHealth]  # by GPU UUID


def _debounced(
    enabled: bool, present: bool | None, since: float | None, now: float, debounce_s: float
) -> tuple[float | None, bool]:
    """(since, counts now) for a slowdown that must last ``debounce_s`` before it counts."""
    if not enabled or not present:
        return None, False
    since = now if since is None else since
    return since, now - since >= debounce_s


def _faults_now(
    gpu: GpuHealth,
    reading: HealthReading | None,
    xids: Sequence[int],
    now: float,
    settings: HealthSettings,
) -> tuple[GpuHealth, list[tuple[FaultKind, str]]]:
    """The GPU's counters carried forward, and the faults this poll saw."""
    found = [(FaultKind.XID, f"XID {x}") for x in xids if settings.xids.counts(x)]
    if reading is None:
        found.append((FaultKind.LOST, "gone from NVML's GPUs"))
        return replace(gpu, thermal_since=None, power_since=None), found
    if reading.error is not None:
        found.append((FaultKind.LOST, f"not answering NVML ({reading.error})"))
        return replace(gpu, thermal_since=None, power_since=None), found
    baseline = gpu.ecc_baseline
    count = reading.ecc_uncorrected
    if count is not None:
        if baseline is not None and count > baseline:
            found.append((FaultKind.ECC, f"uncorrected ECC errors: {count}"))
        baseline = count
    if reading.remap_pending:
        found.append((FaultKind.ROW_REMAP, "row remap pending"))
    if reading.remap_failure:
        found.append((FaultKind.ROW_REMAP, "row remap failed"))
    thermal_since, thermal = _debounced(
        settings.thermal, reading.thermal_slowdown, gpu.thermal_since, now, settings.debounce_s
    )
    if thermal:
        found.append((FaultKind.THERMAL, "thermal slowdown"))
    power_since, power = _debounced(
        settings.power, reading.power_brake, gpu.power_since, now, settings.debounce_s
    )
    if power:
        found.append((FaultKind.POWER, "power-brake slowdown"))
    carried = replace(
        gpu, ecc_baseline=baseline, thermal_since=thermal_since, power_since=power_since
    )
    return carried, found


def step(
    gpu: GpuHealth,
    reading: HealthReading | None,
    xids: Sequence[int],
    now: float,
    settings: HealthSettings,
) -> GpuHealth:
    """One GPU after one poll (``reading`` None: NVML no longer lists it)."""
    gpu, found = _faults_now(gpu, reading, xids, now, settings)
    if found:
        seen = list(gpu.seen)
        known = {(s.kind, s.what) for s in seen}
        for kind, what in found:
            if (kind, what) not in known:
                known.add((kind, what))
                seen.append(Seen(kind, what, now))
        return replace(gpu, healthy=False, last_fault_s=now, seen=tuple(seen[-MAX_SEEN:]))
    quiet = gpu.last_fault_s is None or now - gpu.last_fault_s >= settings.quiet_s
    if not gpu.healthy and quiet:
        return replace(gpu, healthy=True, last_fault_s=None, seen=())
    return gpu


def observe(
    state: NodeHealth,
    gpus: Mapping[str, int],
    readings: Iterable[HealthReading],
    xids: Iterable[XidEvent],
    now: float,
    settings: HealthSettings,
) -> dict[str, GpuHealth]:
    """The node's GPUs after one poll. ``gpus`` (UUID -> index) is the inventory now; a GPU
    known before and missing from it is lost (GPUs do not leave a running node)."""
    by_uuid = {r.uuid: r for r in readings}
    uuid_at = {index: uuid for uuid, index in gpus.items()}
    xids_of: dict[str, list[int]] = {}
    for event in xids:
        uuid = uuid_at.get(event.gpu_index)
        if uuid is not None:
            xids_of.setdefault(uuid, []).append(event.xid)
    current = {uuid: state.get(uuid) or GpuHealth(uuid, index) for uuid, index in gpus.items()}
    current.update({u: g for u, g in state.items() if u not in gpus})
    return {
        uuid: step(
            replace(gpu, index=gpus.get(uuid, gpu.index)),
            by_uuid.get(uuid) if uuid in gpus else None,
            xids_of.get(uuid, ()),
            now,
            settings,
        )
        for uuid, gpu in current.items()
    }


def unhealthy(state: NodeHealth) -> frozenset[str]:
    """The UUIDs of the unhealthy GPUs."""
    return frozenset(uuid for uuid, gpu in state.items() if not gpu.healthy)
