"""A node's ResourceSlice pool: what it should be, and the fewest writes that make it so.

Pure. One pool per node, named after the node, in as few slices as the API allows (128 devices
each). When the devices change (a MIG reconfiguration), every slice of the pool is rewritten
with the pool generation bumped, so the scheduler never mixes devices of two generations; when
they have not changed, nothing is written. Slices are owned by their Node, so they go with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.dra.devices import DRIVER

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
MANAGED_BY = "gpu-operator"


def slice_name(node: str, index: int) -> str:
    return f"{node}-{DRIVER}-{index}"


def field_selector(node: str) -> str:
    """The API server's field selector for this driver's slices of ``node``."""
    return f"spec.nodeName={node},spec.driver={DRIVER}"


def _chunks(items: Sequence[dict[str, Any]], size: int) -> list[Sequence[dict[str, Any]]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def desired_slices(
    node: str,
    devices: Sequence[dict[str, Any]],
    generation: int,
    owner: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The pool's slices at ``generation``; ``owner`` is the Node's name and uid, when known."""
    chunks = _chunks(devices, MAX_DEVICES_PER_SLICE)
    slices = []
    for i, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {
            "name": slice_name(node, i),
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
        }
        if owner:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"]}
            ]
        slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": {
                        "name": node,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "devices": [dict(d) for d in chunk],
                },
            }
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
    )


def published_devices(existing: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    ordered = sorted(existing, key=lambda s: str(s["metadata"]["name"]))
    return [_device_key(d) for s in ordered for d in (s["spec"].get("devices") or [])]


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
) -> SlicePlan:
    """The writes that turn ``existing`` (this driver's slices of ``node``) into the pool of
    ``devices``: none when it already publishes exactly them."""
    current = generation_of(existing)
    names = {str(s["metadata"]["name"]) for s in existing}
    same_devices = published_devices(existing) == [_device_key(d) for d in devices]
    wanted = desired_slices(node, devices, current, owner)
    consistent = (
        names == {s["metadata"]["name"] for s in wanted}
        and len({int(s["spec"]["pool"].get("generation", 0)) for s in existing}) <= 1
        and all(s["spec"]["pool"].get("resourceSliceCount") == len(wanted) for s in existing)
    )
    if existing and same_devices and consistent:
        return SlicePlan(apply=(), delete=(), generation=current)
    generation = current + 1
    wanted = desired_slices(node, devices, generation, owner)
    keep = {s["metadata"]["name"] for s in wanted}
    return SlicePlan(
        apply=tuple(wanted),
        delete=tuple(sorted(names - keep)),
        generation=generation,
    )
