"""DynamicMIG: every MIG partition a GPU could be cut into, published before any exists.

Pure: an :class:`~gpu_operator.agent.inventory.Inventory` GPU in, ``resource.k8s.io/v1`` dicts
out, named and shaped as kubernetes-sigs/dra-driver-nvidia-gpu publishes them with its
``DynamicMIG`` feature gate (partitionable devices). A MIG-capable GPU gets one counter set,
``gpu-<minor>-counter-set``, holding the most of each capacity any one profile offers and one
``memory-slice-<i>`` counter (worth 1) per memory slice. Every profile x placement is a device
(``gpu-0-mig-1g10gb-19-0``) that consumes its profile's capacities and the memory slices of its
placement; the whole GPU, ``gpu-<minor>``, consumes the entire set. The scheduler allocates a
set of devices only while their summed consumption fits the counter set, so two partitions
that share a memory slice, or a partition and the whole GPU, are never handed out together.

Which of them a GPU offers follows NVIDIA: a GPU that can switch MIG mode without a reset
(Hopper on) offers the whole GPU and every partition whatever its MIG mode; one that cannot
(Ampere) offers the partitions while MIG is on and only the whole GPU, as without DynamicMIG,
while MIG is off. A GPU that is not MIG-capable is the whole GPU only, with no counter set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpu_operator.agent.dra.devices import (
    ARCHITECTURES,
    DeviceRef,
    Partition,
    gpu_device,
    gpu_name,
    mig_attributes,
    mig_capacity,
    mig_device_name,
    quantities,
)
from gpu_operator.agent.inventory import Gpu, Inventory, MigProfile, Placement

# The first architecture whose MIG mode changes without a GPU reset. ARCHITECTURES lists them
# oldest first; one it does not know is newer than all of them.
RESET_FREE_MIG_FROM = "hopper"


def counter_name(capacity: str) -> str:
    """``copyEngines`` -> ``copy-engines``: a counter is its capacity's name in DNS form."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", capacity).lower()


def memory_slice_counter(index: int) -> str:
    """``memory-slice-<index>``, the counter of one memory slice (zero-based)."""
    return f"memory-slice-{index}"


def counter_set_name(gpu: Gpu) -> str:
    """``gpu-<minor>-counter-set``: the one counter set of a GPU, which its devices consume."""
    return f"gpu-{gpu.minor_number}-counter-set"


def switches_mig_without_reset(gpu: Gpu) -> bool:
    """Whether ``gpu``'s MIG mode can change while the node runs (Hopper and later)."""
    order = list(ARCHITECTURES)
    if gpu.architecture not in order:
        return True
    return order.index(gpu.architecture) >= order.index(RESET_FREE_MIG_FROM)


def offers_partitions(gpu: Gpu) -> bool:
    """Whether ``gpu`` is offered as MIG partitions: MIG-capable, with placements, and MIG on
    or switchable on demand."""
    has_placements = any(p.placements for p in gpu.mig_profiles)
    return (
        gpu.mig_capable and has_placements and (gpu.mig_current or switches_mig_without_reset(gpu))
    )


def offers_whole_gpu(gpu: Gpu) -> bool:
    """Whether ``gpu`` is offered whole: always, except partitioned and stuck in MIG mode."""
    return not offers_partitions(gpu) or switches_mig_without_reset(gpu)


def profile_capacity(profile: MigProfile) -> dict[str, int]:
    """What one partition of ``profile`` offers, by capacity name (memory in bytes)."""
    return mig_capacity(profile.sm_count, profile.engines, profile.memory_mib)


def gpu_capacity(gpu: Gpu) -> dict[str, int]:
    """The most of each capacity any one placeable profile of ``gpu`` offers: what partitions
    share. Empty for a GPU without MIG profiles."""
    capacities = [profile_capacity(p) for p in gpu.mig_profiles if p.placements]
    if not capacities:
        return {}
    return {name: max(c[name] for c in capacities) for name in capacities[0]}


def memory_slice_count(gpu: Gpu) -> int:
    """How many memory slices ``gpu`` has: the size of its largest placement."""
    return max((p.size for prof in gpu.mig_profiles for p in prof.placements), default=0)


