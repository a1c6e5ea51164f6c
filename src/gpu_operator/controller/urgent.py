"""Which watch events a loop acts on at once, without letting a rollout's events settle.

The ClusterPolicy and NVIDIADriver loops both read them: a policy, an NVIDIADriver, a node or a
ConfigMap changing, or a pod whose driver upgrade waits for it. The thousands of pod and
DaemonSet events of a plain rollout only move status along, and settle into few passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_operator.api import KIND
from gpu_operator.controller.runtime.watch import ObjectKey, Watched
from gpu_operator.labels import UPGRADE_STATE
from gpu_operator.upgrade import IN_PROGRESS

# Changes acted on without waiting for a rollout's events to settle (pods and DaemonSet
# status only move status and upgrades along).
URGENT_KINDS = frozenset({KIND, "NVIDIADriver", "Node", "ConfigMap"})


def moves_an_upgrade(indexes: Mapping[str, Any], watched: Watched, key: ObjectKey) -> bool:
    """A pod on a node whose driver upgrade is under way: its next step waits for this change
    (a driver pod gone or Ready, a validator passing), so it is acted on at once, while the
    thousands of pod events of a plain rollout settle into few passes."""
    if watched.kind.kind != "Pod":
        return False
    pod = (indexes.get("pods") or {}).get(key) or {}
    node_name = (pod.get("spec") or {}).get("nodeName")
    node = (indexes.get("nodes") or {}).get(("", node_name)) if node_name else None
    return node is not None and node.labels.get(UPGRADE_STATE, "") in IN_PROGRESS
