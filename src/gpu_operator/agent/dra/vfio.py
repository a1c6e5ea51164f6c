"""GPU passthrough (``PassthroughSupport``): a GPU's PCI function moved between the ``nvidia``
and ``vfio-pci`` kernel drivers, as NVIDIA's DRA driver moves it for a ``gpu-vfio-<index>``
claim.

The plugin reaches the PCI bus only through :class:`PciBus` (which driver a function is bound
to, its IOMMU group, bind and unbind). :class:`SysfsPciBus` is the kernel's sysfs under a root:
it writes the PCI address to ``sys/bus/pci/drivers/<driver>/{unbind,bind}`` (with
``driver_override`` so that ``vfio-pci`` takes a device it has no id table entry for) and reads
the ``driver`` and ``iommu_group`` links. A root with no kernel behind it (the simulated
driver's node root) has its writes applied by whatever registered itself for such roots
(:func:`register_pci_bus`, as the simulation registers with the NVML loader): this module
never imports the simulation.

A GPU is only handed to ``vfio-pci`` when no process holds its ``/dev/nvidia<minor>``
(:func:`holders`: the processes this plugin can see with the node open, as NVIDIA's ``fuser``
check sees them; a container's own view of the device is out of sight of both).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

NVIDIA_VENDOR = 0x10DE
GPU_CLASS = 0x030200  # a 3D controller; display controllers are 0x03xxxx too
NVIDIA_DRIVER = "nvidia"
VFIO_DRIVER = "vfio-pci"
DEVICES = "sys/bus/pci/devices"
DRIVERS = "sys/bus/pci/drivers"
IOMMU_GROUPS = "sys/kernel/iommu_groups"
VFIO_DEV = "/dev/vfio"
VFIO_CONTAINER = "/dev/vfio/vfio"
IOMMU_DEV = "/dev/iommu"
SIMULATED_MARKER = "sys/bus/pci/SIMULATED"  # a root whose sysfs no kernel applies


class PassthroughError(Exception):
    """A GPU cannot be moved to or from ``vfio-pci``; the message says why."""


class PciBus(Protocol):
    """The PCI functions of a node, as the plugin needs them for passthrough."""

    def driver_of(self, address: str) -> str:
        """The driver ``address`` is bound to (``nvidia``, ``vfio-pci``), "" when none."""

    def bind(self, address: str, driver: str) -> None:
        """Bind the (unbound) function at ``address`` to ``driver``."""

    def unbind(self, address: str) -> None:
        """Unbind ``address`` from its driver (none bound: nothing)."""

    def iommu_group(self, address: str) -> str:
        """The IOMMU group of ``address`` (``/dev/vfio/<group>``)."""

    def nvidia_functions(self) -> list[str]:
        """The addresses of NVIDIA's GPU functions on the node (vendor 0x10de, a display
        class: not an NVSwitch, not a GPU's audio function), sorted."""

    def iommufd(self) -> bool:
        """Whether the host has IOMMUFD (``/dev/iommu``)."""

    def iommu_enabled(self) -> bool:
        """Whether the kernel has the IOMMU on (any group in ``sys/kernel/iommu_groups``)."""

    def vfio_cdev(self, address: str) -> str:
        """The IOMMUFD character device of ``address`` on vfio-pci (``vfio3``), "" if none."""


class SysfsPciBus:
    """The kernel's PCI bus in sysfs, under ``root`` (``/`` on a node; the plugin's view of the
    host root otherwise)."""

    def __init__(self, root: Path | str = "/") -> None:
        self.root = Path(root)

    def _device(self, address: str) -> Path:
        return self.root / DEVICES / address

    def driver_of(self, address: str) -> str:
        link = self._device(address) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else ""

    def _write(self, path: Path, text: str) -> None:
        try:
            path.write_text(text)
        except OSError as err:
            raise PassthroughError(f"writing {text.strip()!r} to {path}: {err}") from err

    def bind(self, address: str, driver: str) -> None:
        # driver_override makes the kernel match ``driver`` alone; "\n" clears it.
        override = self._device(address) / "driver_override"
        if override.exists():
            self._write(override, f"{driver}\n" if driver == VFIO_DRIVER else "\n")
        self._write(self.root / DRIVERS / driver / "bind", address)

    def unbind(self, address: str) -> None:
        current = self.driver_of(address)
        if current:
            self._write(self.root / DRIVERS / current / "unbind", address)

    def iommu_group(self, address: str) -> str:
        link = self._device(address) / "iommu_group"
        if not link.is_symlink():
            raise PassthroughError(f"GPU {address} has no IOMMU group: is the IOMMU enabled?")
        return os.path.basename(os.readlink(link))

    def nvidia_functions(self) -> list[str]:
        folder = self.root / DEVICES
        found = []
        for device in sorted(folder.iterdir()) if folder.is_dir() else ():
            try:
                vendor = int((device / "vendor").read_text().strip(), 16)
                pci_class = int((device / "class").read_text().strip(), 16)
            except (OSError, ValueError):
                continue
            if vendor == NVIDIA_VENDOR and pci_class >> 16 == 0x03:
                found.append(device.name)
        return found

    def iommufd(self) -> bool:
        return (self.root / IOMMU_DEV.lstrip("/")).exists()

    def iommu_enabled(self) -> bool:
        groups = self.root / IOMMU_GROUPS
        return groups.is_dir() and any(groups.iterdir())

    def vfio_cdev(self, address: str) -> str:
        folder = self._device(address) / "vfio-dev"
        names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        return next((n for n in names if n.startswith("vfio")), "")


