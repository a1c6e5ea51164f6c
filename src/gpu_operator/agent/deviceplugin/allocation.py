"""What the plugin answers the kubelet's GetPreferredAllocation and Allocate: pure functions
from the advertised devices and the settings to plain data (the gRPC layer only copies it).

Preferred allocation keeps a request close together: devices on the PCIe root port of those
already chosen first, then on their NUMA node; the first device comes from the smallest group
(root port, else NUMA node) that can hold the whole request, so larger groups stay whole for
larger requests. Replicas are spread over the GPUs with the fewest replicas in use, as NVIDIA's
``distributed`` policy does.

Allocate follows NVIDIA's device-plugin: the device list reaches the container as
NVIDIA_VISIBLE_DEVICES (envvar), as mounts under /var/run/nvidia-container-devices
(volume-mounts) or through CDI (annotations or the CRI field); replicas map back to their GPU.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.agent.deviceplugin import cdi
from gpu_operator.agent.deviceplugin.config_file import Sharing
from gpu_operator.agent.deviceplugin.resources import Device
from gpu_operator.agent.deviceplugin.settings import PluginSettings
from gpu_operator.agent.deviceplugin.topology import Locality
from gpu_operator.agent.driver_cdi import HostDriver

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
MPS_CONTAINER_ROOT = "/mps"


class AllocationError(ValueError):
    """The kubelet asked for something the plugin must refuse (the message says why)."""


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


# -- GetPreferredAllocation ---------------------------------------------------------------------
def _distance(a: Locality, b: Locality) -> int:
    if a.pci_root is not None and a.pci_root == b.pci_root:
        return 1
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return 2
    return 3


def preferred_allocation(
    devices: Sequence[Device],
    locality: Mapping[str, Locality],
    available: Sequence[str],
    required: Sequence[str],
    size: int,
) -> list[str]:
    """``size`` ids from ``available``, starting with ``required``. ``locality`` is keyed by
    the physical GPU's UUID; unknown GPUs count as far from everything."""
    by_id = {d.id: d for d in devices}
    unknown = [i for i in (*available, *required) if i not in by_id]
    if unknown:
        raise AllocationError(f"unknown devices {', '.join(sorted(set(unknown)))}")
    chosen = [by_id[i] for i in dict.fromkeys(required)]
    needed = size - len(chosen)
    if needed <= 0:
        return [d.id for d in chosen]
    order = {d.id: n for n, d in enumerate(devices)}
    candidates = [by_id[i] for i in dict.fromkeys(available) if by_id[i] not in chosen]
    if len(candidates) < needed:
        raise AllocationError(
            f"not enough available devices: {size} requested, "
            f"{len(candidates) + len(chosen)} available"
        )
    if any(d.replica is not None for d in candidates):
        picked = _spread_replicas(devices, candidates, chosen, needed, order)
    else:
        picked = _close_together(candidates, chosen, needed, locality, order)
    return [d.id for d in chosen + picked]


def _spread_replicas(
    devices: Sequence[Device],
    candidates: list[Device],
    chosen: Sequence[Device],
    needed: int,
    order: Mapping[str, int],
) -> list[Device]:
    total = Counter(d.uuid for d in devices)
    free = Counter(d.uuid for d in candidates)
    touched = Counter(d.uuid for d in chosen)
    picked: list[Device] = []
    pool = list(candidates)
    for _ in range(needed):
        best = min(
            pool,
            key=lambda d: (total[d.uuid] - free[d.uuid], touched[d.uuid], order[d.id]),
        )
        pool.remove(best)
        picked.append(best)
        free[best.uuid] -= 1
        touched[best.uuid] += 1
    return picked


