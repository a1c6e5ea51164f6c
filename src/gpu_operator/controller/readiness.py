"""Whether an operand is ready, from its observed DaemonSets (and, for OnDelete, their pods).

A DaemonSet's own numbers can say 0 of 0 ready before its controller has seen the nodes the
operator just labelled, so readiness also counts the nodes its pods should run on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.labels import COMPONENT, REVISION_HASH
from gpu_operator.selector import Requirement
from gpu_operator.views import NodeView, daemonset_owners, newest_revision_hash, pod_ready

# Taints the DaemonSet controller tolerates for every DaemonSet pod (it adds the tolerations).
DAEMON_TOLERATED = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/network-unavailable",
    }
)
_AFFINITY_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}


@dataclass(frozen=True)
class DaemonSetReadiness:
    name: str
    ready: bool
    desired: int
    available: int
    updated: int
    message: str | None = None


def daemonset_readiness(
    ds: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]] = (),
    revisions: Iterable[Mapping[str, Any]] = (),
    eligible: int = 0,
) -> DaemonSetReadiness:
    """Rolling DaemonSets count the controller's numbers; OnDelete ones check each pod.

    An OnDelete DaemonSet's status says nothing about pods still on an old template, so its
    pods must all carry the newest revision hash and be Ready. ``eligible``: the nodes its pods
    should run on; fewer desired pods means its controller has not caught up with the labels.
    """
    meta = ds.get("metadata") or {}
    spec = ds.get("spec") or {}
    status = ds.get("status") or {}
    name = meta.get("name", "")
    desired = int(status.get("desiredNumberScheduled", 0))
    ready_n = int(status.get("numberReady", 0))
    available = int(status.get("numberAvailable", 0))
    updated = int(status.get("updatedNumberScheduled", 0))
    if int(status.get("observedGeneration", 0)) < int(meta.get("generation", 0)):
        return DaemonSetReadiness(
            name, False, desired, available, updated, "rollout not observed yet"
        )
    if desired < eligible:
        short = f"{desired}/{eligible} labelled nodes scheduled"
        return DaemonSetReadiness(name, False, desired, available, updated, short)
    if (spec.get("updateStrategy") or {}).get("type") == "OnDelete":
        newest = newest_revision_hash(revisions)
        pods = list(pods)
        current = [
            p
            for p in pods
            if ((p.get("metadata") or {}).get("labels") or {}).get(REVISION_HASH) == newest
        ]
        updated = len(current)
        ready_current = sum(1 for p in current if pod_ready(p))
        ok = (desired == 0 and not pods) or (
            newest is not None and ready_current == desired == len(pods)
        )
        msg = None if ok else f"{ready_current}/{desired} pods ready on the newest revision"
        return DaemonSetReadiness(name, ok, desired, ready_current, updated, msg)
    ok = ready_n == desired and updated == desired and available == desired
    msg = None if ok else f"{ready_n}/{desired} ready, {updated}/{desired} updated"
    return DaemonSetReadiness(name, ok, desired, available, updated, msg)


def by_owner(objects: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Objects grouped by the uid of each DaemonSet that owns them."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        for uid in daemonset_owners(obj):
            grouped.setdefault(uid, []).append(obj)
    return grouped


def component_readiness(
    component: str,
    daemonsets: Iterable[Mapping[str, Any]],
    pods_by_owner: Mapping[str, Sequence[Mapping[str, Any]]],
    revisions_by_owner: Mapping[str, Sequence[Mapping[str, Any]]],
    nodes: Sequence[NodeView] | NodeKinds = (),
) -> list[DaemonSetReadiness]:
    """Readiness of each of ``component``'s DaemonSets (one "not created yet" when none),
    each expected to have a pod on every one of ``nodes`` it should run on."""
    mine = [
        ds for ds in daemonsets if (ds["metadata"].get("labels") or {}).get(COMPONENT) == component
    ]
    kinds = (
        nodes if isinstance(nodes, NodeKinds) else NodeKinds(nodes, map(daemonset_pod_spec, mine))
    )
    result = [
        daemonset_readiness(
            ds,
            pods_by_owner.get(ds["metadata"].get("uid", ""), ()),
            revisions_by_owner.get(ds["metadata"].get("uid", ""), ()),
            eligible=kinds.eligible(daemonset_pod_spec(ds)),
        )
        for ds in mine
    ]
    return result or [DaemonSetReadiness(component, False, 0, 0, 0, "DaemonSet not created yet")]


class NodeKinds:
    """Nodes grouped by what :func:`should_run` reads of them for a set of pod specs (the
    values of the labels they select on, the NoSchedule/NoExecute taints), so that each
    question is asked once per kind of node rather than once per node: a fleet's nodes come in
    a few kinds, and every pass asks it for every operand. Built once per pass for all of them.
    """

    def __init__(self, nodes: Iterable[NodeView], pod_specs: Iterable[Mapping[str, Any]]) -> None:
        self._nodes = nodes if isinstance(nodes, Sequence) else tuple(nodes)
        self._keys = tuple(sorted({k for spec in pod_specs for k in _selected_keys(spec)}))
        counts: dict[tuple[Any, ...], list[Any]] = {}
        for node in self._nodes:
            kind = (tuple(node.labels.get(k) for k in self._keys), _hard_taints(node))
            entry = counts.get(kind)
            if entry is None:
                counts[kind] = [node, 1]
            else:
                entry[1] += 1
        self._kinds: tuple[tuple[NodeView, int], ...] = tuple((n, c) for n, c in counts.values())

    def eligible(self, pod_spec: Mapping[str, Any]) -> int:
        """How many of the nodes :func:`should_run` a pod of ``pod_spec``."""
        if not set(_selected_keys(pod_spec)) <= set(self._keys):
            return NodeKinds(self._nodes, [pod_spec]).eligible(pod_spec)  # not grouped for it
        return sum(count for node, count in self._kinds if should_run(pod_spec, node))


def eligible_nodes(pod_spec: Mapping[str, Any], nodes: Iterable[NodeView]) -> int:
    """How many of ``nodes`` :func:`should_run` a pod of ``pod_spec`` (:class:`NodeKinds`)."""
    return NodeKinds(nodes, [pod_spec]).eligible(pod_spec)


def _hard_taints(node: NodeView) -> tuple[tuple[Any, Any, Any], ...]:
    return tuple(
        (t.get("key"), t.get("value"), t.get("effect"))
        for t in node.taints
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )


def _selected_keys(pod_spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The node labels :func:`should_run` reads for ``pod_spec``."""
    keys = list(pod_spec.get("nodeSelector") or {})
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or ():
        keys += [e.get("key", "") for e in term.get("matchExpressions") or ()]
    return tuple(keys)


