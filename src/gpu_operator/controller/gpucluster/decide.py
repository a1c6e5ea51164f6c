"""The GPUCluster loop's decisions (pure): the DRA stack from NVIDIA's GPUCluster, a second
top-level CRD.

:func:`decide_gpucluster` turns one snapshot (GPUClusters, ClusterPolicies, Nodes, DaemonSets)
into the objects to apply, node deploy labels, the status and Events; the shell
(:mod:`~gpu_operator.controller.gpucluster.reconciler`) performs them.

Device plugin and DRA on one node would advertise each GPU twice. Such a node keeps the
ClusterPolicy's device plugin (it was there first and its pods may hold GPUs): the DRA
DaemonSets' deploy labels say ``false`` there, the GPUCluster's status and the ClusterPolicy's
name the nodes, and each node gets a Warning Event once.

A deleted GPUCluster is torn down in order, under a finalizer: the DaemonSets whose pods hold
ResourceClaims (validator, exporter) go first, deleted in the foreground; then, while any
ComputeDomain is left, everything else waits (its controller removes a deleted domain's daemons
and labels under the domain's finalizer, which nothing would lift once the controller is gone);
the kubelet plugin (and its deploy label) only once they are gone. The kubelet must call the
plugin to release a pod's claim, and keeps a pod Terminating for as long as it cannot
(kubernetes#129402): all at once, those pods never finish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import computedomain_crd
from gpu_operator.api.gpucluster import (
    API_VERSION,
    KIND,
    SINGLETON,
    parse_gpucluster_spec,
)
from gpu_operator.api.status import READY
from gpu_operator.controller.active_policy import active_policy
from gpu_operator.controller.conditions import condition
from gpu_operator.controller.runtime.plan import Owner, content_hash, stamp
from gpu_operator.events import event_body
from gpu_operator.jsonpatch import finalizer_body, merge_patch_to
from gpu_operator.kinds import KINDS
from gpu_operator.labels import DEPLOY_PREFIX, DRA_TEARDOWN_FINALIZER
from gpu_operator.node_labels import is_gpu_node
from gpu_operator.render.facts import Facts
from gpu_operator.render.gpucluster import (
    DEPLOY_LABELS,
    EXPORTER,
    PLUGIN,
    VALIDATOR,
    compute_domain_objects,
    render_gpucluster,
)
from gpu_operator.views import NodeView

CONFLICT = "DevicePluginConflict"
CONFLICT_REASON = "DevicePluginAndDRA"
DEVICE_PLUGIN_LABEL = DEPLOY_PREFIX + "device-plugin"
FINALIZER = DRA_TEARDOWN_FINALIZER
CLAIM_HOLDERS = (VALIDATOR, EXPORTER)  # their pods hold ResourceClaims of the plugin's driver
DOMAINS_RECHECK_S = 10.0  # how soon a teardown waiting for ComputeDomains looks again
DRA_API = KINDS["DeviceClass"].api_version  # the stack's DRA objects' (GA in 1.34)
DRA_MIN_RELEASE = "1.34"
TOO_OLD = "KubernetesTooOld"


@dataclass(frozen=True)
class GpuClusterSnapshot:
    stamp: str
    clusters: tuple[Mapping[str, Any], ...]
    policies: tuple[Mapping[str, Any], ...]
    nodes: tuple[NodeView, ...]
    daemonsets: tuple[Mapping[str, Any], ...] = ()
    # ``namespace/name`` of each ComputeDomain, read only while the GPUCluster is deleted
    domains: tuple[str, ...] = ()
    now: float = 0.0  # epoch seconds of the pass
    # Whether the API server serves DRA's GA API, and its version (``v1.33.13``) to say so
    dra_served: bool = True
    server_version: str = ""


@dataclass(frozen=True)
class GpuClusterDecision:
    """What one GPUCluster pass writes, in the order the shell writes it."""

    applies: tuple[dict[str, Any], ...] = ()
    applied_hash: str | None = None  # of ``applies``; the shell skips an unchanged set
    labels: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)  # node -> patch
    statuses: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # name -> status
    events: tuple[dict[str, Any], ...] = ()
    conflicts: frozenset[str] = frozenset()  # nodes with both stacks asked for
    finalizers: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # name -> patch
    deletes: tuple[str, ...] = ()  # DaemonSets to delete in the foreground (pods first)
    # (kind, namespace, name) of what a disabled part left, deleted with the applies (once
    # per change of them, so a stack without it asks nothing of the API server each pass)
    removes: tuple[tuple[str, str, str], ...] = ()
    # name -> the merge patch to its new status, for those that differ from the status read
    status_patches: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    # When to look again though nothing watched changes: only while a teardown waits for
    # ComputeDomains, which this loop reads but does not watch; else the watches wake it.
    requeue_at: float | None = None


def _device_plugin_wanted(policies: Sequence[Mapping[str, Any]]) -> bool:
    name = active_policy(policies)
    policy = next((p for p in policies if p["metadata"]["name"] == name), None)
    if policy is None:
        return False
    try:
        return parse_spec(policy.get("spec")).device_plugin.enabled
    except PolicyError:
        return False  # an invalid policy applies nothing


def _plugin_ready(daemonsets: Sequence[Mapping[str, Any]], namespace: str) -> tuple[bool, str]:
    ds = next(
        (
            d
            for d in daemonsets
            if d["metadata"]["name"] == PLUGIN and d["metadata"].get("namespace") == namespace
        ),
        None,
    )
    if ds is None:
        return False, f"DaemonSet {PLUGIN} not created yet"
    status = ds.get("status") or {}
    desired = int(status.get("desiredNumberScheduled") or 0)
    available = int(status.get("numberAvailable") or 0)
    if desired == 0:
        return False, f"DaemonSet {PLUGIN} has no node to run on"
    if available < desired:
        return False, f"DaemonSet {PLUGIN}: {available} of {desired} pods available"
    return True, f"DRA kubelet plugin available on {desired} nodes"


def decide_gpucluster(
    snap: GpuClusterSnapshot,
    namespace: str,
    operator_image: str,
    reported: frozenset[str] = frozenset(),
) -> GpuClusterDecision:
    """The GPUCluster loop's judgement, pure: the DRA stack's objects, the nodes' deploy labels,
    the statuses (and their patches where they change), conflict Events and the finalizer, or
    the teardown of a deleted GPUCluster. ``reported``: nodes already given a conflict Event
    (by this process)."""
    decision = _decide(snap, namespace, operator_image, reported)
    return replace(decision, status_patches=_status_patches(snap.clusters, decision.statuses))


def _decide(
    snap: GpuClusterSnapshot,
    namespace: str,
    operator_image: str,
    reported: frozenset[str],
) -> GpuClusterDecision:
    """:func:`decide_gpucluster`'s decision, less the status patches."""
    statuses: dict[str, dict[str, Any]] = {}
    singleton = next((c for c in snap.clusters if c["metadata"]["name"] == SINGLETON), None)
    deleted = singleton is not None and bool(singleton["metadata"].get("deletionTimestamp"))
    active = None if deleted else singleton
    for other in snap.clusters:
        if other is not active:  # the CRD's CEL rule forbids these; an older CRD may not
            msg = f"only the GPUCluster named {SINGLETON} is acted on"
            statuses[other["metadata"]["name"]] = _status(
                other, "ignored", namespace, snap.stamp, [(READY, "False", "Ignored", msg)]
            )
    if active is None:
        if singleton is not None and FINALIZER in (singleton["metadata"].get("finalizers") or ()):
            return _teardown(snap, namespace, singleton, statuses)
        # None (deleted, or never made): the DRA deploy labels it set go again, so no node keeps
        # asking for a stack nobody renders any more.
        return GpuClusterDecision(statuses=statuses, labels=_drop_labels(snap.nodes, DEPLOY_LABELS))
    try:
        spec = parse_gpucluster_spec(active.get("spec"))
    except PolicyError as err:
        msg = "invalid spec, nothing applied: " + "; ".join(err.problems)
        statuses[SINGLETON] = _status(
            active, "notReady", namespace, snap.stamp, [(READY, "False", "InvalidSpec", msg)]
        )
        return GpuClusterDecision(statuses=statuses)
    if not snap.dra_served:
        statuses[SINGLETON] = _status(
            active, "notReady", namespace, snap.stamp, [(READY, "False", TOO_OLD, _too_old(snap))]
        )
        return GpuClusterDecision(statuses=statuses)

    gpu_nodes = [n for n in snap.nodes if is_gpu_node(n)]
    device_plugin = _device_plugin_wanted(snap.policies)
    conflicts = frozenset(
        n.name
        for n in gpu_nodes
        if device_plugin and n.labels.get(DEVICE_PLUGIN_LABEL, "true").lower() != "false"
    )
    labels: dict[str, dict[str, str]] = {}
    for node in gpu_nodes:
        value = "false" if node.name in conflicts else "true"
        want = {label: value for label in DEPLOY_LABELS.values()}
        patch = {k: v for k, v in want.items() if node.labels.get(k) != v}
        if patch:
            labels[node.name] = patch

    meta = active["metadata"]
    owner = Owner(API_VERSION, KIND, meta["name"], meta["uid"])
    facts = Facts(namespace=namespace, operator_image=operator_image)
    applies = tuple(stamp(render_gpucluster(spec, facts), owner))
    removes: tuple[tuple[str, str, str], ...] = ()
    if spec.compute_domains_enabled:
        # Unowned: deleting the GPUCluster must not take every user's ComputeDomain with it.
        # First: the controller finds its kind served when it starts.
        applies = tuple(stamp([computedomain_crd()], None)) + applies
    else:
        removes = tuple(
            (o["kind"], o["metadata"].get("namespace") or "", o["metadata"]["name"])
            for o in compute_domain_objects(spec, facts)
        )

    ready, ready_msg = _plugin_ready(snap.daemonsets, namespace)
    conditions = [(READY, "True" if ready else "False", "Reconciled" if ready else "NotReady",
                   ready_msg)]  # fmt: skip
    if conflicts:
        names = ", ".join(sorted(conflicts))
        conditions.append(
            (
                CONFLICT,
                "True",
                CONFLICT_REASON,
                f"the ClusterPolicy's device plugin also runs on {names}: DRA is not deployed "
                "there, so no GPU is advertised twice",
            )
        )
    statuses[SINGLETON] = _status(
        active, "ready" if ready else "notReady", namespace, snap.stamp, conditions
    )
    events = tuple(
        _node_event(node, snap.stamp) for node in sorted(conflicts) if node not in reported
    )
    finalizers = {}
    if FINALIZER not in (meta.get("finalizers") or ()):
        finalizers[SINGLETON] = finalizer_body(active, FINALIZER, add=True)
    return GpuClusterDecision(
        applies=applies,
        applied_hash=content_hash({"objects": list(applies), "removes": list(removes)}),
        removes=removes,
        labels=labels,
        statuses=statuses,
        events=events,
        conflicts=conflicts,
        finalizers=finalizers,
    )