PciBusFactory = Callable[[Path], PciBus]
_SIMULATED: list[PciBusFactory] = []


def register_pci_bus(factory: PciBusFactory | None) -> None:
    """The bus of roots marked simulated (``sys/bus/pci/SIMULATED``): the simulation registers
    its own at start, as it registers its NVML (None: forget it)."""
    _SIMULATED[:] = [factory] if factory is not None else []


def pci_bus(root: Path | str = "/") -> PciBus:
    """The PCI bus under ``root``: the kernel's, or, for a simulated root, the registered
    simulation's (an error when none is registered: its writes would never be applied)."""
    path = Path(root)
    if not (path / SIMULATED_MARKER).exists():
        return SysfsPciBus(path)
    if not _SIMULATED:
        raise PassthroughError(
            f"{path} has a simulated PCI bus and this process registered no simulation: "
            "gpu_operator.sim.registration.register() does"
        )
    return _SIMULATED[0](path)


def vfio_uuid(address: str) -> str:
    """NVIDIA's UUID of a VFIO device: version 5 (SHA-1) of its PCI address in the DNS
    namespace, so it is the same for the same slot on every restart."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, address))


def holders(device: Path, proc: Path = Path("/proc")) -> list[int]:
    """The processes (visible here) with ``device`` open: their pids, sorted."""
    try:
        wanted = device.resolve(strict=True)
    except OSError:
        return []
    found: list[int] = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                if Path(os.readlink(fd)) == wanted:
                    found.append(int(entry.name))
                    break
            except OSError:
                continue
    return sorted(found)


@dataclass(frozen=True)
class VfioBinding:
    """A GPU a claim holds bound to ``vfio-pci``: its PCI address, IOMMU group (once bound) and
    the minor its ``/dev/nvidia<minor>`` had, what Unprepare binds back to ``nvidia``; with the
    claim's IOMMU choices (``VfioDeviceConfig.iommu``) and, on an IOMMUFD host, its
    ``vfio-dev`` character device (``vfio3``)."""

    address: str
    group: str
    minor: int
    prefer_iommufd: bool = False
    api_device: bool = False
    cdev: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "group": self.group,
            "minor": self.minor,
            "preferIommuFD": self.prefer_iommufd,
            "apiDevice": self.api_device,
            "cdev": self.cdev,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VfioBinding:
        return cls(
            str(data["address"]),
            str(data["group"]),
            int(data["minor"]),
            bool(data.get("preferIommuFD", False)),
            bool(data.get("apiDevice", False)),
            str(data.get("cdev", "")),
        )


class VfioControl:
    """Moves GPUs between ``nvidia`` and ``vfio-pci`` on ``bus``; ``busy`` names the processes
    holding a GPU's minor (default: :func:`holders` of its node under ``dev_dir``)."""

    def __init__(
        self,
        bus: PciBus,
        dev_dir: Path,
        busy: Callable[[int], list[int]] | None = None,
    ) -> None:
        self.bus = bus
        self.dev_dir = dev_dir
        self.busy = busy or (lambda minor: holders(dev_dir / f"nvidia{minor}"))

    def to_vfio(self, wanted: VfioBinding) -> VfioBinding:
        """``wanted``'s GPU bound to ``vfio-pci``, with its group and IOMMUFD device (already
        bound: the same answer); refused while a process holds the GPU or while it is bound
        to a driver that is neither."""
        address, minor = wanted.address, wanted.minor
        current = self.bus.driver_of(address)
        if current not in (VFIO_DRIVER, NVIDIA_DRIVER, ""):
            raise PassthroughError(
                f"GPU {address} is bound to {current!r}, not {NVIDIA_DRIVER} or {VFIO_DRIVER}"
            )
        if current == NVIDIA_DRIVER:
            pids = self.busy(minor)
            if pids:
                raise PassthroughError(
                    f"GPU {address} (/dev/nvidia{minor}) is in use by process(es) "
                    f"{', '.join(map(str, pids))}: it is handed to vfio-pci once they exit"
                )
            self.bus.unbind(address)
        if current != VFIO_DRIVER:
            self.bus.bind(address, VFIO_DRIVER)
        if self.bus.driver_of(address) != VFIO_DRIVER:
            raise PassthroughError(f"GPU {address} did not bind to {VFIO_DRIVER}")
        return replace(
            wanted, group=self.bus.iommu_group(address), cdev=self.bus.vfio_cdev(address)
        )

    def to_nvidia(self, address: str) -> None:
        """``address`` bound back to ``nvidia`` (already: nothing)."""
        current = self.bus.driver_of(address)
        if current == NVIDIA_DRIVER:
            return
        if current:
            self.bus.unbind(address)
        self.bus.bind(address, NVIDIA_DRIVER)
        if self.bus.driver_of(address) != NVIDIA_DRIVER:
            raise PassthroughError(f"GPU {address} did not bind back to {NVIDIA_DRIVER}")

    def release_unheld(self, held: Iterable[str]) -> list[str]:
        """Bind back to ``nvidia`` every NVIDIA function on ``vfio-pci`` no claim holds (a
        plugin killed mid-Prepare, or down while a claim went); returns their addresses."""
        keep = set(held)
        freed = []
        for address in self.bus.nvidia_functions():
            if address not in keep and self.bus.driver_of(address) == VFIO_DRIVER:
                self.to_nvidia(address)
                freed.append(address)
        return freed
