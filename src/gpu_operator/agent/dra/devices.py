"""NVML inventory -> ResourceSlice devices, named and attributed as NVIDIA's DRA driver does.

Pure: an :class:`~gpu_operator.agent.inventory.Inventory` in, ``resource.k8s.io/v1`` device
dicts out. Names are those of kubernetes-sigs/dra-driver-nvidia-gpu: ``gpu-<minor>`` for a full
GPU, ``gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement start>`` for a MIG
device (``gpu-0-mig-1g5gb-19-0``). A GPU in MIG mode publishes its MIG devices only: the whole GPU
cannot be handed out while it is partitioned. With PassthroughSupport every GPU also publishes
``gpu-vfio-<index>`` (``type=vfio``, the index its PCI function's by address among the node's
GPUs), and a GPU a claim holds on ``vfio-pci`` publishes nothing else until it is back on
``nvidia``. Quantities are written in the API server's canonical form, so a slice read back
compares equal to the one computed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.dra.vfio import NVIDIA_VENDOR, vfio_uuid
from gpu_operator.agent.inventory import Engines, Gpu, Inventory, MigDevice, Placement
from gpu_operator.api.gpucluster import DRIVER_NAME

DRIVER = DRIVER_NAME
STANDARD = "resource.kubernetes.io"
PCIE_ROOT = f"{STANDARD}/pcieRoot"
PCI_BUS_ID = f"{STANDARD}/pciBusID"
MIB = 1024 * 1024

# go-nvlib's architecture names, which NVIDIA's DRA driver publishes.
ARCHITECTURES = {
    "kepler": "Kepler",
    "maxwell": "Maxwell",
    "pascal": "Pascal",
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "ada": "Ada Lovelace",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
}


def semver(text: str) -> str:
    """``580.95.05`` -> ``580.95.5``, ``8.0`` -> ``8.0.0``: a version attribute must be strict
    semver (no leading zeros, three parts), as Masterminds' parser makes it for NVIDIA."""
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    parts += [0] * (3 - len(parts))
    return ".".join(str(p) for p in parts)


def quantity(n: int) -> str:
    """The canonical Kubernetes form of an integer quantity (``40Gi``, ``4864Mi``, ``14``)."""
    if n >= 1024 and n % 1024 == 0:
        for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
            n //= 1024
            if n < 1024 or n % 1024:
                return f"{n}{suffix}"
    return str(n)


def pcie_root(pci_bus_id: str) -> str:
    """The PCIe root complex of a bus id as the kubelet's helper names it (``pci0000:00``).

    On hardware the root is the first component of the sysfs device path; nodes without sysfs
    (simulated) use the domain and the bus's root bus 00.
    """
    domain = pci_bus_id.split(":", 1)[0][-4:].lower()
    return f"pci{domain}:00"


