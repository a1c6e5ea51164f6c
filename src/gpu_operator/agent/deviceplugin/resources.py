"""Which devices the node advertises under which resource name: a pure function of the GPU
inventory and the device-plugin config.

The same computation serves the agent (what it tells the kubelet) and the simulator (the
capacity of a simulated node), so a pod scheduled on a simulated cluster meets the numbers a
real node with that config would show. The rules are NVIDIA's:

- MIG strategy ``none``: every GPU is one ``nvidia.com/gpu``, MIG enabled or not.
- ``single``: MIG devices are ``nvidia.com/gpu``; every GPU must have MIG on and all MIG devices
  must share one profile, else the config is refused.
- ``mixed``: GPUs without MIG are ``nvidia.com/gpu``; MIG devices are
  ``nvidia.com/mig-<profile>`` (``+`` written ``.``).
- Sharing (time-slicing or MPS) replaces each chosen device by ``replicas`` devices with ids
  ``<uuid>::<n>``, under ``rename`` if given; devices not chosen stay under the original name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpu_operator.agent.deviceplugin.config_file import (
    DevicePluginConfig,
    MigStrategy,
    Replicated,
    SharingStrategy,
)
from gpu_operator.agent.discovery import FULL_GPU, mig_name
from gpu_operator.agent.inventory import Gpu, Inventory, MigDevice

REPLICA_SEPARATOR = "::"

__all__ = [
    "Device",
    "DeviceMap",
    "MigPart",
    "ResourceError",
    "advertised_resources",
    "device_map",
    "physical_devices",
    "physical_id",
]


class ResourceError(ValueError):
    """The inventory cannot be advertised under this config (the message says why and where)."""


@dataclass(frozen=True)
class MigPart:
    gi: int
    ci: int
    profile: str  # as resource names spell it, e.g. "1g.5gb", "1g.10gb.me"


@dataclass(frozen=True)
class Device:
    """One device as the kubelet sees it (``id``), and the hardware behind it."""

    id: str  # GPU-/MIG- UUID, with "::<n>" for a replica
    uuid: str  # the GPU or MIG device's own UUID
    index: str  # "3" for a GPU, "3:1" for the second MIG device of GPU 3
    gpu_uuid: str  # the physical GPU (a MIG device's parent)
    gpu_index: int
    minor: int  # /dev/nvidia<minor> of the physical GPU
    pci_bus_id: str
    memory_mib: int
    mig: MigPart | None = None
    replica: int | None = None
    replicas: int = 1


DeviceMap = Mapping[str, tuple[Device, ...]]


def physical_id(device_id: str) -> str:
    """``GPU-x::2`` -> ``GPU-x``: the device a replica stands for."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def _gpu_device(gpu: Gpu) -> Device:
    return Device(
        id=gpu.uuid,
        uuid=gpu.uuid,
        index=str(gpu.index),
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        minor=gpu.minor_number,
        pci_bus_id=gpu.pci_bus_id,
        memory_mib=gpu.memory_mib,
    )


def _mig_device(gpu: Gpu, position: int, mig: MigDevice) -> Device:
    return Device(
        id=mig.uuid,
        uuid=mig.uuid,
        index=f"{gpu.index}:{position}",
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        minor=gpu.minor_number,
        pci_bus_id=gpu.pci_bus_id,
        memory_mib=mig.memory_mib,
        mig=MigPart(mig.gi_id, mig.ci_id, mig_name(mig)),
    )


def _base_map(gpus: Sequence[Gpu], strategy: MigStrategy) -> dict[str, list[Device]]:
    found: dict[str, list[Device]] = {}
    for gpu in gpus:
        if not (gpu.mig_current and strategy != "none"):
            found.setdefault(FULL_GPU, []).append(_gpu_device(gpu))
    if strategy == "none":
        return found
    enabled = [g for g in gpus if g.mig_current]
    empty = [g.index for g in enabled if not g.mig_devices]
    if empty:
        raise ResourceError(
            f"MIG is enabled on GPU {', '.join(map(str, empty))} but it has no MIG devices: "
            "apply a MIG layout (nvidia.com/mig.config) or use migStrategy none"
        )
    if strategy == "single" and enabled:
        profiles = sorted({mig_name(d) for g in enabled for d in g.mig_devices})
        if len(profiles) > 1:
            raise ResourceError(
                f"flags.migStrategy single needs one MIG profile on the node, found "
                f"{', '.join(profiles)}: use migStrategy mixed or a uniform MIG layout"
            )
        if found:
            raise ResourceError(
                "flags.migStrategy single needs MIG enabled on every GPU or on none; "
                f"GPU {', '.join(d.index for d in found[FULL_GPU])} has MIG disabled"
            )
    for gpu in enabled:
        for position, mig in enumerate(gpu.mig_devices):
            name = FULL_GPU if strategy == "single" else f"nvidia.com/mig-{mig_name(mig)}"
            found.setdefault(name, []).append(_mig_device(gpu, position, mig))
    return found


