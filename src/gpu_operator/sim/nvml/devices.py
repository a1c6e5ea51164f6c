"""What a simulated node holds: its GPUs, their GPU and compute instances, MIG mode, and the
hardware faults injected into them (:mod:`.hwfaults`).

Plain mutable data, shared by the MIG rules (:mod:`.mig`), the state file (:mod:`.persistence`)
and the C entry points; a rule that refuses raises :class:`NvmlFault` with NVML's return code.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from .fabric import DEFAULT_FABRIC, SimFabric
from .hwfaults import HEALTHY, GpuFaults
from .profiles import GiProfileSpec, GpuModel

# compute-instance profile index -> compute slices
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
# PCI bus numbers of the eight GPUs in a DGX A100/H100, in NVML index order
DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


class NvmlFault(Exception):
    """An NVML return code: a simulated C function returns ``code`` instead of success."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class SimCi:
    id: int
    profile_index: int

    @property
    def slices(self) -> int:
        return CI_SLICES[self.profile_index]


@dataclass
class SimGi:
    id: int
    profile_index: int
    start: int
    size: int
    cis: list[SimCi] = field(default_factory=list)

    def ci(self, ci_id: int) -> SimCi | None:
        return next((c for c in self.cis if c.id == ci_id), None)


@dataclass
class SimGpu:
    index: int
    model: GpuModel
    uuid: str
    bus: int
    mig_current: bool = False
    mig_pending: bool = False
    gis: list[SimGi] = field(default_factory=list)
    faults: GpuFaults = HEALTHY
    fabric: SimFabric | None = None  # None: no NVLink fabric (NVML says NOT_SUPPORTED)

    @property
    def pci_bus_id(self) -> str:
        """NVML's ``busId``: domain, bus, device and function."""
        return f"00000000:{self.bus:02X}:00.0"

    def gi(self, gi_id: int) -> SimGi | None:
        return next((g for g in self.gis if g.id == gi_id), None)

    def profile_of(self, gi: SimGi) -> GiProfileSpec:
        profile = self.model.gi_profile(index=gi.profile_index)
        assert profile is not None
        return profile

    def mig_uuid(self, gi: SimGi, ci: SimCi) -> str:
        """The UUID of the MIG device ``ci`` of ``gi``: stable for as long as it exists."""
        return f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.uuid}/{gi.id}/{ci.id}/{gi.start}')}"

    def mig_devices(self) -> list[tuple[SimGi, SimCi]]:
        return [(gi, ci) for gi in sorted(self.gis, key=lambda g: g.id) for ci in gi.cis]


def new_gpus(
    models: Sequence[GpuModel], node: str, fabric: SimFabric | None = None
) -> list[SimGpu]:
    """A node's GPUs as booted: UUIDs stable per (node, index, model), DGX bus numbers; GPUs
    with an NVLink fabric registered in ``fabric`` (None: the default rack's)."""
    return [
        SimGpu(
            index=i,
            model=m,
            uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"sim/{node}/{i}/{m.key}")),
            bus=DGX_BUSES[i] if i < len(DGX_BUSES) else 0x10 + i,
            fabric=(fabric or DEFAULT_FABRIC) if m.nvlink_fabric else None,
        )
        for i, m in enumerate(models)
    ]
