"""The node agents' node-side API helpers: their Node, the pods on it, Events about it.

Requests go through :mod:`gpu_operator.kube`, the project's one door to the API server; this
module only turns what comes back into plain data (:class:`NodeView`, :class:`PodView`), so the
decisions made from it stay pure and testable without a cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_operator.events import event_body, now_iso
from gpu_operator.usage import UsageProblem
from gpu_operator.views import NodeView, string_map

if TYPE_CHECKING:  # the client is imported on first use: agents printing labels stay small
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

__all__ = [
    "NodeView",
    "PodView",
    "connect",
    "patch_node_condition",
    "patch_node_metadata",
    "pods_on_node",
    "read_node",
    "read_node_conditions",
    "record_node_event",
    "wait_for_node_change",
]


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    phase: str = ""


def connect(kubeconfig: str | None = None, context: str | None = None) -> Kube:
    """The in-cluster (or kubeconfig) door to the API server."""
    from gpu_operator import kube

    return kube.connect(kubeconfig, context)


class NodeNotFound(UsageProblem, LookupError):
    """The agent's node is not in the cluster: almost always a wrong NODE_NAME (usage, exit 2)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"node {name} not found", "is NODE_NAME (--node-name) right?")


def read_node(api: Kube, name: str) -> NodeView:
    node = api.get("Node", name)
    if node is None:
        raise NodeNotFound(name)
    return NodeView.from_k8s(node)


def read_node_conditions(api: Kube, name: str) -> tuple[NodeView, dict[str, dict[str, Any]]]:
    """The Node and its ``status.conditions`` by type, from one read."""
    node = api.get("Node", name)
    if node is None:
        raise NodeNotFound(name)
    conditions = (node.get("status") or {}).get("conditions") or ()
    by_type = {str(c.get("type")): dict(c) for c in conditions if isinstance(c, dict)}
    return NodeView.from_k8s(node), by_type


def patch_node_condition(api: Kube, name: str, entry: Mapping[str, Any]) -> None:
    """Write one ``status.conditions`` entry: a strategic merge patch merges it by type, so
    the kubelet's (or kwok's) conditions and other writers' stay as they are."""
    api.strategic_patch(
        "Node", name, {"status": {"conditions": [dict(entry)]}}, subresource="status"
    )


def patch_node_metadata(
    api: Kube,
    name: str,
    *,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> None:
    """One JSON merge patch of labels and annotations; ``None`` removes a key."""
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if metadata:
        api.merge_patch("Node", name, {"metadata": metadata})


def record_node_event(
    api: Kube, node_name: str, etype: str, reason: str, message: str, *, component: str
) -> None:
    """Best effort: an Event that cannot be written is logged, never fatal."""
    body = event_body(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}},
        etype,
        reason,
        message,
        component=component,
        instance=node_name,
        stamp=now_iso(),
    )
    try:
        api.create(body)
    except Exception as exc:
        log.warning("could not record event %s on node %s: %s", reason, node_name, exc)


def pods_on_node(api: Kube, node_name: str, namespace: str) -> list[PodView]:
    """The pods of ``namespace`` on the node: the operands live in one namespace, so the
    agent's Role there suffices (no cluster-wide pod list)."""
    pods = api.list_objects("Pod", namespace, field_selector=f"spec.nodeName={node_name}")
    return [
        PodView(
            name=str(pod["metadata"].get("name") or ""),
            namespace=str(pod["metadata"].get("namespace") or ""),
            labels=string_map(pod["metadata"].get("labels")),
            phase=str((pod.get("status") or {}).get("phase") or ""),
        )
        for pod in pods
    ]


def wait_for_node_change(api: Kube, name: str, resource_version: str, timeout_s: int) -> bool:
    """Block until the Node changes after ``resource_version`` or ``timeout_s`` passes.

    Returns False when watching failed (the caller then backs off and polls).
    """
    try:
        api.wait_for_change("Node", name, resource_version, timeout_s)
    except Exception as exc:
        log.debug("watching node %s failed: %s", name, exc)
        return False
    return True
