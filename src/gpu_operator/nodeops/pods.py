"""A pod as the planners read it: its node, owner, readiness, phase and what removing it would
lose. Shared by the driver upgrade (driver, validator and workload pods) and the GPU health
remediation (the pods it drains and the driver pods it restarts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.labels import REVISION_HASH
from gpu_operator.views import parse_time, pod_ready

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"


@dataclass(frozen=True, slots=True)  # one per driver and validator pod, remembered (views.derived)
class Pod:
    """One pod, read from its object by :meth:`from_k8s`; plain data, compared by value."""

    name: str
    namespace: str = "default"
    node: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: str = ""  # DaemonSet name for DaemonSet pods, else "Kind/name", "" for bare pods
    revision_hash: str = ""
    ready: bool = True
    phase: str = "Running"
    restart_count: int = 0
    # requests an NVIDIA device: nvidia.com/gpu, a MIG slice, a renamed shared GPU, or a GPU
    # or vGPU for a VM (nvidia.com/<PCI device name>)
    uses_gpu: bool = False
    is_daemonset_pod: bool = False
    deleting: bool = False  # deletionTimestamp set: on its way out, do not ask again
    created: float = 0.0
    ready_since: float = 0.0  # when the Ready condition last changed; 0.0 when unknown
    uses_empty_dir: bool = False  # losing the pod loses this data: evicted only when allowed
    waiting: str = ""  # why a container waits (ImagePullBackOff, CrashLoopBackOff), if one does

    @property
    def running(self) -> bool:
        """Still holds its node (and its GPUs): not yet Succeeded or Failed."""
        return self.phase not in TERMINAL_PHASES

    @classmethod
    def from_k8s(cls, pod: Mapping[str, Any]) -> Pod:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        labels: Mapping[str, str] = meta.get("labels") or {}  # shared, never changed
        owner, is_ds = "", False
        for ref in meta.get("ownerReferences") or ():
            if ref.get("controller", True):
                is_ds = ref.get("kind") == "DaemonSet"
                owner = ref.get("name", "") if is_ds else f"{ref.get('kind')}/{ref.get('name')}"
                break
        statuses = [
            *(status.get("containerStatuses") or ()),
            *(status.get("initContainerStatuses") or ()),
        ]
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", "default"),
            node=spec.get("nodeName") or _affinity_node(spec),
            labels=labels,
            owner=owner,
            revision_hash=labels.get(REVISION_HASH, ""),
            ready=pod_ready(pod),
            phase=status.get("phase", "Pending"),
            restart_count=max((int(s.get("restartCount", 0)) for s in statuses), default=0),
            uses_gpu=_uses_gpu(spec),
            is_daemonset_pod=is_ds,
            deleting=bool(meta.get("deletionTimestamp")),
            created=parse_time(meta.get("creationTimestamp")),
            ready_since=max(
                (
                    parse_time(c.get("lastTransitionTime"))
                    for c in status.get("conditions") or ()
                    if c.get("type") == "Ready"
                ),
                default=0.0,
            ),
            uses_empty_dir=any("emptyDir" in v for v in spec.get("volumes") or ()),
            waiting=next(
                (
                    str(reason)
                    for c in statuses
                    if (reason := ((c.get("state") or {}).get("waiting") or {}).get("reason"))
                ),
                "",
            ),
        )


def _affinity_node(spec: Mapping[str, Any]) -> str:
    """The node a DaemonSet pod is pinned to before it is scheduled (it has no nodeName yet,
    which is exactly when an unschedulable new driver pod must still count for its node)."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or ():
        for expr in term.get("matchFields") or ():
            values = expr.get("values") or ()
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In" and values:
                return str(values[0])
    return ""


def _uses_gpu(spec: Mapping[str, Any]) -> bool:
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            for name, quantity in (resources.get(section) or {}).items():
                device = name.startswith(NVIDIA_RESOURCE_PREFIX)
                if device and str(quantity).strip() not in ("0", ""):
                    return True
    return False
