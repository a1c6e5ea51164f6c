"""Builders for controller tests: nodes, pods, policies, DaemonSets and snapshots in a line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_operator.api import API_VERSION, KIND
from gpu_operator.controller.clusterpolicy.decide import FINALIZER
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.labels import (
    COMPONENT,
    MANAGED_BY,
    NFD_GPU_LABELS,
    OPERATOR_NAME,
    OS_ID,
    OS_VERSION,
    REVISION_HASH,
    UPGRADE_STATE,
    VALIDATOR_APP,
)
from gpu_operator.views import NodeView

NOW = 1_800_000_000.0
STAMP = "2027-01-15T08:00:00Z"
LATER = "2027-01-15T09:00:00Z"
NAMESPACE = "gpu-operator"
CONFIG = OperatorConfig(namespace=NAMESPACE, identity="test-host", debounce_seconds=0.0)
NFD_GPU = NFD_GPU_LABELS[0]
NFD_CPU = "feature.node.kubernetes.io/cpu-model.vendor_id"


def gpu_node(
    name: str = "gpu-1",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    os: tuple[str, str] | None = ("ubuntu", "22.04"),
    runtime: str = "containerd://1.7.27",
    taints: Iterable[dict[str, Any]] = (),
    upgrade_state: str | None = None,
    unschedulable: bool = False,
    ready: bool = True,
    resource_version: str = "1",
) -> NodeView:
    """A node NFD found an NVIDIA GPU on."""
    all_labels = {NFD_GPU: "true", **(labels or {})}
    if os is not None:
        all_labels |= {OS_ID: os[0], OS_VERSION: os[1]}
    if upgrade_state is not None:
        all_labels[UPGRADE_STATE] = upgrade_state
    return NodeView(
        name,
        labels=all_labels,
        annotations=dict(annotations or {}),
        taints=tuple(taints),
        container_runtime=runtime,
        resource_version=resource_version,
        ready=ready,
        unschedulable=unschedulable,
    )


def cpu_node(name: str = "cpu-1", *, labels: Mapping[str, str] | None = None) -> NodeView:
    """A node NFD looked at and found no GPU on."""
    return NodeView(name, labels={NFD_CPU: "GenuineIntel", **(labels or {})})


def node_object(view: NodeView) -> dict[str, Any]:
    """The Node a view was read from (for the fake API server)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": view.name,
            "labels": dict(view.labels),
            "annotations": dict(view.annotations),
        },
        "spec": {"taints": list(view.taints), "unschedulable": view.unschedulable},
        "status": {
            "nodeInfo": {"containerRuntimeVersion": view.container_runtime},
            "conditions": [{"type": "Ready", "status": "True" if view.ready else "False"}],
            "capacity": dict(view.capacity),
        },
    }


def policy(
    name: str = "cluster-policy",
    *,
    spec: Mapping[str, Any] | None = None,
    finalizers: Iterable[str] = (FINALIZER,),
    status: Mapping[str, Any] | None = None,
    created: str = "2027-01-01T00:00:00Z",
    deleting: bool = False,
    generation: int = 1,
    resource_version: str = "10",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{name}",
        "generation": generation,
        "resourceVersion": resource_version,
        "creationTimestamp": created,
        "finalizers": list(finalizers),
    }
    if deleting:
        meta["deletionTimestamp"] = STAMP
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "spec": dict(spec or {}),
    }
    if status is not None:
        body["status"] = dict(status)
    return body


def owner(uid: str, kind: str = "DaemonSet") -> dict[str, Any]:
    """A controller reference; builders name objects ``uid-<name>``, so the name follows."""
    name = uid.removeprefix("uid-")
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def daemonset(
    name: str,
    component: str,
    *,
    desired: int = 1,
    ready: int | None = None,
    updated: int | None = None,
    generation: int = 1,
    observed: int | None = None,
    on_delete: bool = False,
) -> dict[str, Any]:
    """A DaemonSet as its controller reports it (all ``desired`` pods ready unless told)."""
    ready = desired if ready is None else ready
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "generation": generation,
            "labels": {COMPONENT: component, MANAGED_BY: OPERATOR_NAME},
        },
        "spec": {"updateStrategy": {"type": "OnDelete" if on_delete else "RollingUpdate"}},
        "status": {
            "observedGeneration": generation if observed is None else observed,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "numberAvailable": ready,
            "updatedNumberScheduled": desired if updated is None else updated,
        },
    }


