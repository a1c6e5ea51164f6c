"""What the operator watches, and what it keeps of each object.

The informer (:mod:`~gpu_operator.controller.informer`) lists and watches every kind below into
an in-memory store, trimmed to what decisions read (so a large fleet's stores stay small, and an
event that changes nothing kept is dropped before any work), and the loop runs only once all of
them are filled, so the first pass never acts on half a picture (a missing node OS would
otherwise prune a live driver DaemonSet). Deciding what a change means is the loop's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.api import API_VERSION, KIND
from gpu_operator.controller.plan import Observed
from gpu_operator.kinds import KINDS, Kind
from gpu_operator.labels import APPLIED_HASH, MANAGED_BY, MANAGED_SELECTOR, OPERATOR_NAME
from gpu_operator.render import config_hash, mps_configured
from gpu_operator.views import NodeView

ObjectKey = tuple[str, str]  # namespace ("" when cluster-scoped), name


@dataclass(frozen=True)
class Watched:
    kind: Kind
    selector: str | None = None  # server-side label selector
    wakes: bool = True  # a change wakes the loop (revisions only matter with their pods)

    @property
    def index(self) -> str:
        return self.kind.plural


WATCHED: tuple[Watched, ...] = (
    Watched(KINDS[KIND]),
    Watched(KINDS["Node"]),
    Watched(KINDS["ConfigMap"]),  # user configs too: their edits roll operand pods
    Watched(KINDS["DaemonSet"], MANAGED_SELECTOR),
    Watched(KINDS["ControllerRevision"], MANAGED_SELECTOR, wakes=False),
    Watched(KINDS["Pod"], MANAGED_SELECTOR),
    Watched(KINDS["Service"], MANAGED_SELECTOR),
    Watched(KINDS["ServiceAccount"], MANAGED_SELECTOR),
    Watched(KINDS["Role"], MANAGED_SELECTOR),
    Watched(KINDS["RoleBinding"], MANAGED_SELECTOR),
    Watched(KINDS["ClusterRole"], MANAGED_SELECTOR),
    Watched(KINDS["ClusterRoleBinding"], MANAGED_SELECTOR),
    Watched(KINDS["RuntimeClass"], MANAGED_SELECTOR),
)
INDEXES = frozenset(w.index for w in WATCHED)

# Not resourceVersion: it changes with every write, so a kept value would never compare equal.
_KEEP_META = ("name", "namespace", "uid", "labels", "ownerReferences", "generation",
              "deletionTimestamp", "creationTimestamp")  # fmt: skip


def index_value(plural: str, body: Mapping[str, Any]) -> Any:
    """What an index keeps of an object: Nodes as :class:`NodeView`, others trimmed."""
    return NodeView.from_k8s(body) if plural == "nodes" else trim(plural, body)


def trim(plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Only what the operator reads, so the indexes of a large fleet stay small.

    ControllerRevisions carry a whole pod template and pods their full spec; neither is needed.
    ConfigMaps are kept as a content hash (edits to referenced ones roll operand pods).
    """
    if plural in ("clusterpolicies", "daemonsets"):
        return dict(body.items())
    meta = body.get("metadata") or {}
    kept: dict[str, Any] = {"metadata": {k: meta[k] for k in _KEEP_META if k in meta}}
    hash_ = (meta.get("annotations") or {}).get(APPLIED_HASH)
    if hash_:
        kept["metadata"]["annotations"] = {APPLIED_HASH: hash_}
    if plural == "pods":
        kept.update(_trim_pod(body))
    elif plural == "controllerrevisions":
        kept["revision"] = body.get("revision")
    elif plural == "configmaps":
        kept["hash"] = config_hash(body)
        if mps_configured(body.get("data") or {}):
            kept["mps"] = True  # a device-plugin config sharing with MPS: its control daemon
    return kept


def _trim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as decisions read it: where it runs, and whether it is Ready (thousands are kept:
    every dict left out here is memory saved per pod)."""
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    kept_spec: dict[str, Any] = {"nodeName": spec.get("nodeName")}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity and not spec.get("nodeName"):  # an unscheduled DaemonSet pod names its
        kept_spec["affinity"] = {"nodeAffinity": node_affinity}  # node only here
    return {
        "spec": kept_spec,
        "status": {
            "phase": status.get("phase"),
            "conditions": [
                {"type": "Ready", "status": c.get("status")}
                | {"lastTransitionTime": c.get("lastTransitionTime")}
                for c in status.get("conditions") or ()
                if c.get("type") == "Ready"
            ],
            "containerStatuses": [
                {"restartCount": c.get("restartCount", 0), "ready": c.get("ready")}
                for c in status.get("containerStatuses") or ()
            ],
            "initContainerStatuses": [
                {"restartCount": c.get("restartCount", 0)}
                for c in status.get("initContainerStatuses") or ()
            ],
        },
    }


def owned_children(objects_by_kind: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[Observed]:
    """The objects the operator created for a ClusterPolicy: labelled managed-by it AND owned
    by a ClusterPolicy (managed-by alone is not ours to delete: Helm sets it too)."""
    seen = []
    for kind, objects in objects_by_kind.items():
        for obj in objects:
            meta = obj.get("metadata") or {}
            if (meta.get("labels") or {}).get(MANAGED_BY) != OPERATOR_NAME:
                continue
            refs = meta.get("ownerReferences") or ()
            if any(r.get("kind") == KIND and r.get("apiVersion") == API_VERSION for r in refs):
                seen.append(Observed.from_k8s(obj, kind))
    return seen
