"""Whether an operand is ready, from its observed DaemonSets (and, for OnDelete, their pods)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.labels import COMPONENT, REVISION_HASH
from gpu_operator.views import newest_revision_hash, owner_uids, pod_ready


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
) -> DaemonSetReadiness:
    """Rolling DaemonSets count the controller's numbers; OnDelete ones check each pod.

    An OnDelete DaemonSet's status says nothing about pods still on an old template, so its
    pods must all carry the newest revision hash and be Ready.
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
        for uid in owner_uids(obj, "DaemonSet"):
            grouped.setdefault(uid, []).append(obj)
    return grouped


def component_readiness(
    component: str,
    daemonsets: Iterable[Mapping[str, Any]],
    pods_by_owner: Mapping[str, Sequence[Mapping[str, Any]]],
    revisions_by_owner: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[DaemonSetReadiness]:
    """Readiness of each of ``component``'s DaemonSets (one "not created yet" when none)."""
    result = [
        daemonset_readiness(
            ds,
            pods_by_owner.get(ds["metadata"].get("uid", ""), ()),
            revisions_by_owner.get(ds["metadata"].get("uid", ""), ()),
        )
        for ds in daemonsets
        if (ds["metadata"].get("labels") or {}).get(COMPONENT) == component
    ]
    return result or [DaemonSetReadiness(component, False, 0, 0, 0, "DaemonSet not created yet")]