def pod(
    name: str,
    *,
    owner_uid: str | None = None,
    node: str = "gpu-1",
    ready: bool = True,
    revision: str | None = None,
    labels: Mapping[str, str] | None = None,
    namespace: str = NAMESPACE,
    gpus: int = 0,
) -> dict[str, Any]:
    all_labels = dict(labels or {})
    if revision is not None:
        all_labels[REVISION_HASH] = revision
    container: dict[str, Any] = {"name": "c"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": all_labels,
            "ownerReferences": [owner(owner_uid)] if owner_uid else [],
            "creationTimestamp": "2027-01-01T00:00:00Z",
        },
        "spec": {"nodeName": node, "containers": [container]},
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastTransitionTime": "2027-01-01T00:00:00Z",
                }
            ],
        },
    }


def validator_pod(name: str = "validator-gpu-1", node: str = "gpu-1") -> dict[str, Any]:
    return pod(name, node=node, labels={"app": VALIDATOR_APP})


def revision(owner_uid: str, number: int, hash_: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": f"rev-{hash_}",
            "namespace": NAMESPACE,
            "labels": {REVISION_HASH: hash_},
            "ownerReferences": [owner(owner_uid)],
        },
        "revision": number,
    }


def snapshot(
    policies: Iterable[Mapping[str, Any]] = (),
    nodes: Iterable[NodeView] = (),
    **fields: Any,
) -> Snapshot:
    return Snapshot(now=NOW, stamp=STAMP, policies=tuple(policies), nodes=tuple(nodes), **fields)


def merge_form(body: Any, taints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A node patch as a merge patch: JSON patches (with the taint) are rewritten; ``taints``
    are the node's before the patch."""
    if isinstance(body, Mapping):
        return dict(body)
    meta: dict[str, dict[str, Any]] = {"labels": {}, "annotations": {}}
    new_taints = list(taints)
    touched = False
    for op in body:
        parts = [x.replace("~1", "/").replace("~0", "~") for x in op["path"].split("/")[1:]]
        if parts[0] == "metadata" and len(parts) == 2 and op["op"] == "add":
            meta[parts[1]].update(op["value"])
        elif parts[0] == "metadata" and op["op"] in ("add", "remove"):
            meta[parts[1]][parts[2]] = op.get("value") if op["op"] == "add" else None
        elif parts[0] == "spec" and op["op"] != "test":
            touched = True
            if len(parts) == 2:
                new_taints = list(op["value"])
            elif op["op"] == "remove":
                del new_taints[int(parts[2])]
            else:
                new_taints.append(op["value"])
    out: dict[str, Any] = {"metadata": {k: v for k, v in meta.items() if v}}
    if touched:
        out["spec"] = {"taints": new_taints}
    return out


def patched(node: NodeView, body: Any) -> NodeView:
    """``node`` after a merge patch (or a JSON patch) of its labels, annotations and taints."""
    body = merge_form(body, node.taints)
    meta = body.get("metadata") or {}

    def merged(current: Mapping[str, str], change: Mapping[str, str | None]) -> dict[str, str]:
        out = dict(current)
        for key, value in change.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    taints = (body.get("spec") or {}).get("taints")
    return NodeView(
        node.name,
        labels=merged(node.labels, meta.get("labels") or {}),
        annotations=merged(node.annotations, meta.get("annotations") or {}),
        taints=node.taints if taints is None else tuple(taints),
        capacity=node.capacity,
        container_runtime=node.container_runtime,
        resource_version=str(int(node.resource_version or 0) + 1),
        ready=node.ready,
        unschedulable=node.unschedulable,
    )
