"""Where each GPU sits: its NUMA node and the PCIe root port above it, from sysfs.

Read once per device map (GPUs do not move); :func:`read_locality` is the only I/O here. A GPU
sysfs does not describe (simulated GPUs, a container without /sys) has an unknown locality,
and allocation then falls back to index order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Locality:
    numa_node: int | None = None
    pci_root: str | None = None  # host bridge and root port, e.g. "pci0000:00/0000:00:01.1"


def sysfs_address(bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as sysfs names it: ``0000:07:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def pci_root(device_path: str) -> str | None:
    """The first two hops under /sys/devices (host bridge, root port) of a device path."""
    parts = [p for p in device_path.split("/") if p]
    try:
        start = next(i for i, p in enumerate(parts) if p.startswith("pci"))
    except StopIteration:
        return None
    hops = parts[start : start + 2]
    return "/".join(hops) if len(hops) == 2 and len(parts) > start + 2 else parts[start]


def read_locality(bus_id: str, sysfs: Path = Path("/sys")) -> Locality:
    link = sysfs / "bus" / "pci" / "devices" / sysfs_address(bus_id)
    if not link.exists():
        return Locality()
    numa: int | None = None
    try:
        value = int((link / "numa_node").read_text().strip())
        numa = value if value >= 0 else None
    except (OSError, ValueError):
        numa = None
    resolved = os.path.realpath(link)
    devices = os.path.realpath(sysfs / "devices")
    relative = resolved[len(devices) :] if resolved.startswith(devices) else resolved
    return Locality(numa, pci_root(relative))
