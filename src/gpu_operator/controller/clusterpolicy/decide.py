"""The ClusterPolicy pass's decisions: one snapshot and the memory in, every write out.

Pure: ``decide(snapshot, memory, config)`` returns stages of API actions (applies, prunes,
node patches, upgrade steps, status, Events, finalizers), what to read first when it needs to
know an object it cannot watch, when to look again, and the metric values. The loop executes
the stages and folds their outcomes into the next memory (:func:`memory.remember`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.api import API_VERSION, KIND, ClusterPolicySpec, PolicyError, parse_spec
from gpu_operator.api.spec import DriverSpec
from gpu_operator.controller.active_policy import active_policy
from gpu_operator.controller.clusterpolicy.facts import gather_facts, nfd_present, node_policy
from gpu_operator.controller.clusterpolicy.memory import Memory
from gpu_operator.controller.clusterpolicy.remediation_stage import (
    plan_remediation,
    remediation_stage,
    remediation_status,
)
from gpu_operator.controller.clusterpolicy.status import Observation, compute_status
from gpu_operator.controller.notices import object_event
from gpu_operator.controller.pools import handback_pending, handover_pending
from gpu_operator.controller.readiness import (
    NodeKinds,
    by_owner,
    component_readiness,
    daemonset_pod_spec,
)
from gpu_operator.controller.rollout_stage import (
    drivers_synced,
    renders_stable,
    retry_requested,
    rollout_actions,
    settings_of,
    with_settings,
)
from gpu_operator.controller.runtime.actions import (
    Action,
    Apply,
    Create,
    Patch,
    Prune,
    Stage,
)
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.plan import Owner, key_of, plan_changes, stamp
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.controller.upgrade_stage import upgrade_stage
from gpu_operator.events import iso_time
from gpu_operator.jsonpatch import finalizer_body, merge_patch_to
from gpu_operator.labels import NODE_CLEANUP_FINALIZER
from gpu_operator.node_labels import NodePolicy, is_gpu_node, plan_node
from gpu_operator.remediation import (
    HealthSummary,
)
from gpu_operator.render import render_components
from gpu_operator.upgrade import (
    Policy,
    Summary,
    UpgradePlan,
    fleet_from_objects,
    plan,
)
from gpu_operator.upgrade.canary import CanaryPolicy, Rollout, RolloutDecision, decide_rollout
from gpu_operator.upgrade.planner import progress
from gpu_operator.views import NodeView

FINALIZER = NODE_CLEANUP_FINALIZER
# Kinds the operator applies and watches (so it can diff and prune them); OPTIONAL_KINDS too, but
# only where their CRD is served (the Prometheus operator's ServiceMonitor).
APPLIED_KINDS = frozenset(
    {
        "ConfigMap",
        "DaemonSet",
        "Service",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "RuntimeClass",
    }
)
OPTIONAL_KINDS = frozenset({"ServiceMonitor"})


@dataclass(frozen=True)
class Gauges:
    """Metric values a pass observed (the shell sets them)."""

    gpu_nodes: int = 0
    components_ready: Mapping[str, bool] = field(default_factory=dict)
    policy_ready: bool | None = None  # None: no active policy decided this pass
    upgrade: Summary | None = None
    health: HealthSummary | None = None


@dataclass(frozen=True)
class Decision:
    """What one ClusterPolicy pass will do: the writes, in stages the executor runs in order,
    when to look again if nothing changes, and the figures the shell reports. Plain data, so
    a pass is tested by comparing Decisions."""

    memory: Memory  # before this pass's outcomes are folded in
    stages: tuple[Stage, ...] = ()
    requeue_at: float | None = None  # look again by then even if nothing changes
    gauges: Gauges = field(default_factory=Gauges)
    reconciled: bool = False  # the active policy's objects were decided

    @property
    def actions(self) -> list[Action]:
        return [a for s in self.stages for a in s.actions]


def decide(snap: Snapshot, memory: Memory, config: OperatorConfig) -> Decision:
    """The ClusterPolicy loop's whole judgement, pure: from what the watches show (``snap``)
    and what earlier passes remembered, the writes that bring the cluster to the active
    policy, or take a deleted one's traces off the nodes before its finalizer goes. Only the
    oldest policy acts; the others are told they are ignored."""
    active_name = active_policy(snap.policies)
    gpu_nodes = sum(1 for n in snap.nodes if is_gpu_node(n))
    nfd = nfd_present(snap.nodes)
    status: list[Action] = []
    releases: list[Action] = []  # finalizers to remove
    uninstall = False
    for policy in snap.policies:
        meta = policy["metadata"]
        if meta.get("deletionTimestamp"):
            if FINALIZER in (meta.get("finalizers") or ()):
                releases.append(_finalizer_patch(policy, add=False))
                uninstall = uninstall or active_name is None
        elif active_name is not None and meta["name"] != active_name:
            observation = Observation(
                namespace=config.namespace,
                generation=int(meta.get("generation") or 0),
                gpu_nodes=gpu_nodes,
                nfd_present=nfd,
                ignored_because=active_name,
            )
            status += _status_actions(policy, observation, snap.stamp, config)[0]

    active = next((p for p in snap.policies if p["metadata"]["name"] == active_name), None)
    if active is None:
        labels, memory, _ = _node_stage(snap, memory, None, uninstall=uninstall)
        # Node cleanup must be complete before the finalizer that guards it comes off.
        stages = [labels, Stage(tuple(status), concurrent=False)]
        stages.append(Stage(tuple(releases), concurrent=False, after_success=uninstall))
        return Decision(memory, _nonempty(stages), gauges=Gauges(gpu_nodes=gpu_nodes))
    if FINALIZER not in (active["metadata"].get("finalizers") or ()):
        # Everything else waits for the update this causes (it carries the new version).
        stage = Stage((_finalizer_patch(active, add=True),))
        return Decision(memory, (stage,), gauges=Gauges(gpu_nodes=gpu_nodes))
    tail = [Stage(tuple(status), concurrent=False), Stage(tuple(releases), concurrent=False)]
    return _decide_active(snap, memory, config, active, gpu_nodes, nfd, tail)


def _decide_active(
    snap: Snapshot,
    memory: Memory,
    config: OperatorConfig,
    policy: Mapping[str, Any],
    gpu_nodes: int,
    nfd: bool,
    tail: list[Stage],
) -> Decision:
    meta = policy["metadata"]
    base = Observation(
        namespace=config.namespace,
        generation=int(meta.get("generation") or 0),
        gpu_nodes=gpu_nodes,
        nfd_present=nfd,
    )
    try:
        spec = parse_spec(policy.get("spec"))
    except PolicyError as err:  # reported; nothing is applied and no node is touched
        invalid = replace(base, problems=tuple(err.problems))
        stages = [Stage(tuple(_status_actions(policy, invalid, snap.stamp, config)[0])), *tail]
        return Decision(
            memory, _nonempty(stages), gauges=Gauges(gpu_nodes=gpu_nodes, policy_ready=False)
        )

    facts = gather_facts(
        snap.nodes,
        spec,
        namespace=config.namespace,
        configmap_hashes=snap.configmap_hashes,
        mps_configmaps=snap.mps_configmaps,
        configmap_keys=snap.configmap_keys,
        operator_image=config.operator_image,
        image_env=config.image_env,
        simulate_gpus=config.simulate_gpus,
    )
    if spec.driver.use_nvidia_driver_crd:
        shared = handover_pending(snap.nodes, snap.daemonsets, snap.pods)
    else:
        shared = handback_pending(snap.nodes, snap.daemonsets)
    facts = replace(facts, driver_handover=shared)
    # With useNvidiaDriverCRD each NVIDIADriver upgrades its own pool (nvidiadriver.decide).
    own_driver = spec.driver.enabled and not spec.driver.use_nvidia_driver_crd
    previous = Rollout.from_status(
        ((policy.get("status") or {}).get("upgrade") or {}).get("rollout")
    )
    settings = settings_of(spec.driver.to_wire())
    retry = retry_requested(policy)
    on_stable = own_driver and renders_stable(previous, settings, retry)
    owner = Owner(API_VERSION, KIND, meta["name"], meta["uid"])

    def render(stable: bool) -> tuple[list[dict[str, Any]], Any, list[Any]]:
        chosen = _on_settings(spec, previous.stable_spec) if stable and previous else spec
        parts = render_components(chosen, facts)
        desired = stamp((o for p in parts for o in p.objects), owner)
        changes = plan_changes(
            desired, snap.managed, memory.applied_generations, APPLIED_KINDS | snap.served_optional
        )
        return desired, changes, parts

    desired, changes, parts = render(on_stable)
    fleet = fleet_from_objects(
        snap.nodes, snap.daemonsets, snap.pods, snap.revisions, snap.workload_pods
    )
    rollout = None
    if own_driver:
        upgrade_policy = spec.driver.upgrade_policy
        rollout = decide_rollout(
            previous,
            CanaryPolicy.from_spec(upgrade_policy.canary if upgrade_policy else None),
            settings,
            progress(fleet),
            {n.name: n.gpu_health for n in snap.nodes},
            retry=retry,
            now=snap.now,
            synced=drivers_synced(desired, changes.apply, snap.daemonsets),
        )
        if rollout.render_stable != on_stable:
            desired, changes, parts = render(rollout.render_stable)
    applies = changes.apply
    object_stages = [
        Stage(tuple(Apply(o) for o in applies if o["kind"] != "DaemonSet")),
        # DaemonSets after what they use (ServiceAccounts, RBAC, ConfigMaps).
        Stage(tuple(Apply(o) for o in applies if o["kind"] == "DaemonSet")),
        Stage(tuple(Prune(k) for k in changes.prune)),
    ]
    labels, memory, relabelled = _node_stage(snap, memory, node_policy(spec), uninstall=False)
    upgrade = None
    upgrade_steps = Stage(())
    if rollout is not None:
        limits = Policy.from_spec(spec.driver.upgrade_policy)
        upgrade = plan(fleet, limits, snap.now, rollout.allowed)
        about = {"apiVersion": API_VERSION, "kind": KIND, **policy}
        notices = rollout_actions(rollout, about, snap.stamp, config)
        upgrade_steps = upgrade_stage(upgrade, snap, config, notices)
    health = plan_remediation(spec, snap, fleet, memory, gpu_nodes)
    health_stage, memory = remediation_stage(health, snap, memory, config)

    pods_by_owner = by_owner(snap.pods)
    revisions_by_owner = by_owner(snap.revisions)
    labelled = _labelled_after(snap.nodes, relabelled)
    kinds = NodeKinds(labelled, map(daemonset_pod_spec, snap.daemonsets))
    # A DaemonSet of ours updated in this pass has a rollout ahead of it, whatever its status
    # says now.
    ours = {o.key for o in snap.managed}
    rolling = {
        o["metadata"]["name"] for o in applies if o["kind"] == "DaemonSet" and key_of(o) in ours
    }
    components = {
        part.component.name: [
            replace(r, ready=False, message="rollout starting") if r.name in rolling else r
            for r in component_readiness(
                part.component.name, snap.daemonsets, pods_by_owner, revisions_by_owner, kinds
            )
        ]
        for part in parts
        if part.enabled
    }
    observation = replace(
        base,
        components=components,
        apply_error=memory.apply_error,
        unimplemented=tuple(spec.unimplemented_enabled()),
        upgrade=_upgrade_status(upgrade, rollout) if upgrade and rollout else None,
        health=remediation_status(health.summary),
        dra_conflicts=tuple(sorted(snap.dra_conflicts)) if spec.device_plugin.enabled else (),
        not_served=tuple(f"{kind} {namespace}/{name}" for kind, namespace, name in changes.skipped),
    )
    status_actions, status = _status_actions(policy, observation, snap.stamp, config)
    # Nodes first: the DaemonSets only schedule on labelled nodes, and the API server is quiet
    # before their thousands of pods start coming.
    stages = [
        labels,
        *object_stages,
        upgrade_steps,
        health_stage,
        Stage(tuple(status_actions)),
        *tail,
    ]
    gauges = Gauges(
        gpu_nodes=gpu_nodes,
        components_ready={name: all(s.ready for s in sets) for name, sets in components.items()},
        policy_ready=status["state"] == "ready",
        upgrade=upgrade.summary if upgrade else None,
        health=health.summary,
    )
    deadlines = [
        d
        for d in (
            upgrade and upgrade.next_deadline,
            rollout and rollout.deadline,
            health.next_deadline,
        )
        if d
    ]
    return Decision(
        memory,
        _nonempty(stages),
        requeue_at=min(deadlines, default=None),
        gauges=gauges,
        reconciled=True,
    )


def _nonempty(stages: Iterable[Stage]) -> tuple[Stage, ...]:
    return tuple(s for s in stages if s.actions)


def _finalizer_patch(policy: Mapping[str, Any], *, add: bool) -> Patch:
    body = finalizer_body(policy, FINALIZER, add=add)
    return Patch(KIND, policy["metadata"]["name"], body, "finalizer")


def _node_stage(
    snap: Snapshot, memory: Memory, policy: NodePolicy | None, *, uninstall: bool
) -> tuple[Stage, Memory, dict[str, Mapping[str, str | None]]]:
    """Label and taint patches: for every node when the node policy changed (or on a full
    look), else only for nodes that changed since the last pass; never for a node whose last
    patch the watch has not shown yet (one write per node, not one per pass). With them, the
    labels each patched node gets (a value) or loses (None)."""
    same_policy = memory.node_policy_known and memory.node_policy == policy
    everything = uninstall or not same_policy or snap.changed_nodes is None
    changed = snap.changed_nodes or frozenset()
    unseen = {
        n.name: n.resource_version
        for n in snap.nodes
        if memory.patched_nodes.get(n.name) == n.resource_version
    }
    patches = []
    relabelled: dict[str, Mapping[str, str | None]] = {}
    for node in snap.nodes:
        if node.name in unseen and not uninstall:  # (the finalizer waits for every node)
            continue
        if not (everything or node.name in changed):
            continue
        patch = plan_node(node, policy, uninstall=uninstall)
        if patch is not None:
            body = patch.to_json_patch()
            patches.append(Patch("Node", node.name, body, "labels", patch_type="json"))
            relabelled[node.name] = patch.labels
            unseen[node.name] = node.resource_version
    remembered = replace(
        memory, node_policy=policy, node_policy_known=not uninstall, patched_nodes=unseen
    )
    return Stage(tuple(patches)), remembered, relabelled


def _labelled_after(
    nodes: Sequence[NodeView], relabelled: Mapping[str, Mapping[str, str | None]]
) -> tuple[NodeView, ...]:
    """The nodes with the labels this pass's patches give them: readiness expects a pod on
    every node labelled for a component, including the nodes labelled just now."""
    if not relabelled:
        return tuple(nodes)
    return tuple(
        replace(
            node,
            labels={
                k: v for k, v in {**node.labels, **relabelled[node.name]}.items() if v is not None
            },
        )
        if node.name in relabelled
        else node
        for node in nodes
    )


def _on_settings(spec: ClusterPolicySpec, settings: Mapping[str, Any] | None) -> ClusterPolicySpec:
    """``spec`` with its driver on ``settings`` (under today's upgrade policy)."""
    if settings is None:
        return spec
    wire = with_settings(settings, spec.driver.upgrade_policy)
    return spec.model_copy(update={"driver": DriverSpec.model_validate(wire)})


def _upgrade_status(upgrade: UpgradePlan, rollout: RolloutDecision) -> dict[str, Any]:
    s = upgrade.summary
    return {
        "rollout": rollout.rollout.to_status(iso_time),
        "total": s.total,
        "done": s.done,
        "inProgress": s.in_progress,
        "failed": s.failed,
        "pending": s.pending,
        "message": upgrade.line,
    }


def _status_actions(
    policy: Mapping[str, Any], observation: Observation, now: str, config: OperatorConfig
) -> tuple[list[Action], dict[str, Any]]:
    """The new status; its patch when it changes, and an Event when the Ready reason does."""
    current = policy.get("status") or {}
    new = compute_status(observation, current, now)
    if new == current:
        return [], new
    name = policy["metadata"]["name"]
    body = {"status": merge_patch_to(current, new)}  # exactly ``new``: stale keys go too
    actions: list[Action] = [Patch(KIND, name, body, "status", subresource="status")]
    ready = new["conditions"][0]
    previous = (current.get("conditions") or [{}])[0].get("reason")
    if ready["reason"] != previous:
        etype = "Warning" if ready["reason"] == "ReconcileFailed" else "Normal"
        about = {"apiVersion": API_VERSION, "kind": KIND, **policy}
        message = ready["message"] or new["state"]
        actions.append(Create(object_event(about, etype, ready["reason"], message, now, config)))
    return actions, new
