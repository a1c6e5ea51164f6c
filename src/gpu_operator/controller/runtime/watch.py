"""What the operator watches, what it keeps of each object, and the kopf wiring.

One rule: kopf watches the project's own CRDs (ClusterPolicy, NVIDIADriver: a handful of
objects, where its machinery costs nothing), the informer (:mod:`.informer`) the built-in kinds
(thousands of pods and nodes, where kopf's per-event work was most of the operator's CPU).
Both keep every object in one set of stores (``stores[plural][(namespace, name)]``), trimmed to
what decisions read (a large fleet's stores stay small, and an event that changes nothing kept
is dropped before any work), and report a change as (kind, key): deciding what it means is the
loops' business. The loops start only once every kind is listed, so the first pass never acts on
half a picture (a missing node OS would otherwise prune a live driver DaemonSet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_operator.api import API_VERSION, KIND
from gpu_operator.controller.runtime.liveness import running_watchers
from gpu_operator.controller.runtime.plan import Observed
from gpu_operator.kinds import KINDS, Kind
from gpu_operator.kube import Kube
from gpu_operator.labels import APPLIED_HASH, MANAGED_BY, MANAGED_SELECTOR, OPERATOR_NAME
from gpu_operator.render import config_hash, mps_configured
from gpu_operator.views import Kept, NodeView, shared, shared_map, shared_tree

log = logging.getLogger(__name__)

ObjectKey = tuple[str, str]  # namespace ("" when cluster-scoped), name
Stores = dict[str, dict[ObjectKey, Any]]  # plural -> key -> what is kept (see index_value)
OUR_GROUP = KINDS[KIND].group


@dataclass(frozen=True)
class Watched:
    kind: Kind
    selector: str | None = None  # server-side label selector
    # Its CRD may be absent, or not granted to this operator: then it is watched as empty and
    # looked for again now and then, and the operator runs without it.
    optional: bool = False
    # Every namespace, not only the informer's own (a namespaced kind users create anywhere).
    cluster_wide: bool = False
    # What the store keeps of an object, where :func:`index_value` is not what its reader needs.
    keep: Callable[[Mapping[str, Any]], Any] | None = None

    def kept(self, body: Mapping[str, Any]) -> Any:
        """What this kind's store keeps of ``body``."""
        return self.keep(body) if self.keep is not None else index_value(self.index, body)

    @property
    def index(self) -> str:
        return self.kind.plural

    @property
    def by_kopf(self) -> bool:
        """The rule: kopf for the project's required CRDs (ClusterPolicy, NVIDIADriver), the
        informer for built-in kinds and for an optional CRD (kopf would wait for it)."""
        return self.kind.group == OUR_GROUP and not self.optional

    @property
    def resource(self) -> tuple[str, str] | tuple[str, str, str]:
        k = self.kind
        return (k.group, k.version, k.plural) if k.group else (k.version, k.plural)


WATCHED: tuple[Watched, ...] = (
    Watched(KINDS[KIND]),
    Watched(KINDS["NVIDIADriver"]),
    Watched(KINDS["GPUCluster"], optional=True),  # its own loop (controller/gpucluster/) reads it
    Watched(KINDS["Node"]),
    Watched(KINDS["ConfigMap"]),  # user configs too: their edits roll operand pods
    Watched(KINDS["DaemonSet"], MANAGED_SELECTOR),
    # Wakes the loops like every kind: an OnDelete DaemonSet's new template moves no pod, and
    # its new revision may come after the DaemonSet's own change (another watch), so a pass
    # woken by the DaemonSet alone can find no pod out of date and never look again.
    Watched(KINDS["ControllerRevision"], MANAGED_SELECTOR),
    Watched(KINDS["Pod"], MANAGED_SELECTOR),
    Watched(KINDS["Service"], MANAGED_SELECTOR),
    Watched(KINDS["ServiceAccount"], MANAGED_SELECTOR),
    Watched(KINDS["Role"], MANAGED_SELECTOR),
    Watched(KINDS["RoleBinding"], MANAGED_SELECTOR),
    Watched(KINDS["ClusterRole"], MANAGED_SELECTOR),
    Watched(KINDS["ClusterRoleBinding"], MANAGED_SELECTOR),
    Watched(KINDS["RuntimeClass"], MANAGED_SELECTOR),
    # Applied only where the Prometheus operator's CRD is served: no store while it is not.
    Watched(KINDS["ServiceMonitor"], MANAGED_SELECTOR, optional=True),
)
INDEXES = frozenset(w.index for w in WATCHED)
KOPF_WATCHED = tuple(w for w in WATCHED if w.by_kopf)
INFORMED = tuple(w for w in WATCHED if not w.by_kopf)

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
    if plural in ("clusterpolicies", "nvidiadrivers", "gpuclusters", "daemonsets"):
        return dict(body.items())
    meta = body.get("metadata") or {}
    kept = Kept(metadata={k: meta[k] for k in _KEEP_META if k in meta})
    if "namespace" in meta:
        kept["metadata"]["namespace"] = shared(meta["namespace"])
    if "labels" in meta:
        kept["metadata"]["labels"] = shared_tree(shared_map(meta["labels"]))
    if "ownerReferences" in meta:
        kept["metadata"]["ownerReferences"] = shared_tree(
            [_owner(r) for r in meta["ownerReferences"]]
        )
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
        # Their file names: driver config ConfigMaps are mounted one file each.
        kept["keys"] = sorted({*(body.get("data") or {}), *(body.get("binaryData") or {})})
    return kept


