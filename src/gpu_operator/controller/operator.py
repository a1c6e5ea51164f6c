"""The operator's imperative shell: kopf watches feed in-memory indexes, one loop reconciles.

kopf lists and watches every kind the operator cares about into indexes; it starts calling
handlers only once all of them are populated, so the first pass never acts on half a picture
(a missing node OS would otherwise prune a live driver DaemonSet). Event handlers do nothing
but wake the loop; the loop coalesces bursts, computes everything with the pure modules, and
writes only differences. All state that must outlive the process is in the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_operator.api import API_VERSION, KIND, ClusterPolicySpec, PolicyError, parse_spec
from gpu_operator.controller import status as status_mod
from gpu_operator.controller.facts import (
    gather_facts,
    nfd_present,
    node_policy,
)
from gpu_operator.controller.metrics import OperatorMetrics
from gpu_operator.controller.nodes import NodePolicy, NodeView, is_gpu_node, plan_node
from gpu_operator.controller.plan import (
    APPLIED_HASH,
    MANAGED_BY,
    MANAGED_SELECTOR,
    Key,
    Observed,
    Owner,
    key_of,
    plan_changes,
    stamp,
)
from gpu_operator.controller.readiness import DaemonSetReadiness, daemonset_readiness
from gpu_operator.events import event_body, now_iso
from gpu_operator.kube import Kube
from gpu_operator.render import COMPONENT_LABEL, config_hash, render_components
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.upgrade.executor import EMPTYING, UpgradeExecutor
from gpu_operator.upgrade.model import STATE_LABEL, DeletePod, Evict

log = logging.getLogger(__name__)

FINALIZER = "nvidia.com/gpu-operator-node-cleanup"
EMPTYING_RECHECK_SECONDS = 3.0

# (group, version, plural, namespaced, server-side label selector)
WATCHED: tuple[tuple[str, str, str, bool, str | None], ...] = (
    ("nvidia.com", "v1", "clusterpolicies", False, None),
    ("", "v1", "nodes", False, None),
    ("", "v1", "configmaps", True, None),  # user configs too: their edits roll operand pods
    ("apps", "v1", "daemonsets", True, MANAGED_SELECTOR),
    ("apps", "v1", "controllerrevisions", True, MANAGED_SELECTOR),
    ("", "v1", "pods", True, MANAGED_SELECTOR),
    ("", "v1", "services", True, MANAGED_SELECTOR),
    ("", "v1", "serviceaccounts", True, MANAGED_SELECTOR),
    ("rbac.authorization.k8s.io", "v1", "roles", True, MANAGED_SELECTOR),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", True, MANAGED_SELECTOR),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", False, MANAGED_SELECTOR),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False, MANAGED_SELECTOR),
    ("node.k8s.io", "v1", "runtimeclasses", False, MANAGED_SELECTOR),
)
# Kinds whose managed objects the pass diffs against (plural -> kind).
APPLIED_KINDS = {
    "configmaps": "ConfigMap",
    "daemonsets": "DaemonSet",
    "services": "Service",
    "serviceaccounts": "ServiceAccount",
    "roles": "Role",
    "rolebindings": "RoleBinding",
    "clusterroles": "ClusterRole",
    "clusterrolebindings": "ClusterRoleBinding",
    "runtimeclasses": "RuntimeClass",
}


@dataclass
class OperatorSettings:
    namespace: str = "gpu-operator"
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    image_env: Mapping[str, str] = field(default_factory=dict)
    debounce_seconds: float = 0.5
    resync_seconds: float = 600.0  # the safety net; events drive everything else
    write_concurrency: int = 8


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items()}


_KEEP_META = ("name", "namespace", "uid", "labels", "ownerReferences", "generation",
              "deletionTimestamp", "creationTimestamp", "resourceVersion")  # fmt: skip


def trim(plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Only what the operator reads, so the indexes of a large fleet stay small.

    ControllerRevisions carry a whole pod template and pods their full spec; neither is needed.
    ConfigMaps are kept as a content hash (edits to referenced ones roll operand pods).
    """
    if plural in ("clusterpolicies", "daemonsets"):
        return _plain(body)
    meta = body.get("metadata") or {}
    kept: dict[str, Any] = {"metadata": {k: meta[k] for k in _KEEP_META if k in meta}}
    hash_ = (meta.get("annotations") or {}).get(APPLIED_HASH)
    if hash_:
        kept["metadata"]["annotations"] = {APPLIED_HASH: hash_}
    if plural == "pods":
        status = body.get("status") or {}
        spec = body.get("spec") or {}
        kept["spec"] = {"nodeName": spec.get("nodeName")}
        node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
        if node_affinity:  # an unscheduled DaemonSet pod names its node only here
            kept["spec"]["affinity"] = {"nodeAffinity": node_affinity}
        kept["status"] = {
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
        }
    elif plural == "controllerrevisions":
        kept["revision"] = body.get("revision")
    elif plural == "configmaps":
        kept["hash"] = config_hash(body)
    return kept