def consumption(capacity: Mapping[str, int], placement: Placement) -> dict[str, int]:
    """The counters a device of ``capacity`` at ``placement`` takes: each capacity, and 1 of
    every memory slice the placement covers."""
    counters = {counter_name(name): value for name, value in capacity.items()}
    counters.update({memory_slice_counter(i): 1 for i in sorted(placement.slices)})
    return counters


def counters(gpu: Gpu) -> dict[str, int]:
    """The counter set's values: every shared capacity at its most, and each memory slice 1.
    What the whole GPU consumes, too."""
    return consumption(gpu_capacity(gpu), Placement(0, memory_slice_count(gpu)))


def counter_set(gpu: Gpu) -> dict[str, Any] | None:
    """``gpu``'s ``resource.k8s.io/v1`` CounterSet, or None when it is offered whole only."""
    if not offers_partitions(gpu):
        return None
    return {"name": counter_set_name(gpu), "counters": quantities(counters(gpu))}


def _consumes(gpu: Gpu, values: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"counterSet": counter_set_name(gpu), "counters": quantities(values)}]


def partition_device(
    gpu: Gpu, profile: MigProfile, placement: Placement, inventory: Inventory
) -> dict[str, Any]:
    """The device for a ``profile`` partition of ``gpu`` at ``placement``, existing or not."""
    capacity = profile_capacity(profile)
    return {
        "name": mig_device_name(gpu.minor_number, profile.name, profile.id, placement.start),
        "attributes": mig_attributes(gpu, profile.name, inventory),
        "capacity": quantities(capacity),
        "consumesCounters": _consumes(gpu, consumption(capacity, placement)),
    }


def whole_gpu_device(gpu: Gpu, inventory: Inventory) -> dict[str, Any]:
    """``gpu-<minor>`` beside its partitions: the shared capacities, consuming every counter."""
    return {
        **gpu_device(gpu, inventory),
        "capacity": quantities(gpu_capacity(gpu)),
        "consumesCounters": _consumes(gpu, counters(gpu)),
    }


def partition_devices(gpu: Gpu, inventory: Inventory) -> list[dict[str, Any]]:
    """Every device ``gpu`` offers under DynamicMIG, sorted by name as NVIDIA publishes them:
    the whole GPU (where offered) and one device per profile x placement (where offered). A GPU
    offered whole only is the plain whole-GPU device, with no counters."""
    if not offers_partitions(gpu):
        return [gpu_device(gpu, inventory)]
    found = [
        partition_device(gpu, profile, placement, inventory)
        for profile in gpu.mig_profiles
        for placement in profile.placements
    ]
    if offers_whole_gpu(gpu):
        found.append(whole_gpu_device(gpu, inventory))
    return sorted(found, key=lambda d: str(d["name"]))


def pool(inventory: Inventory) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The node's devices and counter sets under DynamicMIG, GPUs by minor."""
    devices: list[dict[str, Any]] = []
    sets: list[dict[str, Any]] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor_number):
        devices.extend(partition_devices(gpu, inventory))
        found = counter_set(gpu)
        if found is not None:
            sets.append(found)
    return devices, sets


def refs_by_name(inventory: Inventory) -> dict[str, DeviceRef]:
    """What Prepare needs of each device :func:`pool` publishes: a whole GPU's UUID, or the
    partition to create (its UUID is known once it exists)."""
    refs: dict[str, DeviceRef] = {}
    for gpu in inventory.gpus:
        if offers_whole_gpu(gpu):
            refs[gpu_name(gpu)] = DeviceRef(gpu.uuid, gpu.minor_number)
        if not offers_partitions(gpu):
            continue
        for profile in gpu.mig_profiles:
            for placement in profile.placements:
                name = mig_device_name(gpu.minor_number, profile.name, profile.id, placement.start)
                partition = Partition(profile.name, profile.index, placement, profile.slice_count)
                refs[name] = DeviceRef("", gpu.minor_number, parent=gpu.uuid, partition=partition)
    return refs