def _close_together(
    candidates: list[Device],
    chosen: Sequence[Device],
    needed: int,
    locality: Mapping[str, Locality],
    order: Mapping[str, int],
) -> list[Device]:
    where = {d.id: locality.get(d.gpu_uuid, Locality()) for d in (*candidates, *chosen)}
    roots = Counter(where[d.id].pci_root for d in candidates if where[d.id].pci_root is not None)
    numas = Counter(where[d.id].numa_node for d in candidates if where[d.id].numa_node is not None)

    def group_sizes(d: Device) -> tuple[int, int]:
        place = where[d.id]
        root = roots[place.pci_root] if place.pci_root is not None else 1
        numa = numas[place.numa_node] if place.numa_node is not None else 1
        return root, numa

    def first(d: Device) -> tuple[int, int, int, int]:
        root, numa = group_sizes(d)
        if root >= needed:
            return 0, root, 0, order[d.id]  # best fit: the smallest root port that holds it
        if numa >= needed:
            return 1, numa, -root, order[d.id]
        return 2, -numa, -root, order[d.id]

    def near(d: Device, taken: Sequence[Device]) -> tuple[int, int]:
        closest = min(
            0 if d.gpu_uuid == t.gpu_uuid else _distance(where[d.id], where[t.id]) for t in taken
        )
        return closest, order[d.id]

    taken = list(chosen)
    picked: list[Device] = []
    pool = list(candidates)
    for _ in range(needed):
        best = min(pool, key=lambda d: near(d, taken)) if taken else min(pool, key=first)
        pool.remove(best)
        picked.append(best)
        taken.append(best)
    return picked


# -- Allocate -----------------------------------------------------------------------------------
def _section(sharing: Sharing) -> str:
    return "mps" if sharing.strategy == "mps" else "timeSlicing"


def _device_nodes(physical: Sequence[Device], driver: HostDriver) -> tuple[DeviceNode, ...]:
    """The control nodes and each device's, where they exist (passDeviceSpecs)."""
    own = dict.fromkeys(p for d in physical for p in cdi.device_paths(d))
    paths = [*driver.devices.control, *own]
    return tuple(DeviceNode(p, driver.host_dev(p), "rw") for p in paths if p in driver.present)


def container_allocation(
    resource: str,
    devices: Sequence[Device],
    request: Sequence[str],
    settings: PluginSettings,
    sharing: Sharing,
    *,
    response_id: str,
    driver: HostDriver | None = None,
) -> ContainerAllocation:
    """The kubelet's ContainerAllocateResponse for one container asking for ``request`` (ids
    advertised under ``resource``). ``driver``: where the device nodes are (None: none)."""
    by_id = {d.id: d for d in devices}
    for device_id in request:
        if device_id not in by_id:
            raise AllocationError(
                f"invalid allocation request for '{resource}': unknown device: {device_id}"
            )
    replicated = [by_id[i] for i in request if by_id[i].replica is not None]
    if sharing.fail_requests_greater_than_one and replicated and len(request) > 1:
        raise AllocationError(
            f"request for '{resource}: {len(request)}' too large: maximum request size for "
            f"shared resources is 1 (sharing.{_section(sharing)}.failRequestsGreaterThanOne)"
        )
    physical = list({by_id[i].uuid: by_id[i] for i in request}.values())
    ids = [d.uuid if settings.device_id_strategy == "uuid" else d.index for d in physical]
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi_devices: tuple[str, ...] = ()
    if settings.cdi_enabled:
        names = [cdi.qualified_name(i) for i in ids]
        if "cdi-annotations" in settings.device_list_strategies:
            annotations = cdi.annotations_for(settings.cdi_annotation_prefix, response_id, names)
        if "cdi-cri" in settings.device_list_strategies:
            cdi_devices = tuple(names)
    if sharing.strategy == "mps" and any(d.replica is not None for d in devices):
        pipe = os.path.join(MPS_CONTAINER_ROOT, resource, "pipe")
        envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
        mounts.append(Mount(pipe, os.path.join(settings.mps_root, resource, "pipe")))
        mounts.append(Mount("/dev/shm", os.path.join(settings.mps_root, "shm")))
    nodes: tuple[DeviceNode, ...] = ()
    if not settings.cdi_only:
        if "envvar" in settings.device_list_strategies:
            envs[VISIBLE_DEVICES] = ",".join(ids)
        if "volume-mounts" in settings.device_list_strategies:
            envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
            mounts.extend(Mount(os.path.join(VOLUME_MOUNTS_ROOT, i), "/dev/null") for i in ids)
        if settings.pass_device_specs and driver is not None:
            nodes = _device_nodes(physical, driver)
    return ContainerAllocation(
        envs=envs,
        mounts=tuple(mounts),
        device_nodes=nodes,
        annotations=annotations,
        cdi_devices=cdi_devices,
    )
