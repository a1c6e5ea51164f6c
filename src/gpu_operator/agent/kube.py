"""The agents' only Kubernetes I/O: read and merge-patch their Node, list its pods, watch it,
record Events about it.

Everything returned is plain data (:class:`NodeView`, :class:`PodView`), so the decisions made
from it stay pure and testable without a cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.events import event_body, now_iso

log = logging.getLogger(__name__)

FIELD_MANAGER = "gpu-operator"
EVENT_COMPONENT = "nvidia-mig-manager"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    phase: str = ""


def _get(obj: Any, *names: str) -> Any:
    """Attribute of a client model or key of a dict (camelCase or snake_case)."""
    for name in names:
        if obj is None:
            return None
        value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def core_api() -> Any:
    """A CoreV1Api from the in-cluster service account, else from ~/.kube/config."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def read_node(core: Any, name: str) -> NodeView:
    node = core.read_node(name)
    meta = _get(node, "metadata")
    status = _get(node, "status")
    return NodeView(
        name=name,
        labels=_strings(_get(meta, "labels")),
        annotations=_strings(_get(meta, "annotations")),
        capacity=_strings(_get(status, "capacity")),
        allocatable=_strings(_get(status, "allocatable")),
        resource_version=str(_get(meta, "resource_version", "resourceVersion") or ""),
    )


def patch_node_metadata(
    core: Any,
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
    if not metadata:
        return
    core.patch_node(
        name, {"metadata": metadata}, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH
    )


def record_node_event(core: Any, node_name: str, etype: str, reason: str, message: str) -> None:
    """Best effort: an Event that cannot be written is logged, never fatal."""
    body = event_body(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}},
        etype,
        reason,
        message,
        component=EVENT_COMPONENT,
        instance=node_name,
        stamp=now_iso(),
    )
    try:
        core.create_namespaced_event(body["metadata"]["namespace"], body)
    except Exception as exc:
        log.warning("could not record event %s on node %s: %s", reason, node_name, exc)


def pods_on_node(core: Any, node_name: str, namespace: str) -> list[PodView]:
    """The pods of ``namespace`` on the node: the operands live in one namespace, so the
    agent's Role there suffices (no cluster-wide pod list)."""
    result = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node_name}")
    pods = []
    for pod in _get(result, "items") or []:
        meta = _get(pod, "metadata")
        pods.append(
            PodView(
                name=str(_get(meta, "name") or ""),
                namespace=str(_get(meta, "namespace") or ""),
                labels=_strings(_get(meta, "labels")),
                phase=str(_get(_get(pod, "status"), "phase") or ""),
            )
        )
    return pods


def wait_for_node_change(core: Any, name: str, resource_version: str, timeout_s: int) -> bool:
    """Block until the Node changes after ``resource_version`` or ``timeout_s`` passes.

    Returns False when watching failed (the caller then simply polls).
    """
    from kubernetes import watch as kube_watch

    watch: Any = kube_watch
    watcher = watch.Watch()
    kwargs: dict[str, Any] = {
        "field_selector": f"metadata.name={name}",
        "timeout_seconds": timeout_s,
    }
    if resource_version:
        kwargs["resource_version"] = resource_version
    try:
        for _event in watcher.stream(core.list_node, **kwargs):
            return True
    except Exception as exc:  # the caller falls back to polling
        log.debug("watching node %s failed: %s", name, exc)
        return False
    finally:
        watcher.stop()
    return True
