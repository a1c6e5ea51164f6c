"""Whether an operand is ready, from its observed DaemonSet (and, for OnDelete, its pods)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

REVISION_HASH = "controller-revision-hash"


@dataclass(frozen=True)
class DaemonSetReadiness:
    name: str
    ready: bool
    desired: int
    available: int
    updated: int
    message: str | None = None


def newest_revision_hash(revisions: Iterable[Mapping[str, Any]]) -> str | None:
    """The ``controller-revision-hash`` of the highest ControllerRevision, if any."""
    newest = max(revisions, key=lambda r: int(r.get("revision", 0)), default=None)
    if newest is None:
        return None
    labels = (newest.get("metadata") or {}).get("labels") or {}
    value = labels.get(REVISION_HASH)
    return str(value) if value is not None else None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


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