def bus_id(pci_bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` -> ``0000:07:00.0``, the form sysfs and the kubelet use."""
    domain, rest = pci_bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()


def gpu_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor_number}"


def mig_profile_id(gpu: Gpu, mig: MigDevice) -> int:
    profile = gpu.profile(mig.profile)
    return profile.id if profile else 0


def mig_device_name(minor: int, profile: str, profile_id: int, start: int) -> str:
    """``gpu-<minor>-mig-<profile without dots, RFC 1123>-<GI profile id>-<placement start>``:
    the name of a MIG device, created or only possible (``1g.10gb+me`` -> ``1g10gb-me``)."""
    pname = re.sub(r"[^a-z0-9-]", "-", profile.replace(".", "").lower()).strip("-")
    return f"gpu-{minor}-mig-{pname}-{profile_id}-{start}"


def mig_name(gpu: Gpu, mig: MigDevice) -> str:
    return mig_device_name(
        gpu.minor_number, mig.profile, mig_profile_id(gpu, mig), mig.placement.start
    )


def _s(value: str) -> dict[str, Any]:
    return {"string": value}


def _common(gpu: Gpu, inventory: Inventory) -> dict[str, dict[str, Any]]:
    cuda = f"{inventory.cuda_major}.{inventory.cuda_minor}"
    return {
        "productName": _s(gpu.name),
        "brand": _s(gpu.brand),
        "architecture": _s(ARCHITECTURES.get(gpu.architecture, gpu.architecture.title())),
        "cudaComputeCapability": {"version": semver(f"{gpu.compute_major}.{gpu.compute_minor}")},
        "driverVersion": {"version": semver(inventory.driver_version)},
        "cudaDriverVersion": {"version": semver(cuda)},
        PCIE_ROOT: _s(pcie_root(gpu.pci_bus_id)),
        PCI_BUS_ID: _s(bus_id(gpu.pci_bus_id)),
    }


def gpu_device(gpu: Gpu, inventory: Inventory) -> dict[str, Any]:
    attributes = {
        "type": _s("gpu"),
        "uuid": _s(gpu.uuid),
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor_number},
        **_common(gpu, inventory),
    }
    return {
        "name": gpu_name(gpu),
        "attributes": attributes,
        "capacity": {"memory": {"value": quantity(gpu.memory_mib * MIB)}},
    }


def quantities(values: Mapping[str, int]) -> dict[str, dict[str, str]]:
    """A capacity or counter map in API form: ``{"memory": {"value": "4864Mi"}}``."""
    return {k: {"value": quantity(v)} for k, v in values.items()}


def mig_capacity(sm_count: int, engines: Engines, memory_mib: int) -> dict[str, int]:
    """A MIG device's capacity by NVIDIA's names, memory in bytes, without its memory slices."""
    return {
        "multiprocessors": sm_count,
        "copyEngines": engines.copy,
        "decoders": engines.decoder,
        "encoders": engines.encoder,
        "jpegEngines": engines.jpeg,
        "ofaEngines": engines.ofa,
        "memory": memory_mib * MIB,
    }


def mig_attributes(gpu: Gpu, profile: str, inventory: Inventory) -> dict[str, dict[str, Any]]:
    """The attributes a MIG device of ``gpu`` has whether or not it exists yet (no ``uuid``)."""
    return {
        "type": _s("mig"),
        "parentUUID": _s(gpu.uuid),
        "profile": _s(profile),
        **_common(gpu, inventory),
    }


def mig_device(gpu: Gpu, mig: MigDevice, inventory: Inventory) -> dict[str, Any]:
    attributes = {"uuid": _s(mig.uuid), **mig_attributes(gpu, mig.profile, inventory)}
    capacity = mig_capacity(mig.sm_count, mig.engines, mig.memory_mib)
    capacity.update({f"memorySlice{i}": 1 for i in sorted(mig.placement.slices)})
    return {
        "name": mig_name(gpu, mig),
        "attributes": attributes,
        "capacity": quantities(capacity),
    }


@dataclass(frozen=True)
class VfioGpu:
    """A GPU as passthrough publishes it: ``gpu-vfio-<index>``, at ``address`` (sysfs form)."""

    index: int
    address: str
    gpu: Gpu  # as NVML last saw it on ``nvidia``

    @property
    def name(self) -> str:
        return vfio_name(self.index)


def vfio_name(index: int) -> str:
    return f"gpu-vfio-{index}"


def vfio_gpus(gpus: Iterable[Gpu], addresses: Sequence[str] | None = None) -> list[VfioGpu]:
    """The node's GPUs as passthrough numbers them: by position among ``addresses`` (the NVIDIA
    GPU functions on the PCI bus; default: those of ``gpus``), so a GPU NVML no longer sees (on
    ``vfio-pci``) keeps the others' indexes. Only addresses one of ``gpus`` describes (NVML's
    now, or as it last saw them) are listed."""
    by_address = {bus_id(g.pci_bus_id): g for g in gpus}
    order = sorted(by_address) if addresses is None else sorted(addresses)
    return [VfioGpu(i, a, by_address[a]) for i, a in enumerate(order) if a in by_address]


def vfio_device(entry: VfioGpu, iommufd: bool) -> dict[str, Any]:
    """NVIDIA's VFIO device: ``uuid`` v5 of the PCI address, ``deviceID`` and ``vendorID`` as
    ``0x%04x``, ``iommuFDEnabled`` (the host has ``/dev/iommu``), its product and PCI place."""
    gpu = entry.gpu
    vendor = gpu.pci_device_id & 0xFFFF or NVIDIA_VENDOR
    return {
        "name": entry.name,
        "attributes": {
            "type": _s("vfio"),
            "uuid": _s(vfio_uuid(entry.address)),
            "deviceID": _s(f"0x{gpu.pci_device_id >> 16:04x}"),
            "vendorID": _s(f"0x{vendor:04x}"),
            "productName": _s(gpu.name),
            "iommuFDEnabled": {"bool": iommufd},
            PCI_BUS_ID: _s(entry.address),
            PCIE_ROOT: _s(pcie_root(gpu.pci_bus_id)),
        },
    }


def devices(
    inventory: Inventory,
    vfio: Sequence[VfioGpu] = (),
    held: Collection[str] = (),
    iommufd: bool = False,
) -> list[dict[str, Any]]:
    """Every allocatable device of the node, in NVIDIA's order: by GPU minor, then MIG name;
    ``vfio``'s devices after them. A GPU whose address is ``held`` (on ``vfio-pci`` for a
    claim) publishes only its VFIO device."""
    out: list[dict[str, Any]] = []
    taken = set(held)
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor_number):
        if bus_id(gpu.pci_bus_id) in taken:
            continue
        if gpu.mig_current:
            migs = [mig_device(gpu, m, inventory) for m in gpu.mig_devices]
            out.extend(sorted(migs, key=lambda d: str(d["name"])))
        else:
            out.append(gpu_device(gpu, inventory))
    out.extend(vfio_device(entry, iommufd) for entry in vfio)
    return out


@dataclass(frozen=True)
class Partition:
    """A MIG device DynamicMIG publishes before it exists: what Prepare creates for it (a GPU
    instance of ``profile_index`` at ``placement``, one compute instance over all its
    ``slices``)."""

    profile: str  # "1g.10gb"
    profile_index: int  # the NVML_GPU_INSTANCE_PROFILE_* constant
    placement: Placement
    slices: int  # compute slices, all in one compute instance

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "profileIndex": self.profile_index,
            "placement": {"start": self.placement.start, "size": self.placement.size},
            "slices": self.slices,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Partition:
        where = data["placement"]
        return cls(
            profile=str(data["profile"]),
            profile_index=int(data["profileIndex"]),
            placement=Placement(int(where["start"]), int(where["size"])),
            slices=int(data["slices"]),
        )


@dataclass(frozen=True)
class DeviceRef:
    """What a CDI spec needs of a published device: its UUID and its GPU's /dev minor; for a
    partition DynamicMIG creates at Prepare, what to create (its UUID and ids come then)."""

    uuid: str
    minor: int
    mig: tuple[int, int] | None = None  # a MIG device's GPU and compute instance ids
    parent: str = ""  # a MIG device's GPU's UUID
    partition: Partition | None = None
    vfio: str = ""  # a VFIO device's PCI address (sysfs form)

    @property
    def gpu_uuid(self) -> str:
        """The UUID of the whole GPU: what a compute mode is set on."""
        return self.parent or self.uuid

    @property
    def is_mig(self) -> bool:
        """A MIG device, existing or to be created: its config is a MigDeviceConfig's."""
        return self.mig is not None or self.partition is not None

    @property
    def kind(self) -> str:
        """The device ``type``, which says which config kind applies: gpu, mig or vfio."""
        return "vfio" if self.vfio else "mig" if self.is_mig else "gpu"


def refs_by_name(
    inventory: Inventory, vfio: Sequence[VfioGpu] = (), held: Collection[str] = ()
) -> dict[str, DeviceRef]:
    """The devices :func:`devices` publishes, by name (those of ``held`` GPUs: the VFIO one)."""
    names: dict[str, DeviceRef] = {
        e.name: DeviceRef(vfio_uuid(e.address), e.gpu.minor_number, vfio=e.address) for e in vfio
    }
    taken = set(held)
    for gpu in inventory.gpus:
        if bus_id(gpu.pci_bus_id) in taken:
            continue
        if gpu.mig_current:
            names.update(
                {
                    mig_name(gpu, m): DeviceRef(
                        m.uuid, gpu.minor_number, (m.gi_id, m.ci_id), gpu.uuid
                    )
                    for m in gpu.mig_devices
                }
            )
        else:
            names[gpu_name(gpu)] = DeviceRef(gpu.uuid, gpu.minor_number)
    return names