def _too_old(snap: GpuClusterSnapshot) -> str:
    """Why nothing is applied on a cluster without DRA's GA API, and what to do."""
    release = f"Kubernetes {snap.server_version}" if snap.server_version else "this cluster"
    return (
        f"{release} does not serve {DRA_API}, which the DRA driver needs (Kubernetes "
        f"{DRA_MIN_RELEASE} or newer): nothing applied; upgrade the cluster, or give GPUs to "
        "pods with the ClusterPolicy's device plugin"
    )


def _teardown(
    snap: GpuClusterSnapshot,
    namespace: str,
    cluster: Mapping[str, Any],
    statuses: dict[str, dict[str, Any]],
) -> GpuClusterDecision:
    """The deleted GPUCluster's stack, claim holders first, then the plugin and the finalizer."""
    left = {
        d["metadata"]["name"]: d
        for d in snap.daemonsets
        if d["metadata"].get("namespace") == namespace and d["metadata"]["name"] in CLAIM_HOLDERS
    }
    holders = {k: v for k, v in DEPLOY_LABELS.items() if k in CLAIM_HOLDERS}
    if not left and snap.domains:
        shown = ", ".join(snap.domains[:10]) + (
            f" and {len(snap.domains) - 10} more" if len(snap.domains) > 10 else ""
        )
        msg = (
            f"deleting: waiting for ComputeDomains {shown} to be deleted first (the "
            "ComputeDomain controller and the kubelet plugin take their IMEX daemons and node "
            "labels down, and stay until then)"
        )
        statuses[SINGLETON] = _status(
            cluster, "notReady", namespace, snap.stamp, [(READY, "False", "Deleting", msg)]
        )
        return GpuClusterDecision(
            statuses=statuses,
            labels=_drop_labels(snap.nodes, holders),
            requeue_at=snap.now + DOMAINS_RECHECK_S,
        )
    if left:
        deletes = tuple(
            sorted(n for n, d in left.items() if not d["metadata"].get("deletionTimestamp"))
        )
        msg = (
            f"deleting: {', '.join(sorted(left))} first (their pods' ResourceClaims are released "
            f"through the kubelet plugin, which stays until they are gone)"
        )
        statuses[SINGLETON] = _status(
            cluster, "notReady", namespace, snap.stamp, [(READY, "False", "Deleting", msg)]
        )
        return GpuClusterDecision(
            statuses=statuses, labels=_drop_labels(snap.nodes, holders), deletes=deletes
        )
    return GpuClusterDecision(
        statuses=statuses,
        labels=_drop_labels(snap.nodes, DEPLOY_LABELS),
        finalizers={SINGLETON: finalizer_body(cluster, FINALIZER, add=False)},
    )


