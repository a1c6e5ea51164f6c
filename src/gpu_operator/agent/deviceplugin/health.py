"""Device health from XID errors: which XIDs count, and when a device is healthy again.

Which XIDs count is NVIDIA's rule: the application errors 13, 31, 43, 45, 68 and 109 leave the
GPU healthy (a program crashed, the GPU is fine); DP_DISABLE_HEALTHCHECKS adds XIDs to ignore
(``all`` or ``xids`` ignores every one) and DP_ENABLE_HEALTHCHECKS counts XIDs again, winning
over both (``all`` counts every XID, application errors included).

An XID that counts marks the GPU Unhealthy, with every device on it (its replicas, its MIG
devices); an XID NVML attributes to one MIG device marks only that MIG device. NVIDIA never
clears the mark (the pod must restart). Here a fault clears once the GPU has gone
``recovery_s`` seconds without another counting XID *and* still answers NVML (the agent probes
it then): a GPU that fell off the bus (XID 79) or needs a reset keeps failing the probe and
stays Unhealthy. ``recovery_s = 0`` keeps NVIDIA's behaviour: unhealthy until restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_operator.agent.deviceplugin.resources import Device

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_RECOVERY_S = 300.0

# (GPU UUID, GPU instance, compute instance): None, None for the whole GPU.
FaultKey = tuple[str, int | None, int | None]


@dataclass(frozen=True)
class XidPolicy:
    disable_all: bool = False
    enable_all: bool = False
    disabled: frozenset[int] = APPLICATION_XIDS
    enabled: frozenset[int] = frozenset()

    @property
    def watches(self) -> bool:
        """False when no XID can count: the agent then skips NVML events entirely."""
        return not self.disable_all or self.enable_all or bool(self.enabled)

    def counts(self, xid: int) -> bool:
        if self.enable_all or xid in self.enabled:
            return True
        if self.disable_all:
            return False
        return xid not in self.disabled


def _xids(text: str | None) -> tuple[bool, frozenset[int]]:
    """(all, the listed XIDs); malformed entries are ignored, as NVIDIA does."""
    items = [t.strip().lower() for t in (text or "").split(",")]
    if any(t in ("all", "xids") for t in items):
        return True, frozenset()
    return False, frozenset(int(t) for t in items if t.isdigit())


def xid_policy(disable: str | None = None, enable: str | None = None) -> XidPolicy:
    """From DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS."""
    disable_all, disabled = _xids(disable)
    enable_all, enabled = _xids(enable)
    return XidPolicy(disable_all, enable_all, (disabled | APPLICATION_XIDS) - enabled, enabled)


@dataclass(frozen=True)
class Fault:
    xid: int  # the latest XID that counted
    last_s: float  # when it came (monotonic seconds)


def fault_key(gpu_uuid: str, gi: int | None, ci: int | None) -> FaultKey:
    return (gpu_uuid, None, None) if gi is None or ci is None else (gpu_uuid, gi, ci)


def record(
    faults: Mapping[FaultKey, Fault], key: FaultKey, xid: int, now_s: float
) -> dict[FaultKey, Fault]:
    return {**faults, key: Fault(xid, now_s)}


def unhealthy_ids(devices: Iterable[Device], faults: Mapping[FaultKey, Fault]) -> frozenset[str]:
    """The advertised ids a fault covers."""
    found = set()
    for device in devices:
        mig = device.mig
        scoped = mig is not None and (device.gpu_uuid, mig.gi, mig.ci) in faults
        if scoped or (device.gpu_uuid, None, None) in faults:
            found.add(device.id)
    return frozenset(found)


def due_for_probe(
    faults: Mapping[FaultKey, Fault], now_s: float, recovery_s: float
) -> list[FaultKey]:
    """Faults quiet for ``recovery_s``: they clear if their GPU answers NVML."""
    if recovery_s <= 0:
        return []
    return [key for key, fault in faults.items() if now_s - fault.last_s >= recovery_s]
