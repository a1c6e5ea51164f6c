"""Which NVIDIADriver drives which GPU node (pure).

Each NVIDIADriver selects GPU nodes by its ``nodeSelector`` (empty: every GPU node); a
``default: true`` NVIDIADriver takes the GPU nodes no other one selects. A node selected by two
NVIDIADrivers joins neither (both report it), and one already in either stays there until the
overlap is fixed; a GPU node selected by none is reported too.

The decision reaches the nodes as one label, ``nvidia.com/gpu.driver-pool``: the driver's name,
or ``""`` for a GPU node that no driver may take (conflict, or selected by none). Every driver
DaemonSet selects on that label, so a node's pool changes by one label write, and the DaemonSet
controller moves the driver pod. A node that runs the ClusterPolicy's own driver, or another
pool's, is handed over a few at a time (``handover``): its pool label is written only while
fewer than that many handed-over nodes wait for their new driver pod to be Ready, so no node
is driverless for longer than one driver restart, as in an upgrade step. Without the flag the
ClusterPolicy's driver takes the nodes back the same way (``hand_back``): a pool label is
removed only while fewer than that many nodes wait for its pod to be Ready, and the
NVIDIADrivers' DaemonSets go once no node is left in a pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.controller.readiness import daemonset_pod_spec, should_run
from gpu_operator.labels import COMPONENT
from gpu_operator.node_labels import is_gpu_node
from gpu_operator.render.driver import POOL_LABEL
from gpu_operator.upgrade.fleet import DRIVER_COMPONENTS
from gpu_operator.views import NodeView, daemonset_owners, pod_ready


@dataclass(frozen=True)
class DriverSelector:
    """What pool assignment needs of one NVIDIADriver."""

    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    default: bool = False
    handover: int = 1  # nodes handed over from the ClusterPolicy's driver at once

    def selects(self, node: NodeView) -> bool:
        return all(node.labels.get(k) == v for k, v in self.node_selector.items())


@dataclass(frozen=True)
class Assignment:
    pool_of: Mapping[str, str]  # node -> driver name (where the node should end up)
    conflicts: Mapping[str, tuple[str, ...]]  # node -> the drivers that all select it
    unselected: tuple[str, ...]  # GPU nodes no driver selects
    label_patches: Mapping[str, str | None]  # node -> new pool label value (None: remove)
    waiting: tuple[str, ...] = ()  # nodes whose handover waits for room

    def nodes_of(self, driver: str) -> tuple[str, ...]:
        return tuple(sorted(n for n, d in self.pool_of.items() if d == driver))

    def conflicts_of(self, driver: str) -> tuple[str, ...]:
        return tuple(sorted(n for n, ds in self.conflicts.items() if driver in ds))


def assign(
    gpu_nodes: Sequence[NodeView],
    drivers: Sequence[DriverSelector],
    *,
    legacy_driver_nodes: Iterable[str] = (),
    new_driver_ready: Iterable[str] = (),
    pools_with_driver: Iterable[str] = (),
) -> Assignment:
    """Pools, conflicts and the label writes that move nodes towards them.

    ``legacy_driver_nodes``: nodes the ClusterPolicy's driver runs on
    (:func:`legacy_driver_nodes`), which must be handed over gradually; ``new_driver_ready``:
    nodes whose own pool's driver pod is Ready (:func:`pool_driver_ready`);
    ``pools_with_driver``: pools whose driver DaemonSet is there (:func:`pools_with_driver`):
    their nodes too move to another pool gradually.
    """
    explicit = [d for d in drivers if not d.default]
    defaults = sorted((d for d in drivers if d.default), key=lambda d: d.name)
    pool_of: dict[str, str] = {}
    conflicts: dict[str, tuple[str, ...]] = {}
    unselected: list[str] = []
    for node in sorted(gpu_nodes, key=lambda n: n.name):
        chosen = tuple(sorted(d.name for d in explicit if d.selects(node)))
        if not chosen and defaults:
            chosen = tuple(d.name for d in defaults)
        if len(chosen) == 1:
            pool_of[node.name] = chosen[0]
        elif chosen:
            conflicts[node.name] = chosen
        else:
            unselected.append(node.name)

    legacy = set(legacy_driver_nodes)
    ready = set(new_driver_ready)
    running = set(pools_with_driver)
    handover = {d.name: max(1, d.handover) for d in drivers}
    # Nodes already handed over whose new driver is not Ready yet hold a handover slot.
    busy: dict[str, int] = {}
    for node in gpu_nodes:
        current = node.labels.get(POOL_LABEL)
        if current and node.name not in ready:
            busy[current] = busy.get(current, 0) + 1
    patches: dict[str, str | None] = {}
    waiting: list[str] = []
    for node in sorted(gpu_nodes, key=lambda n: n.name):
        want = pool_of.get(node.name, "")
        current = node.labels.get(POOL_LABEL)
        if current == want:
            continue
        if current and current in conflicts.get(node.name, ()):
            continue  # an overlap that came later: it keeps its driver while both report it
        # A node with a driver (the ClusterPolicy's, or its pool's) waits its turn; one whose
        # pool has none (its NVIDIADriver deleted) gains nothing by waiting.
        if want and ((node.name in legacy and not current) or current in running):
            if busy.get(want, 0) >= handover.get(want, 1):
                waiting.append(node.name)
                continue
            busy[want] = busy.get(want, 0) + 1
        patches[node.name] = want
    return Assignment(pool_of, conflicts, tuple(unselected), patches, tuple(waiting))


def driver_pod_nodes(
    daemonsets: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], owner_kind: str
) -> set[str]:
    """Nodes running a pod of a driver DaemonSet owned by ``owner_kind`` (ClusterPolicy: the
    legacy driver to hand over; NVIDIADriver: the pools' drivers)."""
    uids = {d["metadata"]["uid"] for d in _driver_daemonsets(daemonsets, owner_kind)}
    return {
        str((p.get("spec") or {}).get("nodeName"))
        for p in pods
        if any(u in uids for u in daemonset_owners(p))
    }


def pool_driver_ready(
    nodes: Iterable[NodeView],
    daemonsets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> set[str]:
    """Nodes whose own pool's driver pod is Ready: not another pool's, still there for a moment
    after the node left it (that one would let the next node move too soon)."""
    pool_of = _pool_of(daemonsets)
    if not pool_of:
        return set()
    ready: set[tuple[str, str]] = set()
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp") or not pod_ready(pod):
            continue
        node = str((pod.get("spec") or {}).get("nodeName"))
        ready.update((node, pool_of[u]) for u in daemonset_owners(pod) if u in pool_of)
    return {n.name for n in nodes if (n.name, n.labels.get(POOL_LABEL)) in ready}


def seen_in_pools(
    nodes: Iterable[NodeView],
    daemonsets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> list[NodeView]:
    """``nodes``, each one that the node watch shows in no pool but where a pool's live driver
    pod runs given that pool's label: the label was written first, and the node watch (paced
    at a second) can trail the pod watch. Read as unpooled, such a node would be moved at
    once, or its pool's DaemonSet pruned under it."""
    on = _pools_on(daemonsets, pods)
    return [
        replace(n, labels={**n.labels, POOL_LABEL: on[n.name]})
        if POOL_LABEL not in n.labels and n.name in on
        else n
        for n in nodes
    ]


def pools_with_driver(daemonsets: Iterable[Mapping[str, Any]]) -> set[str]:
    """The NVIDIADrivers whose driver DaemonSet is there: their nodes run their driver (or are
    about to: the pod watch may not show it yet)."""
    return set(_pool_of(daemonsets).values())


def _pools_on(
    daemonsets: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> dict[str, str]:
    """Node -> the pool whose live (not deleting) driver pod runs there."""
    pool_of = _pool_of(daemonsets)
    on: dict[str, str] = {}
    if not pool_of:  # (no pod is looked at then)
        return on
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for uid in daemonset_owners(pod):
            if uid in pool_of:
                on[str((pod.get("spec") or {}).get("nodeName"))] = pool_of[uid]
    return on


def _pool_of(daemonsets: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Driver DaemonSet uid -> the NVIDIADriver (pool) that owns it."""
    return {
        ds["metadata"]["uid"]: str(ref.get("name") or "")
        for ds in _driver_daemonsets(daemonsets, "NVIDIADriver")
        for ref in ds["metadata"].get("ownerReferences") or ()
        if ref.get("kind") == "NVIDIADriver"
    }


def legacy_driver_nodes(
    nodes: Iterable[NodeView],
    daemonsets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> set[str]:
    """Nodes the ClusterPolicy's driver runs on, or will: those its pods are seen on, and the
    GPU nodes its DaemonSet selects. The pods alone would not do: the pod watch can trail the
    DaemonSet's, and right after its pods start a pass that does not see them yet would hand
    every node over at once (and prune the DaemonSet), leaving them all without a driver."""
    legacy = _driver_daemonsets(daemonsets, "ClusterPolicy")
    if not legacy:  # (none once handed over: no pod or node is looked at then)
        return set()
    on = driver_pod_nodes(legacy, pods, "ClusterPolicy")
    specs = [daemonset_pod_spec(d) for d in legacy]
    on.update(n.name for n in nodes if is_gpu_node(n) and any(should_run(s, n) for s in specs))
    return on


def handover_pending(
    nodes: Iterable[NodeView],
    daemonsets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> bool:
    """Some node without a pool still runs (or is to run) the ClusterPolicy's driver: keep it."""
    nodes = tuple(nodes)
    legacy = legacy_driver_nodes(nodes, daemonsets, pods)
    return any(n.name in legacy and POOL_LABEL not in n.labels for n in nodes)


@dataclass(frozen=True)
class HandBack:
    """Without the flag: the pool labels to remove now, and the nodes a pool's driver may
    still be on (the pools' DaemonSets go once there are none: ``released``)."""

    label_patches: Mapping[str, None]
    in_pools: tuple[str, ...] = ()
    released: bool = True


def hand_back(
    nodes: Sequence[NodeView],
    daemonsets: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    slots: int,
) -> HandBack:
    """The ClusterPolicy's driver takes pooled nodes back ``slots`` at a time.

    A node in a pool runs that pool's driver until its label goes; then the ClusterPolicy's
    driver starts there. A label goes while fewer than ``slots`` nodes its DaemonSet selects
    wait for its pod to be Ready, and not before that DaemonSet exists (it keeps off pooled
    nodes: :func:`handback_pending`). A node in no pool (``""``), or no longer a GPU node, runs
    no pool's driver: its label goes at once. The watches may trail the writes (a node's new
    label, a pool's pods): a node where a pool's pod is seen counts as in a pool, and a node that
    looks unpooled but has no Ready driver of the ClusterPolicy's takes a slot.
    """
    pooled = sorted((n for n in nodes if POOL_LABEL in n.labels), key=lambda n: n.name)
    patches: dict[str, None] = {}
    held: list[NodeView] = []
    for node in pooled:
        if node.labels[POOL_LABEL] and is_gpu_node(node):
            held.append(node)
        else:
            patches[node.name] = None
    pools = _driver_daemonsets(daemonsets, "NVIDIADriver")
    in_pools = tuple(sorted({n.name for n in held} | set(_pools_on(pools, pods))))
    released = not in_pools and not any(_schedules(d) for d in pools)
    legacy = _driver_daemonsets(daemonsets, "ClusterPolicy")
    if not held or not legacy:
        return HandBack(patches, in_pools, released)
    specs = [daemonset_pod_spec(d) for d in legacy]
    ready = driver_pod_nodes(legacy, [p for p in pods if pod_ready(p)], "ClusterPolicy")
    busy = sum(
        1
        for n in nodes
        if POOL_LABEL not in n.labels
        and n.name not in ready
        and is_gpu_node(n)
        and any(should_run(s, n) for s in specs)
    )
    for node in held[: max(0, slots - busy)]:
        patches[node.name] = None
    return HandBack(patches, in_pools, released)


def handback_pending(nodes: Iterable[NodeView], daemonsets: Sequence[Mapping[str, Any]]) -> bool:
    """Without the flag, whether the ClusterPolicy's driver keeps off pooled nodes. Its
    DaemonSet's template is left as it is: a changed one would mark every driver pod out of
    date, a fleet-wide upgrade that changes nothing (so a DaemonSet made during a handback
    keeps off pools for good, and a stray pool label never adds the term). A new DaemonSet
    keeps off pools while some node is in one or some pool's DaemonSet is there (the node
    watch may not show a label written a moment ago)."""
    legacy = _driver_daemonsets(daemonsets, "ClusterPolicy")
    if legacy:
        return any(_keeps_off_pools(d) for d in legacy)
    return any(n.labels.get(POOL_LABEL) for n in nodes) or bool(
        _driver_daemonsets(daemonsets, "NVIDIADriver")
    )


def _schedules(ds: Mapping[str, Any]) -> bool:
    """A DaemonSet whose controller counts nodes it runs on, or should."""
    status = ds.get("status") or {}
    return any(
        int(status.get(k) or 0) for k in ("currentNumberScheduled", "desiredNumberScheduled")
    )


def _keeps_off_pools(ds: Mapping[str, Any]) -> bool:
    affinity = (daemonset_pod_spec(ds).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return any(
        e.get("key") == POOL_LABEL and e.get("operator") == "DoesNotExist"
        for term in required.get("nodeSelectorTerms") or ()
        for e in term.get("matchExpressions") or ()
    )


def _driver_daemonsets(
    daemonsets: Iterable[Mapping[str, Any]], owner_kind: str
) -> list[Mapping[str, Any]]:
    return [
        d
        for d in daemonsets
        if (d["metadata"].get("labels") or {}).get(COMPONENT) in DRIVER_COMPONENTS
        and any(r.get("kind") == owner_kind for r in d["metadata"].get("ownerReferences") or ())
    ]


def label_patch(value: str | None) -> dict[str, object]:
    """The node merge patch that sets (or removes) the pool label."""
    return {"metadata": {"labels": {POOL_LABEL: value}}}


def written_pool(patch: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether a node patch writes the pool label (:func:`label_patch`), and the value."""
    labels = (patch.get("metadata") or {}).get("labels") or {}
    return (POOL_LABEL in labels, labels.get(POOL_LABEL))


def with_written(nodes: Iterable[NodeView], written: Mapping[str, str | None]) -> list[NodeView]:
    """``nodes`` with the pool labels this operator wrote (None: removed) where the node watch
    does not show them yet: the next pass must not read a node it just moved as unmoved (it
    would move another, or prune the pool under it)."""
    out = []
    for node in nodes:
        if node.name in written and node.labels.get(POOL_LABEL) != written[node.name]:
            labels = {k: v for k, v in node.labels.items() if k != POOL_LABEL}
            value = written[node.name]
            if value is not None:
                labels[POOL_LABEL] = value
            node = replace(node, labels=labels)
        out.append(node)
    return out