def _status_patches(
    clusters: Sequence[Mapping[str, Any]], statuses: Mapping[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each new status that differs from the one read, as the merge patch to exactly it (stale
    keys go too): an unchanged status is no write."""
    by_name = {c["metadata"]["name"]: c for c in clusters}
    patches = {}
    for name, status in statuses.items():
        current = (by_name.get(name) or {}).get("status") or {}
        if current != status:
            patches[name] = {"status": merge_patch_to(current, status)}
    return patches


def _drop_labels(
    nodes: Sequence[NodeView], labels: Mapping[str, str]
) -> dict[str, dict[str, str | None]]:
    gone: dict[str, dict[str, str | None]] = {}
    for node in nodes:
        patch: dict[str, str | None] = {v: None for v in labels.values() if v in node.labels}
        if patch:
            gone[node.name] = patch
    return gone


def _status(
    obj: Mapping[str, Any],
    state: str,
    namespace: str,
    now: str,
    conditions: Sequence[tuple[str, str, str, str]],
) -> dict[str, Any]:
    previous = (obj.get("status") or {}).get("conditions") or []
    generation = int(obj["metadata"].get("generation") or 0)
    return {
        "state": state,
        "namespace": namespace,
        "conditions": [
            condition(previous, t, s, reason, msg, now, generation)
            for t, s, reason, msg in conditions
        ],
    }


def _node_event(node: str, now: str) -> dict[str, Any]:
    return event_body(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
        "Warning",
        CONFLICT_REASON,
        "both the ClusterPolicy's device plugin and the GPUCluster's DRA driver target this "
        "node; the device plugin keeps it and DRA is not deployed here",
        component="gpu-operator",
        instance="gpu-operator",
        stamp=now,
    )
