"""A node's ResourceSlice pool: what it should be, and the fewest writes that make it so.

Pure. One pool per node, named after the node, in as few slices as the API allows (128 devices
each). When the devices change (a MIG reconfiguration), every slice of the pool is rewritten
with the pool generation bumped, so the scheduler never mixes devices of two generations; when
they have not changed, nothing is written. Slices are owned by their Node, so they go with it.

Under DynamicMIG the pool also carries counter sets, laid out as NVIDIA's DRA driver lays them
out for the API server it talks to: Kubernetes 1.34 wants a device's counter set in the device's
own slice (one slice per GPU: its devices and its counter set); 1.35 and later want counter sets
apart (one slice holding every counter set, then one slice per GPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.dra.devices import DRIVER

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
MANAGED_BY = "gpu-operator"


def slice_name(node: str, index: int, driver: str = DRIVER) -> str:
    return f"{node}-{driver}-{index}"


def field_selector(node: str, driver: str = DRIVER) -> str:
    """The API server's field selector for ``driver``'s slices of ``node`` (the GPUs' by
    default; every function here takes the driver, so one publisher serves each plugin)."""
    return f"spec.nodeName={node},spec.driver={driver}"


Content = tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]  # devices, counter sets


def _chunks(items: Sequence[dict[str, Any]], size: int) -> list[Sequence[dict[str, Any]]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def _counter_set_of(device: Mapping[str, Any]) -> str | None:
    consumed = device.get("consumesCounters") or []
    return str(consumed[0]["counterSet"]) if consumed else None


CHUNKS = "chunks"  # devices only, as many to a slice as the API allows
COMBINED = "combined"  # one slice per GPU, with its counter set (Kubernetes 1.34)
SPLIT = "split"  # a slice of every counter set, then one slice per GPU (1.35 and later)


def dynamic_layout(version: tuple[int, int]) -> str:
    """The DynamicMIG layout an API server of ``(major, minor)`` accepts."""
    return SPLIT if version >= (1, 35) else COMBINED


def layout(
    devices: Sequence[dict[str, Any]],
    counter_sets: Sequence[dict[str, Any]] = (),
    shape: str = CHUNKS,
) -> list[Content]:
    """What each slice of the pool holds, as ``shape`` says (:data:`CHUNKS`, :data:`COMBINED`
    or :data:`SPLIT`). Per GPU, a device that consumes no counters is a GPU of its own."""
    if shape == CHUNKS:
        return [(chunk, ()) for chunk in _chunks(devices, MAX_DEVICES_PER_SLICE)]
    groups: dict[str, list[dict[str, Any]]] = {}
    for device in devices:
        groups.setdefault(_counter_set_of(device) or str(device["name"]), []).append(device)
    if shape == SPLIT:  # the counter sets' slice only where there are some; never no slice
        head: list[Content] = [((), tuple(counter_sets))] if counter_sets else []
        return [*head, *((tuple(g), ()) for g in groups.values())] or [((), ())]
    by_name = {str(c["name"]): c for c in counter_sets}
    return [(tuple(g), (by_name[k],) if k in by_name else ()) for k, g in groups.items()]


def desired_slices(
    node: str,
    devices: Sequence[dict[str, Any]],
    generation: int,
    owner: Mapping[str, str] | None = None,
    counter_sets: Sequence[dict[str, Any]] = (),
    shape: str = CHUNKS,
    driver: str = DRIVER,
) -> list[dict[str, Any]]:
    """The pool's slices at ``generation``; ``owner`` is the Node's name and uid, when known;
    ``counter_sets`` and ``shape`` as :func:`layout` takes them."""
    chunks = layout(devices, counter_sets, shape)
    slices = []
    for i, (chunk, sets) in enumerate(chunks):
        metadata: dict[str, Any] = {
            "name": slice_name(node, i, driver),
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
        }
        if owner:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"]}
            ]
        spec: dict[str, Any] = {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
        }
        if chunk or not sets:  # a slice of counter sets only has no devices field
            spec["devices"] = [dict(d) for d in chunk]
        if sets:
            spec["sharedCounters"] = [dict(c) for c in sets]
        slices.append(
            {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}
        )
    return slices


def _device_key(device: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a device publishes, ignoring fields the API server may add (a taint's
    ``timeAdded``)."""
    capacity = {k: (v or {}).get("value") for k, v in (device.get("capacity") or {}).items()}
    taints = sorted(
        (t.get("key"), t.get("value") or "", t.get("effect")) for t in device.get("taints") or ()
    )
    return (
        device.get("name"),
        sorted((k, sorted(v.items())) for k, v in (device.get("attributes") or {}).items()),
        sorted(capacity.items()),
        taints,
        [_counters_key(c) for c in device.get("consumesCounters") or ()],
    )


def _counters_key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    """A counter set, or a device's consumption of one: its name and values."""
    name = entry.get("name") or entry.get("counterSet")
    values = {k: (v or {}).get("value") for k, v in (entry.get("counters") or {}).items()}
    return (name, sorted(values.items()))


def published_devices(existing: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """What the slices publish, slice by slice: their devices and counter sets."""
    ordered = sorted(existing, key=lambda s: str(s["metadata"]["name"]))
    return [
        (
            [_device_key(d) for d in s["spec"].get("devices") or []],
            [_counters_key(c) for c in s["spec"].get("sharedCounters") or []],
        )
        for s in ordered
    ]


def generation_of(existing: Sequence[Mapping[str, Any]]) -> int:
    return max((int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0)


@dataclass(frozen=True)
class SlicePlan:
    apply: tuple[dict[str, Any], ...]
    delete: tuple[str, ...]
    generation: int

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete)


def plan(
    node: str,
    existing: Sequence[Mapping[str, Any]],
    devices: Sequence[dict[str, Any]],
    owner: Mapping[str, str] | None = None,
    counter_sets: Sequence[dict[str, Any]] = (),
    shape: str = CHUNKS,
    driver: str = DRIVER,
) -> SlicePlan:
    """The writes that turn ``existing`` (this driver's slices of ``node``) into the pool of
    ``devices`` (and ``counter_sets``, laid out as :func:`layout`): none when it already
    publishes exactly them."""
    current = generation_of(existing)
    names = {str(s["metadata"]["name"]) for s in existing}
    wanted = desired_slices(node, devices, current, owner, counter_sets, shape, driver)
    same_devices = published_devices(existing) == published_devices(wanted)
    consistent = (
        names == {s["metadata"]["name"] for s in wanted}
        and len({int(s["spec"]["pool"].get("generation", 0)) for s in existing}) <= 1
        and all(s["spec"]["pool"].get("resourceSliceCount") == len(wanted) for s in existing)
    )
    if existing and same_devices and consistent:
        return SlicePlan(apply=(), delete=(), generation=current)
    generation = current + 1
    wanted = desired_slices(node, devices, generation, owner, counter_sets, shape, driver)
    keep = {s["metadata"]["name"] for s in wanted}
    return SlicePlan(
        apply=tuple(wanted),
        delete=tuple(sorted(names - keep)),
        generation=generation,
    )
