"""Plain, immutable views of the Kubernetes objects that several layers reason about.

The controller, the upgrade planner and the node agents all decide things from Nodes and pods;
they share these views (and the few readings of pod and revision status) instead of each
parsing raw objects its own way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar, cast

from gpu_operator.labels import GPU_HEALTHY_CONDITION, REVISION_HASH

T = TypeVar("T")


def string_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def shared(value: Any) -> Any:
    """``value`` interned when it is a string.

    The indexes keep thousands of nodes and pods whose labels repeat the same few dozen keys
    and values; each parsed event brings its own copies, which interning folds into one (a
    quarter of the memory kept per GPU node). Only label-like strings are interned: a bounded
    vocabulary, not names, uids or timestamps.
    """
    return sys.intern(value) if isinstance(value, str) else value


def shared_map(value: Any, *, values: bool = True) -> dict[str, str]:
    """A string map with its keys (and, with ``values``, its values) interned: :func:`shared`."""
    return {
        sys.intern(str(k)): sys.intern(str(v)) if values else str(v)
        for k, v in (value or {}).items()
    }


_TREES: dict[Any, Any] = {}
MAX_SHARED_TREES = 20_000  # distinct label maps and statuses; a bound, not a working size


def shared_tree(value: T) -> T:
    """One object for all equal copies of ``value`` (a JSON-like map or list, never changed
    once kept): the pods of one DaemonSet carry the same labels, owner reference and container
    statuses, a few hundred bytes each per pod that all but one copy need not hold."""
    key = _frozen(value)
    kept = _TREES.get(key)
    if kept is None:
        if len(_TREES) >= MAX_SHARED_TREES:
            _TREES.clear()  # churn (revisions come and go): start again
        kept = _TREES[key] = value
    return cast(T, kept)


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list):
        return (list, tuple(_frozen(v) for v in value))
    return (type(value), value)  # True and 1 are equal, but not the same value


@dataclass(frozen=True)
class GpuHealth:
    """The Node's ``GPUHealthy`` condition, whoever wrote it (our agent, a problem detector)."""

    status: str  # "True", "False" or "Unknown"
    reason: str = ""
    message: str = ""
    since: float = 0.0  # lastTransitionTime, unix seconds; 0.0 when absent

    @property
    def healthy(self) -> bool:
        return self.status == "True"

    @property
    def unhealthy(self) -> bool:
        return self.status == "False"

    @classmethod
    def from_conditions(cls, conditions: Iterable[Mapping[str, Any]]) -> GpuHealth | None:
        for c in conditions:
            if c.get("type") == GPU_HEALTHY_CONDITION:
                return cls(
                    str(c.get("status") or "Unknown"),
                    str(c.get("reason") or ""),
                    str(c.get("message") or ""),
                    parse_time(c.get("lastTransitionTime")),
                )
        return None


@dataclass(frozen=True)
class NodeView:
    """What the project reads of a Node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, Any], ...] = ()
    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    # Not compared: two views of a node are equal when everything read of it is.
    resource_version: str = field(default="", compare=False)
    container_runtime: str = ""  # status.nodeInfo.containerRuntimeVersion, e.g. containerd://1.7
    ready: bool = True
    unschedulable: bool = False
    gpu_health: GpuHealth | None = None
    # What passes derive from this view, remembered on it (:func:`derived`): a view is never
    # changed, and a pass asks the same of every node (is it a GPU node?) again and again.
    _derived: dict[Callable[..., Any], Any] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def from_k8s(cls, node: Mapping[str, Any]) -> NodeView:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        return cls(
            name=meta.get("name", ""),
            labels=shared_map(meta.get("labels")),
            annotations=shared_map(meta.get("annotations"), values=False),
            taints=tuple(spec.get("taints") or ()),
            capacity=shared_map(status.get("capacity")),
            allocatable=shared_map(status.get("allocatable")),
            resource_version=str(meta.get("resourceVersion") or ""),
            container_runtime=(status.get("nodeInfo") or {}).get("containerRuntimeVersion", ""),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or ()
            ),
            unschedulable=bool(spec.get("unschedulable")),
            gpu_health=GpuHealth.from_conditions(status.get("conditions") or ()),
        )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, with its Ready condition True."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def newest_revision_hash(revisions: Iterable[Mapping[str, Any]]) -> str | None:
    """The ``controller-revision-hash`` of the highest ControllerRevision, if any."""
    newest = max(revisions, key=lambda r: int(r.get("revision", 0)), default=None)
    if newest is None:
        return None
    value = ((newest.get("metadata") or {}).get("labels") or {}).get(REVISION_HASH)
    return str(value) if value is not None else None


def owner_uids(obj: Mapping[str, Any], kind: str | None = None) -> tuple[str, ...]:
    """The uids in ``obj``'s ownerReferences (only those of ``kind`` when given)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return tuple(r.get("uid", "") for r in refs if kind is None or r.get("kind") == kind)


class Kept(dict[str, Any]):
    """What the operator's index keeps of one object. A kept object is never changed (a change
    stores a new one), so what passes derive from it is derived once and remembered on it
    (:func:`derived`), instead of again by every pass over thousands of pods."""

    __slots__ = ("_derived",)
    _derived: dict[Callable[..., Any], Any]


S = TypeVar("S")


def derived(obj: S, fn: Callable[[S], T]) -> T:
    """``fn(obj)``, remembered on ``obj`` when it is :class:`Kept` or a :class:`NodeView`
    (``fn`` must be pure)."""
    if isinstance(obj, Kept):
        try:
            memo = obj._derived
        except AttributeError:
            memo = obj._derived = {}
    elif isinstance(obj, NodeView):
        memo = obj._derived
    else:
        return fn(obj)
    if fn not in memo:
        memo[fn] = fn(obj)
    return cast(T, memo[fn])


def _daemonset_owner_uids(obj: Mapping[str, Any]) -> tuple[str, ...]:
    return owner_uids(obj, "DaemonSet")


def daemonset_owners(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The uids of the DaemonSets that own ``obj`` (:func:`derived` once per kept object)."""
    return derived(obj, _daemonset_owner_uids)


def parse_time(value: str | None) -> float:
    """RFC 3339 (``2024-05-01T10:00:00Z``) to unix seconds; 0.0 when absent or unreadable."""
    if not value:
        return 0.0
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
