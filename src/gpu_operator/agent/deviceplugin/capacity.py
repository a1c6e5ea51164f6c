"""Simulated capacity: a kwok node's ``nvidia.com/*`` capacity and allocatable, from the same
:func:`advertised_resources` the device plugin tells a real kubelet.

kwok plays the kubelet of simulated nodes, so no device plugin can register there; without this
no pod asking for ``nvidia.com/gpu`` is ever scheduled on a simulated cluster. This is how
schedulers (Kueue, Volcano, KAI) are tested without GPUs. It writes the Node's status
subresource, which kwok keeps: its node stages copy an existing capacity and allocatable at
initialisation and its heartbeat patches only conditions and addresses. Only kwok nodes
(annotation ``kwok.x-k8s.io/node=fake``) are ever written: on a real node the kubelet owns
these fields, and the command refuses to start there.

Allocatable is what a kubelet makes it: the capacity less the devices the plugin reports
Unhealthy. With the GPU health monitor on, every device on a GPU it finds unhealthy (the GPU,
its replicas, its MIG devices) leaves allocatable, so the scheduler places nothing there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING, Any

from gpu_operator.agent import nodeapi
from gpu_operator.agent.deviceplugin.resources import DeviceMap
from gpu_operator.labels import KWOK_NODE, KWOK_NODE_FAKE
from gpu_operator.views import NodeView

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

RESOURCE_PREFIX = "nvidia.com/"


class NotSimulatedError(ValueError):
    """The node is not a kwok node; its capacity belongs to its kubelet."""


def is_kwok_node(node: NodeView) -> bool:
    return node.annotations.get(KWOK_NODE) == KWOK_NODE_FAKE


Counts = Mapping[str, int]  # resource name -> devices
NodeHook = Callable[[NodeView, Mapping[str, Mapping[str, Any]]], None]


def counts(devices: DeviceMap, unhealthy_gpus: Set[str] = frozenset()) -> dict[str, int]:
    """Resource -> devices not on an unhealthy GPU (all of them: the capacity)."""
    return {
        name: sum(1 for d in found if d.gpu_uuid not in unhealthy_gpus)
        for name, found in devices.items()
    }


def capacity_patch(
    node: NodeView, advertised: Counts, allocatable: Counts | None = None
) -> dict[str, Any] | None:
    """The status merge patch that makes the node's ``nvidia.com/*`` capacity exactly
    ``advertised`` and its allocatable ``allocatable`` (default: the same; resources no longer
    advertised are removed); None: nothing to do. Other resources (cpu, memory, ...) are left
    as they are."""
    status: dict[str, Any] = {}
    for field, current, target in (
        ("capacity", node.capacity, advertised),
        ("allocatable", node.allocatable, advertised if allocatable is None else allocatable),
    ):
        wanted = {name: str(count) for name, count in target.items()}
        ours = {k: v for k, v in current.items() if k.startswith(RESOURCE_PREFIX)}
        if ours == wanted:
            continue
        changes: dict[str, str | None] = {k: None for k in ours if k not in wanted}
        changes.update({k: v for k, v in wanted.items() if ours.get(k) != v})
        status[field] = changes
    return {"status": status} if status else None


def set_capacity(
    api: Kube, node: NodeView, advertised: Counts, allocatable: Counts | None = None
) -> bool:
    """Write ``advertised`` (and ``allocatable``) to a kwok node's status; returns whether
    anything changed."""
    if not is_kwok_node(node):
        raise NotSimulatedError(
            f"node {node.name} is not a kwok node (annotation {KWOK_NODE}={KWOK_NODE_FAKE}): "
            "its kubelet owns its capacity; run the device plugin there without --kwok-capacity"
        )
    patch = capacity_patch(node, advertised, allocatable)
    if patch is None:
        return False
    api.merge_patch("Node", node.name, patch, subresource="status")
    summary = ", ".join(f"{n}: {c}" for n, c in sorted(advertised.items())) or "nothing"
    if allocatable is not None and allocatable != advertised:
        summary += " (allocatable " + ", ".join(f"{n}: {c}" for n, c in allocatable.items()) + ")"
    log.info("SIMULATED capacity of node %s: %s", node.name, summary)
    return True


def follow(
    api: Kube,
    node: str,
    advertised: Callable[[NodeView], tuple[Counts, Counts]],
    stop: threading.Event,
    *,
    resync_s: int = 30,
    retry_s: float = 5.0,
    on_node: NodeHook | None = None,
) -> int:
    """Keep the node's capacity and allocatable equal to ``advertised(node)`` until ``stop``:
    recomputed on every change of the Node (its config label, the MIG state label) and every
    ``resync_s`` (a MIG layout applied by another process). ``on_node`` sees every read of the
    Node (and its conditions by type). Returns the exit code."""
    while not stop.is_set():
        try:
            view, conditions = nodeapi.read_node_conditions(api, node)
        except Exception as exc:  # API hiccups: log, back off, retry
            log.warning("reading node %s failed: %s", node, exc)
            stop.wait(retry_s)
            continue
        if on_node is not None:
            on_node(view, conditions)
        try:
            capacity, allocatable = advertised(view)
        except (ValueError, OSError) as exc:  # a config this inventory cannot take: say why
            log.error("capacity of node %s unchanged: %s", node, exc)
        else:
            try:
                if set_capacity(api, view, capacity, allocatable):
                    continue  # our own write changed the Node: read it again at once
            except NotSimulatedError as exc:
                log.error("%s", exc)
                return 2
            except Exception as exc:
                log.warning("writing the capacity of node %s failed: %s", node, exc)
                stop.wait(retry_s)
                continue
        if not nodeapi.wait_for_node_change(api, node, view.resource_version, resync_s):
            stop.wait(retry_s)
    return 0