def should_run(pod_spec: Mapping[str, Any], node: NodeView) -> bool:
    """Whether the DaemonSet controller wants a pod of ``pod_spec`` on ``node``: its
    nodeSelector, required node affinity and the node's NoSchedule/NoExecute taints."""
    selector = pod_spec.get("nodeSelector") or {}
    if any(node.labels.get(key) != value for key, value in selector.items()):
        return False
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms")
    if terms and not any(_term_matches(term, node.labels) for term in terms):
        return False
    tolerations = pod_spec.get("tolerations") or ()
    return all(
        _tolerated(taint, tolerations)
        for taint in node.taints
        if taint.get("effect") in ("NoSchedule", "NoExecute")
        and taint.get("key") not in DAEMON_TOLERATED
    )


def daemonset_pod_spec(ds: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template's spec of DaemonSet ``ds`` (empty when it has none)."""
    spec: Mapping[str, Any] = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    return spec


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One nodeSelectorTerm: every expression holds (an empty term matches nothing)."""
    expressions = term.get("matchExpressions") or ()
    if not expressions:
        return bool(term.get("matchFields"))  # by node name: not narrowed here
    for expr in expressions:
        key, op = expr.get("key", ""), expr.get("operator", "")
        values: list[str] = list(expr.get("values") or ())
        if op in ("Gt", "Lt"):
            try:
                number, bound = int(labels[key]), int(values[0])
            except (KeyError, IndexError, ValueError):
                return False
            if not (number > bound if op == "Gt" else number < bound):
                return False
        elif not Requirement(key, _AFFINITY_OPS.get(op, op), frozenset(values)).matches(labels):
            return False
    return True


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator", "Equal") == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False
