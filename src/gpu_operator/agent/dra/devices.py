"""NVML inventory -> ResourceSlice devices, named and attributed as NVIDIA's DRA driver does.

Pure: an :class:`~gpu_operator.agent.inventory.Inventory` in, ``resource.k8s.io/v1`` device
dicts out. Names are those of kubernetes-sigs/dra-driver-nvidia-gpu: ``gpu-<minor>`` for a full
GPU, ``gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement start>`` for a MIG
device (``gpu-0-mig-1g5gb-19-0``). A GPU in MIG mode publishes its MIG devices only: the whole GPU
cannot be handed out while it is partitioned. Quantities are written in the API server's
canonical form, so a slice read back compares equal to the one computed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.inventory import Gpu, Inventory, MigDevice
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


def mig_name(gpu: Gpu, mig: MigDevice) -> str:
    pname = re.sub(r"[^a-z0-9-]", "-", mig.profile.replace(".", "").lower()).strip("-")
    return f"gpu-{gpu.minor_number}-mig-{pname}-{mig_profile_id(gpu, mig)}-{mig.placement.start}"


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


def mig_device(gpu: Gpu, mig: MigDevice, inventory: Inventory) -> dict[str, Any]:
    attributes = {
        "type": _s("mig"),
        "uuid": _s(mig.uuid),
        "parentUUID": _s(gpu.uuid),
        "profile": _s(mig.profile),
        **_common(gpu, inventory),
    }
    capacity = {
        "multiprocessors": mig.sm_count,
        "copyEngines": mig.engines.copy,
        "decoders": mig.engines.decoder,
        "encoders": mig.engines.encoder,
        "jpegEngines": mig.engines.jpeg,
        "ofaEngines": mig.engines.ofa,
        "memory": mig.memory_mib * MIB,
    }
    capacity.update({f"memorySlice{i}": 1 for i in sorted(mig.placement.slices)})
    return {
        "name": mig_name(gpu, mig),
        "attributes": attributes,
        "capacity": {k: {"value": quantity(v)} for k, v in capacity.items()},
    }


def devices(inventory: Inventory) -> list[dict[str, Any]]:
    """Every allocatable device of the node, in NVIDIA's order: by GPU minor, then MIG name."""
    out: list[dict[str, Any]] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor_number):
        if gpu.mig_current:
            migs = [mig_device(gpu, m, inventory) for m in gpu.mig_devices]
            out.extend(sorted(migs, key=lambda d: str(d["name"])))
        else:
            out.append(gpu_device(gpu, inventory))
    return out


@dataclass(frozen=True)
class DeviceRef:
    """What a CDI spec needs of a published device: its UUID and its GPU's /dev minor."""

    uuid: str
    minor: int
    mig: tuple[int, int] | None = None  # a MIG device's GPU and compute instance ids


def refs_by_name(inventory: Inventory) -> dict[str, DeviceRef]:
    names: dict[str, DeviceRef] = {}
    for gpu in inventory.gpus:
        if gpu.mig_current:
            names.update(
                {
                    mig_name(gpu, m): DeviceRef(m.uuid, gpu.minor_number, (m.gi_id, m.ci_id))
                    for m in gpu.mig_devices
                }
            )
        else:
            names[gpu_name(gpu)] = DeviceRef(gpu.uuid, gpu.minor_number)
    return names
