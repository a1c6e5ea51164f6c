"""Kubernetes Events about cluster-scoped objects (a ClusterPolicy, a Node), built as data.

The operator and the MIG manager both record them, so one builder keeps them alike. They go to
the "default" namespace: `kubectl describe` searches every namespace for events about a
cluster-scoped object, and "default" is where the kube components put theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

EVENT_NAMESPACE = "default"
MAX_MESSAGE = 1024


def now_iso() -> str:
    """Now as the API server writes times (RFC 3339, seconds, UTC)."""
    return iso_time(datetime.now(UTC).timestamp())


def iso_time(seconds: float) -> str:
    """Unix seconds as the API server writes times."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    about: Mapping[str, Any],
    etype: str,
    reason: str,
    message: str,
    *,
    component: str,
    instance: str,
    stamp: str,
) -> dict[str, Any]:
    """A core/v1 Event about ``about`` (an object with apiVersion, kind and metadata).

    ``etype`` is Normal or Warning; ``stamp`` an RFC 3339 time; ``instance`` the pod or host
    that saw it.
    """
    meta = about["metadata"]
    involved = {"apiVersion": about["apiVersion"], "kind": about["kind"], "name": meta["name"]}
    if about["kind"] == "Node":
        # The kubelet's convention, which `kubectl describe node` searches for.
        involved["uid"] = meta["name"]
    elif meta.get("uid"):
        involved["uid"] = meta["uid"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": involved,
        "type": etype,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": instance,
    }