def _owner(ref: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference as read (the owner's kind, name and uid, and whether it controls)."""
    kept = shared_map({k: ref[k] for k in ("apiVersion", "kind", "name") if k in ref})
    kept["uid"] = str(ref.get("uid") or "")
    if "controller" in ref:
        kept["controller"] = ref["controller"]
    return kept


def _trim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as decisions read it: where it runs, and whether it is Ready (thousands are kept:
    every dict left out here is memory saved per pod, and an event it does not change is
    dropped)."""
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    kept_spec: dict[str, Any] = {"nodeName": shared(spec.get("nodeName"))}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity and not spec.get("nodeName"):  # an unscheduled DaemonSet pod names its
        kept_spec["affinity"] = {"nodeAffinity": node_affinity}  # node only here
    return {
        "spec": kept_spec,
        "status": {
            "phase": shared(status.get("phase")),
            "conditions": [
                {"type": "Ready", "status": shared(c.get("status"))}
                | {"lastTransitionTime": c.get("lastTransitionTime")}
                for c in status.get("conditions") or ()
                if c.get("type") == "Ready"
            ],
            "containerStatuses": shared_tree(
                [
                    {"restartCount": c.get("restartCount", 0), "ready": c.get("ready")}
                    | _waiting(c)
                    for c in status.get("containerStatuses") or ()
                ]
            ),
            "initContainerStatuses": shared_tree(
                [
                    {"restartCount": c.get("restartCount", 0)}
                    for c in status.get("initContainerStatuses") or ()
                ]
            ),
        },
    }


def _waiting(container: Mapping[str, Any]) -> dict[str, Any]:
    """Why a container waits (ImagePullBackOff, CrashLoopBackOff): what a failed rollout's
    status names."""
    reason = (((container.get("state") or {}).get("waiting")) or {}).get("reason")
    return {"state": {"waiting": {"reason": shared(reason)}}} if reason else {}


def owned_children(
    objects_by_kind: Mapping[str, Iterable[Mapping[str, Any]]],
    owner: tuple[str, str] = (API_VERSION, KIND),
) -> list[Observed]:
    """The objects the operator created for a ClusterPolicy (or the ``owner`` kind, as
    (apiVersion, kind)): labelled managed-by it AND owned by one (managed-by alone is not ours
    to delete: Helm sets it too)."""
    seen = []
    for kind, objects in objects_by_kind.items():
        for obj in objects:
            meta = obj.get("metadata") or {}
            if (meta.get("labels") or {}).get(MANAGED_BY) != OPERATOR_NAME:
                continue
            refs = meta.get("ownerReferences") or ()
            if any((r.get("apiVersion"), r.get("kind")) == owner for r in refs):
                seen.append(Observed.from_k8s(obj, kind))
    return seen


OnChange = Callable[[Watched, ObjectKey], None]  # a kept value was added, changed or deleted


def build_registry(stores: Stores, on_change: OnChange) -> kopf.OperatorRegistry:
    """kopf's handlers for the CRDs, on a registry of their own: each event stores what is
    kept of the object in ``stores`` and reports the change."""
    registry = kopf.OperatorRegistry()
    for watched in KOPF_WATCHED:

        async def on_event(
            event: kopf.RawEvent,
            body: kopf.Body,
            name: str,
            namespace: str | None,
            w: Watched = watched,
            **_: Any,
        ) -> None:
            key = (namespace or "", name)
            store = stores.setdefault(w.index, {})
            if event.get("type") == "DELETED":
                store.pop(key, None)
            else:
                store[key] = index_value(w.index, body)
            on_change(w, key)

        kopf.on.event(*watched.resource, id=f"store-{watched.index}", registry=registry)(on_event)
    return registry


def not_yet_stored(listed: Iterable[ObjectKey], stored: Iterable[ObjectKey]) -> set[ObjectKey]:
    """The keys a list returned that kopf has not stored yet."""
    return set(listed) - set(stored)


async def kopf_caught_up(kube: Kube, stores: Stores, *, poll_s: float = 0.2) -> None:
    """Return once kopf watches every CRD and has stored every object a list of it returns.

    kopf says nothing when a listing is empty (no event to handle), and nothing of when its
    listing ends: so list each CRD here (a handful of objects) until kopf holds them all.
    """
    while True:
        try:
            if len(running_watchers()) >= len(KOPF_WATCHED):
                missing = [
                    not_yet_stored(await asyncio.to_thread(_keys, kube, w), stores.get(w.index, {}))
                    for w in KOPF_WATCHED
                ]
                if not any(missing):
                    return
        except Exception as exc:  # the API server away: kopf waits too
            log.debug("waiting for kopf's watches: %s", exc)
        await asyncio.sleep(poll_s)


def _keys(kube: Kube, w: Watched) -> list[ObjectKey]:
    try:
        objects = kube.list_objects(w.kind.kind, label_selector=w.selector)
    except ApiException as exc:
        if exc.status == 404:  # the CRD is not installed: nothing for kopf to hold
            return []
        raise
    return [((o["metadata"].get("namespace") or ""), o["metadata"]["name"]) for o in objects]


def configure(settings: kopf.OperatorSettings) -> None:
    """Quiet kopf: no own Events, server-side selectors, no cluster scanning."""
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    for watched in KOPF_WATCHED:
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