def _is_owned_child(obj: Mapping[str, Any]) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(r.get("kind") == KIND and r.get("apiVersion") == API_VERSION for r in refs)


class Controller:
    """One reconcile loop per process; the kopf handlers only feed and wake it."""

    def __init__(self, kube: Kube, settings: OperatorSettings, metrics: OperatorMetrics) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.indexes: dict[str, Mapping[Any, Any]] = {}
        self.wake = asyncio.Event()
        self.ready = asyncio.Event()  # set once the indexes are populated
        self.dirty_nodes: set[str] = set()
        self.all_nodes_dirty = True
        self.node_policy: NodePolicy | None = None
        self.node_policy_known = False
        self.applied_generations: dict[Key, int] = {}
        self.last_node_views: dict[str, NodeView] = {}
        self.passes = 0
        self.upgrades = UpgradeExecutor(kube, self._call, self._event)
        self.next_deadline: float | None = None  # an upgrade timeout to look at again
        self.monitors_available: bool | None = None  # re-checked on each safety-net resync
        self.applied_monitors: dict[Key, str] = {}
        self._write_slots = asyncio.Semaphore(settings.write_concurrency)

    # -- feeding -------------------------------------------------------------------------------

    def notify(self, indexes: Mapping[str, Any], *, node: NodeView | None = None) -> None:
        if not self.indexes:
            self.indexes = dict(indexes)
            self.ready.set()
        if node is not None:
            if self._relevant(node) == self._relevant(self.last_node_views.get(node.name)):
                return  # a heartbeat: nothing the operator decides on changed
            self.last_node_views[node.name] = node
            self.dirty_nodes.add(node.name)
        self.wake.set()

    @staticmethod
    def _relevant(node: NodeView | None) -> Any:
        if node is None:
            return None
        return (
            dict(node.labels),
            dict(node.annotations),
            node.taints,
            dict(node.capacity),
            node.container_runtime,
            node.ready,
            node.unschedulable,
        )

    def _values(self, index: str) -> list[Any]:
        idx = self.indexes.get(index) or {}
        return [value for store in idx.values() for value in store]

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.ready.wait()
        next_resync = time.monotonic() + self.settings.resync_seconds
        while True:
            timeout = next_resync - time.monotonic()
            if self.next_deadline is not None:
                timeout = min(timeout, self.next_deadline - time.time())
            with contextlib.suppress(TimeoutError):  # woken by an event, or it is time
                await asyncio.wait_for(self.wake.wait(), timeout=max(1.0, timeout))
            if time.monotonic() >= next_resync:  # the safety net: re-check what is cached
                next_resync = time.monotonic() + self.settings.resync_seconds
                self.all_nodes_dirty = True
                self.monitors_available = None
            await asyncio.sleep(self.settings.debounce_seconds)  # let a burst settle
            self.wake.clear()
            started = time.monotonic()
            self.metrics.reconciles.inc()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.reconcile_errors.inc()
                log.exception("reconcile pass failed; retrying")
                await asyncio.sleep(2.0)
                self.wake.set()
            finally:
                self.passes += 1
                elapsed = time.monotonic() - started
                self.metrics.reconcile_seconds.observe(elapsed)
                log.debug("reconcile pass %d took %.2fs", self.passes, elapsed)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async with self._write_slots:
            return await asyncio.to_thread(fn, *args, **kwargs)

    async def reconcile(self) -> None:
        policies = [_plain(p) for p in self._values("policies")]
        active_name = status_mod.active_policy(policies)
        nodes = [n for n in self._values("nodes")]
        gpu_nodes = [n for n in nodes if is_gpu_node(n)]
        self.metrics.gpu_nodes.set(len(gpu_nodes))

        for policy in policies:
            meta = policy["metadata"]
            if meta.get("deletionTimestamp"):
                await self._finalize(policy, others_live=active_name is not None)
            elif meta["name"] != active_name and active_name is not None:
                obs = status_mod.Observation(
                    namespace=self.settings.namespace,
                    generation=int(meta.get("generation") or 0),
                    gpu_nodes=len(gpu_nodes),
                    nfd_present=True,
                    ignored_because=active_name,
                )
                await self._write_status(policy, obs)

        active = next((p for p in policies if p["metadata"]["name"] == active_name), None)
        if active is None:
            await self._label_nodes(nodes, None)
            return
        await self._reconcile_active(active, nodes, gpu_nodes)

    async def _reconcile_active(
        self, policy: dict[str, Any], nodes: list[NodeView], gpu_nodes: list[NodeView]
    ) -> None:
        meta = policy["metadata"]
        generation = int(meta.get("generation") or 0)
        if FINALIZER not in (meta.get("finalizers") or []):
            await self._call(
                self.kube.merge_patch,
                "ClusterPolicy",
                meta["name"],
                {
                    "metadata": {
                        "finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                        "resourceVersion": meta["resourceVersion"],
                    }
                },
            )
            self.metrics.writes.labels("patch", "ClusterPolicy").inc()
            return  # the update wakes the next pass with the new resourceVersion

        base = status_mod.Observation(
            namespace=self.settings.namespace,
            generation=generation,
            gpu_nodes=len(gpu_nodes),
            nfd_present=nfd_present(nodes),
        )
        try:
            spec = parse_spec(policy.get("spec"))
        except PolicyError as err:
            await self._write_status(
                policy,
                dataclasses.replace(base, problems=tuple(err.problems)),
            )
            return

        configmap_hashes = {
            cm["metadata"]["name"]: cm["hash"]
            for cm in self._values("configmaps")
            if cm["metadata"].get("namespace") == self.settings.namespace
        }
        facts = gather_facts(
            nodes,
            spec,
            namespace=self.settings.namespace,
            configmap_hashes=configmap_hashes,
            operator_image=self.settings.operator_image,
            image_env=self.settings.image_env,
        )
        parts = render_components(spec, facts)
        owner = Owner(API_VERSION, KIND, meta["name"], meta["uid"])
        desired = stamp((o for p in parts for o in p.objects), owner)
        apply_error = await self._apply(desired)

        await self._label_nodes(nodes, node_policy(spec))
        upgrade = await self._upgrade(spec, nodes) if spec.driver.enabled else None

        components: dict[str, list[DaemonSetReadiness]] = {}
        for part in parts:
            if part.enabled:
                components[part.component.name] = self._readiness(part.component.name)
        obs = dataclasses.replace(
            base,
            components=components,
            apply_error=apply_error,
            unimplemented=tuple(spec.unimplemented_enabled()),
            upgrade=upgrade,
        )
        for name, sets in components.items():
            self.metrics.component_ready.labels(name).set(1 if all(s.ready for s in sets) else 0)
        await self._write_status(policy, obs)

    async def _upgrade(self, spec: ClusterPolicySpec, nodes: list[NodeView]) -> dict[str, Any]:
        """One step of the fleet's driver upgrade; the summary goes into status."""
        result = await self.upgrades.reconcile(
            spec.driver.upgrade_policy,
            nodes,
            self._values("daemonsets"),
            self._values("pods"),
            self._values("controllerrevisions"),
        )
        # Workload pods live in namespaces the operator does not watch: while a node is being
        # emptied, look again shortly instead of waiting for an unrelated event.
        deadlines = [d for d in (result.next_deadline,) if d is not None]
        if any(n.labels.get(STATE_LABEL) in EMPTYING for n in nodes) or any(
            isinstance(a, (Evict, DeletePod)) for a in result.actions
        ):
            deadlines.append(time.time() + EMPTYING_RECHECK_SECONDS)
        self.next_deadline = min(deadlines) if deadlines else None
        summary = result.summary
        for state, count in (
            ("done", summary.done),
            ("in_progress", summary.in_progress),
            ("failed", summary.failed),
            ("pending", summary.pending),
        ):
            self.metrics.upgrade_nodes.labels(state).set(count)
        return {
            "total": summary.total,
            "done": summary.done,
            "inProgress": summary.in_progress,
            "failed": summary.failed,
            "pending": summary.pending,
            "message": result.line,
        }

    # -- objects -------------------------------------------------------------------------------

    def _observed(self) -> list[Observed]:
        seen = []
        for plural, kind in APPLIED_KINDS.items():
            for obj in self._values(plural):
                labels = (obj.get("metadata") or {}).get("labels") or {}
                if labels.get(MANAGED_BY) != "gpu-operator":
                    continue
                if not _is_owned_child(obj):
                    continue  # managed-by alone is not ours to delete (Helm sets it too)
                seen.append(Observed.from_k8s(obj, kind))
        return seen

    async def _apply(self, desired: list[dict[str, Any]]) -> str | None:
        kinds = frozenset(APPLIED_KINDS.values()) | {"ServiceMonitor"}
        plan = plan_changes(desired, self._observed(), self.applied_generations, kinds)
        monitors = [o for o in plan.apply if o["kind"] == "ServiceMonitor"]
        plan_apply = [o for o in plan.apply if o["kind"] != "ServiceMonitor"]
        plan_apply += await self._monitors_to_apply(monitors)
        errors: list[tuple[str, str]] = []  # (object, reason)

        async def apply_one(obj: dict[str, Any]) -> None:
            try:
                result = await self._call(self.kube.apply, obj)
                self.metrics.writes.labels("apply", obj["kind"]).inc()
                meta = result.get("metadata") or {}
                key = (obj["kind"], meta.get("namespace") or "", meta["name"])
                self.applied_generations[key] = int(meta.get("generation") or 0)
                if obj["kind"] == "ServiceMonitor":
                    self.applied_monitors[key] = obj["metadata"]["annotations"][APPLIED_HASH]
            except ApiException as exc:
                errors.append((f"{obj['kind']}/{obj['metadata']['name']}", _reason(exc)))

        async def prune_one(key: Key) -> None:
            kind, namespace, name = key
            try:
                await self._call(self.kube.delete, kind, name, namespace or None)
                self.metrics.writes.labels("delete", kind).inc()
                self.applied_generations.pop(key, None)
            except ApiException as exc:
                errors.append((f"deleting {kind}/{name}", _reason(exc)))

        # Apply in render order, one kind-stage at a time, so RBAC precedes the DaemonSets.
        for stage in _stages(plan_apply):
            await asyncio.gather(*(apply_one(o) for o in stage))
        await asyncio.gather(*(prune_one(k) for k in plan.prune))
        if plan_apply or plan.prune:
            log.info("applied %d objects, pruned %d", len(plan_apply), len(plan.prune))
        return summarize_errors(errors)

    async def _monitors_to_apply(self, monitors: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """ServiceMonitors only where the Prometheus operator's CRD exists; not watched.

        What was applied is remembered, so an unchanged pass reads nothing; the safety-net
        resync re-checks the CRD and the objects.
        """
        if not monitors:
            return []
        if self.monitors_available is None:
            crd = await asyncio.to_thread(
                self.kube.get, "CustomResourceDefinition", "servicemonitors.monitoring.coreos.com"
            )
            self.monitors_available = crd is not None
            if crd is None:
                self.applied_monitors.clear()
        if not self.monitors_available:
            return []
        out = []
        for obj in monitors:
            key = key_of(obj)
            want = obj["metadata"]["annotations"][APPLIED_HASH]
            if self.applied_monitors.get(key) == want:
                continue
            meta = obj["metadata"]
            current = await asyncio.to_thread(
                self.kube.get, "ServiceMonitor", meta["name"], meta.get("namespace")
            )
            have = ((current or {}).get("metadata") or {}).get("annotations") or {}
            if have.get(APPLIED_HASH) == want:
                self.applied_monitors[key] = want
            else:
                out.append(obj)
        return out

    def _readiness(self, component: str) -> list[DaemonSetReadiness]:
        result = []
        pods = self._values("pods")
        revisions = self._values("controllerrevisions")
        for ds in self._values("daemonsets"):
            meta = ds.get("metadata") or {}
            if (meta.get("labels") or {}).get(COMPONENT_LABEL) != component:
                continue
            uid = meta.get("uid")
            own = [
                o
                for o in pods
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or ())
            ]
            revs = [
                r
                for r in revisions
                if any(x.get("uid") == uid for x in r["metadata"].get("ownerReferences") or ())
            ]
            result.append(daemonset_readiness(ds, own, revs))
        if not result:
            result.append(
                DaemonSetReadiness(component, False, 0, 0, 0, "DaemonSet not created yet")
            )
        return result

    # -- nodes ---------------------------------------------------------------------------------

    async def _label_nodes(
        self, nodes: Iterable[NodeView], policy: NodePolicy | None, *, uninstall: bool = False
    ) -> None:
        changed_policy = not self.node_policy_known or policy != self.node_policy
        everything = changed_policy or self.all_nodes_dirty or uninstall
        self.node_policy, self.node_policy_known = policy, True
        self.all_nodes_dirty = False
        dirty, self.dirty_nodes = self.dirty_nodes, set()

        async def one(node: NodeView) -> None:
            patch = plan_node(node, policy, uninstall=uninstall)
            if patch is None:
                return
            try:
                await self._call(self.kube.merge_patch, "Node", node.name, patch.to_merge_patch())
                self.metrics.writes.labels("patch", "Node").inc()
            except ApiException as exc:
                if exc.status in (404, 409):
                    self.dirty_nodes.add(node.name)  # gone, or changed under us: next pass
                    self.wake.set()
                    return
                raise

        todo = [n for n in nodes if everything or n.name in dirty]
        started = time.monotonic()
        await asyncio.gather(*(one(n) for n in todo))
        if todo:
            log.debug("checked %d nodes in %.2fs", len(todo), time.monotonic() - started)

    # -- status and events ---------------------------------------------------------------------

    async def _write_status(
        self,
        policy: dict[str, Any],
        obs: status_mod.Observation,
    ) -> None:
        current = policy.get("status") or {}
        new = status_mod.compute_status(obs, current, now_iso())
        if new == current:
            return
        name = policy["metadata"]["name"]
        await self._call(
            self.kube.merge_patch, "ClusterPolicy", name, {"status": new}, subresource="status"
        )
        self.metrics.writes.labels("patch", "ClusterPolicy/status").inc()
        ready = new["conditions"][0]
        if new["state"] != "ignored":
            self.metrics.policy_ready.set(1 if new["state"] == "ready" else 0)
        previous = (current.get("conditions") or [{}])[0].get("reason")
        if ready["reason"] != previous:
            event_type = "Warning" if ready["reason"] in ("ReconcileFailed",) else "Normal"
            await self._event(policy, event_type, ready["reason"], ready["message"] or new["state"])

    async def _event(self, about: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
        """An Event about a cluster-scoped object (the ClusterPolicy or a Node)."""
        about = {"apiVersion": API_VERSION, "kind": KIND, **about}
        body = event_body(
            about,
            etype,
            reason,
            message,
            component="gpu-operator",
            instance=socket.gethostname(),
            stamp=now_iso(),
        )
        try:
            await self._call(self.kube.create, body)
            self.metrics.writes.labels("create", "Event").inc()
        except ApiException as exc:
            log.warning("could not record event %s: %s", reason, _reason(exc))

    # -- deletion ------------------------------------------------------------------------------

    async def _finalize(self, policy: dict[str, Any], *, others_live: bool) -> None:
        meta = policy["metadata"]
        finalizers = meta.get("finalizers") or []
        if FINALIZER not in finalizers:
            return
        if not others_live:
            # Children go by garbage collection; node labels and taints are ours to undo.
            await self._label_nodes(self._values("nodes"), None, uninstall=True)
            self.node_policy_known = False
        await self._call(
            self.kube.merge_patch,
            "ClusterPolicy",
            meta["name"],
            {
                "metadata": {
                    "finalizers": [f for f in finalizers if f != FINALIZER],
                    "resourceVersion": meta["resourceVersion"],
                }
            },
        )
        self.metrics.writes.labels("patch", "ClusterPolicy").inc()


def summarize_errors(errors: list[tuple[str, str]], shown: int = 3) -> str | None:
    """One line per distinct reason, naming a few of the objects it hit (a missing namespace
    fails every object the same way; the user needs to read that once)."""
    if not errors:
        return None
    by_reason: dict[str, list[str]] = {}
    for what, reason in errors:
        by_reason.setdefault(reason, []).append(what)
    lines = []
    for reason, objects in by_reason.items():
        names = ", ".join(sorted(objects)[:shown])
        more = f" and {len(objects) - shown} more" if len(objects) > shown else ""
        lines.append(f"{reason} ({names}{more})")
    return "; ".join(lines)


def _stages(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Group consecutive objects so that each DaemonSet waits for what precedes it."""
    early = [o for o in objects if o["kind"] != "DaemonSet"]
    late = [o for o in objects if o["kind"] == "DaemonSet"]
    return [s for s in (early, late) if s]


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "").get("message") or exc.reason)
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


# -- kopf wiring -------------------------------------------------------------------------------


def build_registry(controller: Controller) -> kopf.OperatorRegistry:
    """Register indexes and wake-up handlers on a registry of their own."""
    registry = kopf.OperatorRegistry()

    def index_id(plural: str) -> str:
        return "policies" if plural == "clusterpolicies" else plural

    for group, version, plural, _namespaced, _selector in WATCHED:
        resource = (group, version, plural) if group else (version, plural)
        ident = index_id(plural)
        if plural == "nodes":

            async def index_node(body: kopf.Body, name: str, **_: Any) -> dict[str, NodeView]:
                return {name: NodeView.from_k8s(body)}

            kopf.index(*resource, id=ident, registry=registry)(index_node)
        else:

            async def index_obj(
                body: kopf.Body, namespace: str | None, name: str, plural: str = plural, **_: Any
            ) -> Any:
                return {(namespace or "", name): trim(plural, body)}

            kopf.index(*resource, id=ident, registry=registry)(index_obj)

        if plural == "nodes":

            async def on_node(body: kopf.Body, **kwargs: Any) -> None:
                controller.notify(_indexes(kwargs), node=NodeView.from_k8s(body))

            kopf.on.event(*resource, id=f"wake-{ident}", registry=registry)(on_node)
        elif plural != "controllerrevisions":

            async def on_event(**kwargs: Any) -> None:
                controller.notify(_indexes(kwargs))

            kopf.on.event(*resource, id=f"wake-{ident}", registry=registry)(on_event)
    return registry


def _indexes(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    names = {("policies" if p == "clusterpolicies" else p) for _, _, p, _, _ in WATCHED}
    return {k: v for k, v in kwargs.items() if k in names}


def configure(settings: kopf.OperatorSettings) -> None:
    """Quiet kopf: no own Events, server-side selectors, no cluster scanning."""
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    for group, version, plural, _namespaced, selector in WATCHED:
        if selector:
            settings.watching.label_selectors[
                (group, version, plural) if group else (version, plural)
            ] = selector


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
