"""What the operator watches, and the kopf wiring that keeps it in memory.

kopf lists and watches every kind below into an in-memory index (trimmed to what decisions
read, so a large fleet's indexes stay small) and starts calling handlers only once all of them
are filled, so the first pass never acts on half a picture (a missing node OS would otherwise
prune a live driver DaemonSet). Event handlers only hand the change to a sink: deciding what it
means is the loop's business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as k8s

from gpu_operator.api import API_VERSION, KIND
from gpu_operator.controller.plan import Observed
from gpu_operator.kinds import KINDS, Kind
from gpu_operator.labels import APPLIED_HASH, MANAGED_BY, MANAGED_SELECTOR, OPERATOR_NAME
from gpu_operator.render import config_hash, mps_configured
from gpu_operator.views import NodeView


@dataclass(frozen=True)
class Watched:
    kind: Kind
    selector: str | None = None  # server-side label selector
    wakes: bool = True  # a change wakes the loop (revisions only matter with their pods)

    @property
    def index(self) -> str:
        return self.kind.plural

    @property
    def resource(self) -> tuple[str, str] | tuple[str, str, str]:
        k = self.kind
        return (k.group, k.version, k.plural) if k.group else (k.version, k.plural)


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

_KEEP_META = ("name", "namespace", "uid", "labels", "ownerReferences", "generation",
              "deletionTimestamp", "creationTimestamp", "resourceVersion")  # fmt: skip


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
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    kept_spec: dict[str, Any] = {"nodeName": spec.get("nodeName")}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:  # an unscheduled DaemonSet pod names its node only here
        kept_spec["affinity"] = {"nodeAffinity": node_affinity}
    return {
        "spec": kept_spec,
        "status": {
            "phase": status.get("phase"),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                | (
                    {"lastTransitionTime": c.get("lastTransitionTime")}
                    if c.get("type") == "Ready"
                    else {}
                )
                for c in status.get("conditions") or ()
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


Sink = Callable[[Watched, Mapping[str, Any], Mapping[str, Any]], None]


def build_registry(sink: Sink) -> kopf.OperatorRegistry:
    """Indexes and change handlers on a registry of their own: each change goes to ``sink``
    with the kind, the object and kopf's indexes (all filled by then)."""
    registry = kopf.OperatorRegistry()
    for watched in WATCHED:

        async def index(
            body: kopf.Body, namespace: str | None, name: str, w: Watched = watched, **_: Any
        ) -> Any:
            return {(namespace or "", name): index_value(w.index, body)}

        kopf.index(*watched.resource, id=watched.index, registry=registry)(index)
        if not watched.wakes:
            continue

        async def on_event(body: kopf.Body, w: Watched = watched, **kwargs: Any) -> None:
            sink(w, body, {k: v for k, v in kwargs.items() if k in INDEXES})

        kopf.on.event(*watched.resource, id=f"wake-{watched.index}", registry=registry)(on_event)
    return registry


def configure(settings: kopf.OperatorSettings) -> None:
    """Quiet kopf: no own Events, server-side selectors, no cluster scanning."""
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    for watched in WATCHED:
        if watched.selector:
            settings.watching.label_selectors[watched.resource] = watched.selector


def connection_info(config: k8s.Configuration) -> kopf.ConnectionInfo:
    """The same credentials the REST client uses (kubeconfig, token or in-cluster)."""
    token = None
    auth = (config.api_key or {}).get("authorization") or (config.api_key or {}).get("BearerToken")
    if auth:
        token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme="Bearer" if token else None,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )
