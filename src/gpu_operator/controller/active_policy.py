"""Which ClusterPolicy acts when there are several: the oldest. Every loop asks: the
ClusterPolicy loop acts on it alone, the NVIDIADriver loop follows its driver section, and the
GPUCluster loop keeps its device plugin's nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def active_policy(policies: Sequence[Mapping[str, Any]]) -> str | None:
    """The oldest ClusterPolicy (creationTimestamp, then name) is the one that acts."""
    live = [p for p in policies if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return None
    oldest = min(
        live,
        key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"].get("name", "")),
    )
    name: str = oldest["metadata"]["name"]
    return name