def _matches(device: Device, ref: str) -> bool:
    if ref in (device.index, device.uuid):
        return True
    # MIG-GPU-<uuid>/<gi>/<ci>: the older MIG naming
    if ref.startswith("MIG-GPU-") and device.mig is not None:
        parent, gi, ci = ref[4:].split("/")
        return (parent, int(gi), int(ci)) == (device.gpu_uuid, device.mig.gi, device.mig.ci)
    return False


def _chosen(devices: Sequence[Device], replicated: Replicated, where: str) -> list[Device]:
    wanted = replicated.devices
    if wanted == "all":
        return list(devices)
    if isinstance(wanted, int):
        if wanted > len(devices):
            raise ResourceError(
                f"{where}.devices: {wanted} devices to replicate, but {replicated.name} has "
                f"only {len(devices)}"
            )
        return list(devices[:wanted])
    chosen: list[Device] = []
    for ref in wanted:
        match = next((d for d in devices if _matches(d, ref)), None)
        if match is None:
            raise ResourceError(f"{where}.devices: no {replicated.name} device {ref!r}")
        if match not in chosen:
            chosen.append(match)
    return chosen


def _where(strategy: SharingStrategy, position: int) -> str:
    section = "mps" if strategy == "mps" else "timeSlicing"
    return f"sharing.{section}.resources[{position}]"


def device_map(
    inventory: Inventory, config: DevicePluginConfig, mig_strategy: MigStrategy | None = None
) -> dict[str, tuple[Device, ...]]:
    """Resource name -> its devices, in GPU index order (``mig_strategy`` overrides the
    file's, as the MIG_STRATEGY env var does). Raises :class:`ResourceError`."""
    strategy = mig_strategy or config.flags.mig_strategy or "none"
    base = _base_map(inventory.gpus, strategy)
    sharing = config.sharing
    result: dict[str, list[Device]] = {
        name: list(devices) for name, devices in base.items() if sharing.lookup(name) is None
    }
    for position, replicated in enumerate(sharing.resources):
        devices = base.get(replicated.name)
        if not devices:
            continue  # NVIDIA skips resources the node does not have
        where = _where(sharing.strategy, position)
        chosen = _chosen(devices, replicated, where)
        if sharing.strategy == "mps" and any(d.mig for d in chosen):
            raise ResourceError(
                f"{where}.name: MPS cannot share MIG devices ({replicated.name}); "
                "use timeSlicing or share full GPUs"
            )
        kept = [d for d in devices if d not in chosen]
        if kept:
            result.setdefault(replicated.name, []).extend(kept)
        target = result.setdefault(replicated.rename or replicated.name, [])
        for device in chosen:
            target.extend(
                replace(
                    device,
                    id=f"{device.uuid}{REPLICA_SEPARATOR}{n}",
                    replica=n,
                    replicas=replicated.replicas,
                )
                for n in range(replicated.replicas)
            )
    return {
        name: tuple(sorted(devices, key=_order))
        for name, devices in sorted(result.items())
        if devices
    }


def _order(device: Device) -> tuple[int, int, int]:
    position = int(device.index.split(":")[1]) if device.mig else -1
    return device.gpu_index, position, device.replica if device.replica is not None else -1


def advertised_resources(
    inventory: Inventory, config: DevicePluginConfig, mig_strategy: MigStrategy | None = None
) -> dict[str, int]:
    """Resource name -> how many devices a node with this inventory and config advertises
    (its capacity), e.g. ``{"nvidia.com/gpu.shared": 32}``."""
    return {
        name: len(devices) for name, devices in device_map(inventory, config, mig_strategy).items()
    }


def physical_devices(devices: Iterable[Device]) -> list[Device]:
    """One entry per GPU or MIG device behind ``devices`` (replicas collapsed), in order."""
    seen: dict[str, Device] = {}
    for device in devices:
        if device.uuid not in seen:
            seen[device.uuid] = replace(device, id=device.uuid, replica=None, replicas=1)
    return list(seen.values())
