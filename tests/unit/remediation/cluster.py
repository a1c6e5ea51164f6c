"""A few Nodes as dicts, the planner's JSON patches applied to them: enough cluster to run the
health planner pass after pass in a test."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_operator.labels import GPU_HEALTHY_CONDITION
from gpu_operator.nodeops.pods import Pod
from gpu_operator.remediation import HealthNode, Quarantine, Release, SetPhase
from gpu_operator.views import NodeView


def iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(
    name: str,
    *,
    healthy: bool | None = True,
    since: float = 0.0,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if healthy is not None:
        conditions.append(
            {
                "type": GPU_HEALTHY_CONDITION,
                "status": "True" if healthy else "False",
                "reason": "GPUsHealthy" if healthy else "GPUXid",
                "message": "" if healthy else "GPU 0 GPU-0: XID 79",
                "lastTransitionTime": iso(since),
            }
        )
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.present": "true", **(labels or {})},
            "annotations": dict(annotations or {}),
            "resourceVersion": "1",
        },
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {"conditions": conditions, "capacity": {"nvidia.com/gpu": "8"}},
    }
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    return _as_served(obj)


def _as_served(obj: dict[str, Any]) -> dict[str, Any]:
    """The API server leaves out empty maps and lists."""
    meta, spec = obj["metadata"], obj["spec"]
    for key in ("labels", "annotations"):
        if not meta.get(key):
            meta.pop(key, None)
    if not spec.get("taints"):
        spec.pop("taints", None)
    return obj


def set_health(obj: dict[str, Any], healthy: bool, since: float) -> None:
    for c in obj["status"]["conditions"]:
        if c["type"] == GPU_HEALTHY_CONDITION:
            status = "True" if healthy else "False"
            if c["status"] != status:
                c["status"], c["lastTransitionTime"] = status, iso(since)
            c["reason"] = "GPUsHealthy" if healthy else "GPUXid"


def health_nodes(objs: Sequence[Mapping[str, Any]], pods: Sequence[Pod] = ()) -> list[HealthNode]:
    return [
        HealthNode(
            NodeView.from_k8s(o),
            pods=tuple(p for p in pods if p.node == o["metadata"]["name"]),
            drivers=tuple(
                p for p in pods if p.node == o["metadata"]["name"] and p.is_daemonset_pod
            ),
        )
        for o in objs
    ]


def _unpointer(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def apply_json_patch(obj: dict[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/remove/test on the paths the planner uses; raises on a failed test, as
    the API server refuses the whole patch."""
    out = copy.deepcopy(obj)
    for op in ops:
        parts = [_unpointer(p) for p in str(op["path"]).split("/")[1:]]
        parent: Any = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] == "test":
            current = (
                parent[int(last)]
                if isinstance(parent, list) and last.isdigit()
                else parent.get(last)
                if isinstance(parent, dict)
                else None
            )
            if current != op["value"]:
                raise ValueError(f"test failed at {op['path']}: {current!r} != {op['value']!r}")
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise AssertionError(op)
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return _as_served(out)


def apply(objs: dict[str, dict[str, Any]], actions: Sequence[Any]) -> None:
    """Apply the plan's node writes in place (Events, evictions: ignored here)."""
    for action in actions:
        if isinstance(action, (Quarantine, SetPhase, Release)):
            name = action.node.name
            objs[name] = apply_json_patch(objs[name], action.patch())
