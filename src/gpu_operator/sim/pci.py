"""The simulated node's PCI bus in sysfs, below the plugin's :class:`PciBus`: what a kernel with
the IOMMU on shows of the GPUs' PCI functions, and a small stand-in "kernel" that applies what
is written to the drivers' ``bind`` and ``unbind`` files.

Under the node's root, per GPU (its NVML bus id ``00000000:07:00.0`` as sysfs spells it,
``0000:07:00.0``)::

    sys/bus/pci/devices/<address>/vendor          0x10de
    sys/bus/pci/devices/<address>/device          the model's PCI device id (0x20b0)
    sys/bus/pci/devices/<address>/class           0x030200 (3D controller)
    sys/bus/pci/devices/<address>/driver_override
    sys/bus/pci/devices/<address>/driver       -> ../../drivers/nvidia (or vfio-pci)
    sys/bus/pci/devices/<address>/iommu_group  -> ../../../../kernel/iommu_groups/<n>
    sys/bus/pci/drivers/{nvidia,vfio-pci}/{bind,unbind}
    sys/kernel/iommu_groups/<n>/devices/<address>
    dev/vfio/vfio, dev/vfio/<n>

Each GPU gets an IOMMU group of its own (``n`` = its position by address), as a GPU behind its
own PCIe switch port has. The ``/dev/vfio`` entries are stand-ins: character devices of the
misc major (10:196 for the container node, /dev/null's numbers for the groups, so opening them
works) when laid out as root, empty regular files otherwise, as the stub driver's /dev/nvidia*
are only real nodes as root. Nothing here moves a real device; no IOMMUFD (``dev/iommu``) is
laid out unless asked for.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agent.dra.vfio import (
    DEVICES,
    DRIVERS,
    GPU_CLASS,
    IOMMU_DEV,
    IOMMU_GROUPS,
    NVIDIA_DRIVER,
    NVIDIA_VENDOR,
    SIMULATED_MARKER,
    VFIO_DRIVER,
    PassthroughError,
    SysfsPciBus,
)
from gpu_operator.sim.nvml.profiles import available_profiles, load_model

VFIO_CONTAINER_NODE = (10, 196)
GROUP_NODE = (1, 3)


def device_ids() -> dict[str, int]:
    """NVML product name -> PCI device id (the high half of NVML's ``pciDeviceId``), for the
    models in ``sim/profiles``."""
    models = (load_model(key) for key in available_profiles())
    return {m.name: m.pci_device_id >> 16 for m in models}


def sysfs_address(pci_bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` -> sysfs's ``0000:07:00.0``."""
    domain, rest = pci_bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()


@dataclass(frozen=True)
class PciGpu:
    """One GPU's PCI function: its NVML bus id and product name (for its device id)."""

    pci_bus_id: str
    name: str
    device_id: int | None = None  # None: by the product name from the profiles


def lay_out_pci(
    root: Path, gpus: Sequence[PciGpu], *, iommufd: bool = False, bound: str = NVIDIA_DRIVER
) -> list[str]:
    """Lay out the PCI functions of ``gpus`` under ``root``, each bound to ``bound``; returns
    what it wrote, root-relative. Laying out again keeps each function's current driver."""
    ids = device_ids()
    written: list[str] = []

    def text(rel: str, content: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or content:
            path.write_text(content)
        written.append(rel)

    def link(rel: str, target: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.symlink_to(target)
        written.append(rel)

    text(SIMULATED_MARKER, "simulated PCI bus: writes are applied by gpu_operator.sim.pci\n")
    for driver in (NVIDIA_DRIVER, VFIO_DRIVER):
        for name in ("bind", "unbind"):
            text(f"{DRIVERS}/{driver}/{name}", "")
    for group, gpu in enumerate(sorted(gpus, key=lambda g: sysfs_address(g.pci_bus_id))):
        address = sysfs_address(gpu.pci_bus_id)
        device_id = gpu.device_id if gpu.device_id is not None else ids.get(gpu.name)
        if device_id is None:
            raise PassthroughError(f"no PCI device id known for {gpu.name!r}")
        here = f"{DEVICES}/{address}"
        text(f"{here}/vendor", f"0x{NVIDIA_VENDOR:04x}\n")
        text(f"{here}/device", f"0x{device_id:04x}\n")
        text(f"{here}/class", f"0x{GPU_CLASS:06x}\n")
        text(f"{here}/driver_override", "")
        if not (root / here / "driver").is_symlink():
            link(f"{here}/driver", f"../../drivers/{bound}")
        link(f"{here}/iommu_group", f"../../../../kernel/iommu_groups/{group}")
        link(f"{IOMMU_GROUPS}/{group}/devices/{address}", f"../../../../bus/pci/devices/{address}")
        written.append(_node(root, f"dev/vfio/{group}", GROUP_NODE))
    written.append(_node(root, "dev/vfio/vfio", VFIO_CONTAINER_NODE))
    if iommufd:
        written.append(_node(root, IOMMU_DEV.lstrip("/"), GROUP_NODE))
    return written


def _node(root: Path, rel: str, device: tuple[int, int]) -> str:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        if os.geteuid() == 0:
            os.mknod(path, 0o600 | 0o020000, os.makedev(*device))
        else:
            path.touch()
    return rel


def apply_writes(root: Path) -> None:
    """The stand-in kernel: every address written to a driver's ``unbind`` loses its ``driver``
    link (it must be that driver's), every address written to ``bind`` gets one (it must be
    unbound, and ``vfio-pci`` takes only a device whose ``driver_override`` names it, as the
    kernel's vfio-pci has no id table for GPUs); then the files are emptied."""
    drivers = root / DRIVERS
    for action in ("unbind", "bind"):
        for driver_dir in sorted(drivers.iterdir()):
            request = driver_dir / action
            if not request.is_file():
                continue
            address = request.read_text().strip()
            request.write_text("")
            if not address:
                continue
            device = root / DEVICES / address
            if not device.is_dir():
                raise PassthroughError(f"{request}: no such device {address}")
            link = device / "driver"
            current = os.path.basename(os.readlink(link)) if link.is_symlink() else ""
            if action == "unbind":
                if current != driver_dir.name:
                    raise PassthroughError(f"{address} is not bound to {driver_dir.name}")
                link.unlink()
                continue
            if current:
                raise PassthroughError(f"{address} is already bound to {current}")
            override = (device / "driver_override").read_text().strip()
            if driver_dir.name == VFIO_DRIVER and override != VFIO_DRIVER:
                raise PassthroughError(f"{VFIO_DRIVER} does not take {address}: no override")
            if override and override != driver_dir.name:
                raise PassthroughError(f"{address} is overridden to {override}")
            link.symlink_to(f"../../drivers/{driver_dir.name}")


class SimulatedPciBus(SysfsPciBus):
    """The plugin's sysfs bus on a simulated root: each write is applied at once, as the
    kernel applies it before the write returns."""

    def _write(self, path: Path, text: str) -> None:
        super()._write(path, text)
        apply_writes(self.root)
