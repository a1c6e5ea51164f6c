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
from gpu_operator.controller.clusterpolicy.move_stage import (
    move_limits,
    move_stage,
    plan_workload_moves,
)
from gpu_operator.controller.clusterpolicy.remediation_stage import (
    plan_remediation,
    remediation_stage,
    remediation_status,
)
from gpu_operator.controller.clusterpolicy.status import (
    WORKLOAD_CONFIG_INVALID,
    Observation,
    compute_status,
    workload_problems_message,
)
from gpu_operator.controller.notices import object_event
from gpu_operator.controller.pools import handback_pending, handover_pending
from gpu_operator.controller.readiness import (
    DaemonSetReadiness,
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
from gpu_operator.controller.runtime.plan import ObjectChanges, Owner, key_of, plan_changes, stamp
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.controller.upgrade_stage import upgrade_stage
from gpu_operator.events import iso_time
from gpu_operator.jsonpatch import finalizer_body, merge_patch_to
from gpu_operator.labels import NODE_CLEANUP_FINALIZER
from gpu_operator.node_labels import (
    Move,
    NodePolicy,
    is_gpu_node,
    plan_node,
    workload_problem,
)
from gpu_operator.remediation import HealthPlan, HealthSummary
from gpu_operator.render import RenderedComponent, render_components
from gpu_operator.render.facts import Facts
from gpu_operator.upgrade import (
    Fleet,
    Policy,
    Summary,
    UpgradePlan,
    fleet_from_objects,
    plan,
)
from gpu_operator.upgrade.canary import CanaryPolicy, Rollout, RolloutDecision, decide_rollout
from gpu_operator.upgrade.planner import progress
from gpu_operator.views import NodeView
from gpu_operator.workload_move import MoveLimits

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
        moves, memory, _ = _move_step(snap, memory, config, None, MoveLimits())
        labels, memory, _ = _node_stage(snap, memory, None, uninstall=uninstall)
        # Node cleanup must be complete before the finalizer that guards it comes off.
        stages = [moves, labels, Stage(tuple(status), concurrent=False)]
        stages.append(Stage(tuple(releases), concurrent=False, after_success=uninstall))
        return Decision(memory, _nonempty(stages), gauges=Gauges(gpu_nodes=gpu_nodes))
    if FINALIZER not in (active["metadata"].get("finalizers") or ()):
        # Everything else waits for the update this causes (it carries the new version).
        stage = Stage((_finalizer_patch(active, add=True),))
        return Decision(memory, (stage,), gauges=Gauges(gpu_nodes=gpu_nodes))
    tail = [Stage(tuple(status), concurrent=False), Stage(tuple(releases), concurrent=False)]
    return _decide_active(snap, memory, config, active, gpu_nodes, nfd, tail)


@dataclass(frozen=True)
class Active:
    """What every step of deciding the active policy reads, gathered once per pass: the
    snapshot, the memory and config the pass began with, the policy and its spec, its status
    basics, and what its render and driver rollout start from. A step returns what it decides
    and changes none of it, so the steps can be read, and tested, one at a time."""

    snap: Snapshot
    memory: Memory  # as the pass began; the node and health steps return the memory after them
    config: OperatorConfig
    policy: Mapping[str, Any]
    spec: ClusterPolicySpec
    base: Observation  # namespace, generation, GPU nodes, NFD
    facts: Facts  # what the render reads of the cluster
    fleet: Fleet  # what the upgrade and health planners read of it
    previous: Rollout | None  # the driver rollout as the policy's status last told it
    settings: dict[str, Any]  # the driver settings a rollout carries
    retry: bool  # a retry of a failed rollout is asked for

    @property
    def own_driver(self) -> bool:
        """Whether the policy upgrades a driver of its own; with useNvidiaDriverCRD each
        NVIDIADriver upgrades its own pool (:mod:`gpu_operator.controller.nvidiadriver`)."""
        return self.spec.driver.enabled and not self.spec.driver.use_nvidia_driver_crd

    @property
    def owner(self) -> Owner:
        meta = self.policy["metadata"]
        return Owner(API_VERSION, KIND, meta["name"], meta["uid"])


@dataclass(frozen=True)
class Rendered:
    """One render of the active policy: the objects stamped with their owner, what of them
    differs from the server, and the components they came from (for readiness)."""

    desired: list[dict[str, Any]]
    changes: ObjectChanges
    parts: list[RenderedComponent]


def _decide_active(
    snap: Snapshot,
    memory: Memory,
    config: OperatorConfig,
    policy: Mapping[str, Any],
    gpu_nodes: int,
    nfd: bool,
    tail: list[Stage],
) -> Decision:
    """The active policy's pass, step by step: render (on the settings its driver rollout
    picks), label the nodes, upgrade the driver, remediate GPU health, and the status that
    tells how it all stands. An invalid spec is reported, and nothing else is done."""
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

    nodes = node_policy(spec)
    base = replace(
        base,
        workload_problems=_workload_problems(snap.nodes, nodes),
        workload_moves=_workload_moves(snap.nodes),
    )
    active = _active(snap, memory, config, policy, spec, base)
    rendered, rollout = _render_and_roll_out(active)
    limits = move_limits(Policy.from_spec(spec.driver.upgrade_policy))
    moves, memory, moves_deadline = _move_step(snap, memory, config, nodes, limits)
    labels, memory, relabelled = _node_stage(snap, memory, nodes, uninstall=False)
    upgrade, driver_upgrade = _upgrade_step(active, rollout)
    health, health_stage, memory = _health_step(active, memory)
    components = _components(active, rendered, relabelled)
    status_stage, status = _status_step(
        active, memory, rendered, components, upgrade, rollout, health
    )
    # Nodes first: the DaemonSets only schedule on labelled nodes, and the API server is quiet
    # before their thousands of pods start coming.
    stages = [
        moves,
        labels,
        *_object_stages(rendered.changes),
        driver_upgrade,
        health_stage,
        status_stage,
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
            moves_deadline,
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


def _active(
    snap: Snapshot,
    memory: Memory,
    config: OperatorConfig,
    policy: Mapping[str, Any],
    spec: ClusterPolicySpec,
    base: Observation,
) -> Active:
    """The context of the active policy's steps, each part read from the snapshot once."""
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
    return Active(
        snap=snap,
        memory=memory,
        config=config,
        policy=policy,
        spec=spec,
        base=base,
        facts=replace(facts, driver_handover=shared),
        fleet=fleet_from_objects(
            snap.nodes, snap.daemonsets, snap.pods, snap.revisions, snap.workload_pods
        ),
        previous=Rollout.from_status(
            ((policy.get("status") or {}).get("upgrade") or {}).get("rollout")
        ),
        settings=settings_of(spec.driver.to_wire()),
        retry=retry_requested(policy),
    )


def _render(active: Active, stable: bool) -> Rendered:
    """The policy's objects, its driver on the last good settings when ``stable`` (a failed
    rollout rolled back or held), and what of them differs from the server."""
    spec, previous, snap = active.spec, active.previous, active.snap
    chosen = _on_settings(spec, previous.stable_spec) if stable and previous else spec
    parts = render_components(chosen, active.facts)
    desired = stamp((o for p in parts for o in p.objects), active.owner)
    changes = plan_changes(
        desired,
        snap.managed,
        active.memory.applied_generations,
        APPLIED_KINDS | snap.served_optional,
    )
    return Rendered(desired, changes, parts)


def _render_and_roll_out(active: Active) -> tuple[Rendered, RolloutDecision | None]:
    """The render and the driver rollout depend on each other: the rollout asks whether the
    drivers rendered are on the server yet, and picks the settings to render (the spec's, or
    the last good ones). So: render as the last pass did, decide the rollout, and render
    again if it moved."""
    on_stable = active.own_driver and renders_stable(active.previous, active.settings, active.retry)
    rendered = _render(active, on_stable)
    rollout = _rollout(active, rendered)
    if rollout is not None and rollout.render_stable != on_stable:
        rendered = _render(active, rollout.render_stable)
    return rendered, rollout


def _rollout(active: Active, rendered: Rendered) -> RolloutDecision | None:
    """The policy's own driver rollout behind its canary; None without a driver of its own."""
    if not active.own_driver:
        return None
    snap = active.snap
    upgrade_policy = active.spec.driver.upgrade_policy
    return decide_rollout(
        active.previous,
        CanaryPolicy.from_spec(upgrade_policy.canary if upgrade_policy else None),
        active.settings,
        progress(active.fleet),
        {n.name: n.gpu_health for n in snap.nodes},
        retry=active.retry,
        now=snap.now,
        synced=drivers_synced(rendered.desired, rendered.changes.apply, snap.daemonsets),
    )


def _object_stages(changes: ObjectChanges) -> list[Stage]:
    """The applies, DaemonSets after what they use (ServiceAccounts, RBAC, ConfigMaps), then
    the prunes."""
    return [
        Stage(tuple(Apply(o) for o in changes.apply if o["kind"] != "DaemonSet")),
        Stage(tuple(Apply(o) for o in changes.apply if o["kind"] == "DaemonSet")),
        Stage(tuple(Prune(k) for k in changes.prune)),
    ]


def _upgrade_step(
    active: Active, rollout: RolloutDecision | None
) -> tuple[UpgradePlan | None, Stage]:
    """The driver upgrade's plan within what the rollout allows, and its stage, the rollout's
    own Events first; nothing without a rollout."""
    if rollout is None:
        return None, Stage(())
    snap, config = active.snap, active.config
    limits = Policy.from_spec(active.spec.driver.upgrade_policy)
    upgrade = plan(active.fleet, limits, snap.now, rollout.allowed)
    about = {"apiVersion": API_VERSION, "kind": KIND, **active.policy}
    notices = rollout_actions(rollout, about, snap.stamp, config)
    return upgrade, upgrade_stage(upgrade, snap, config, notices)


def _health_step(active: Active, memory: Memory) -> tuple[HealthPlan, Stage, Memory]:
    """GPU health remediation: its plan, its stage, and the memory with the nodes it writes.
    ``memory`` is the node step's: a node whose label patch the watch does not show yet waits
    a pass."""
    snap = active.snap
    health = plan_remediation(active.spec, snap, active.fleet, memory, active.base.gpu_nodes)
    stage, memory = remediation_stage(health, snap, memory, active.config)
    return health, stage, memory


def _components(
    active: Active, rendered: Rendered, relabelled: Mapping[str, Mapping[str, str | None]]
) -> dict[str, list[DaemonSetReadiness]]:
    """Each enabled component's DaemonSets' readiness, on the nodes as this pass labels them."""
    snap = active.snap
    pods_by_owner = by_owner(snap.pods)
    revisions_by_owner = by_owner(snap.revisions)
    labelled = _labelled_after(snap.nodes, relabelled)
    kinds = NodeKinds(labelled, map(daemonset_pod_spec, snap.daemonsets))
    # A DaemonSet of ours updated in this pass has a rollout ahead of it, whatever its status
    # says now.
    ours = {o.key for o in snap.managed}
    rolling = {
        o["metadata"]["name"]
        for o in rendered.changes.apply
        if o["kind"] == "DaemonSet" and key_of(o) in ours
    }
    return {
        part.component.name: [
            replace(r, ready=False, message="rollout starting") if r.name in rolling else r
            for r in component_readiness(
                part.component.name, snap.daemonsets, pods_by_owner, revisions_by_owner, kinds
            )
        ]
        for part in rendered.parts
        if part.enabled
    }


def _status_step(
    active: Active,
    memory: Memory,
    rendered: Rendered,
    components: Mapping[str, Sequence[DaemonSetReadiness]],
    upgrade: UpgradePlan | None,
    rollout: RolloutDecision | None,
    health: HealthPlan,
) -> tuple[Stage, dict[str, Any]]:
    """The policy's status from all the pass decided, and the stage that writes it (its patch,
    and an Event when the Ready reason changes) when it changes."""
    spec, snap = active.spec, active.snap
    observation = replace(
        active.base,
        components=components,
        apply_error=memory.apply_error,
        unimplemented=tuple(spec.unimplemented_enabled()),
        upgrade=_upgrade_status(upgrade, rollout) if upgrade and rollout else None,
        health=remediation_status(health.summary),
        dra_conflicts=tuple(sorted(snap.dra_conflicts)) if spec.device_plugin.enabled else (),
        not_served=tuple(
            f"{kind} {namespace}/{name}" for kind, namespace, name in rendered.changes.skipped
        ),
    )
    actions, status = _status_actions(active.policy, observation, snap.stamp, active.config)
    return Stage(tuple(actions)), status


def _nonempty(stages: Iterable[Stage]) -> tuple[Stage, ...]:
    return tuple(s for s in stages if s.actions)


def _finalizer_patch(policy: Mapping[str, Any], *, add: bool) -> Patch:
    body = finalizer_body(policy, FINALIZER, add=add)
    return Patch(KIND, policy["metadata"]["name"], body, "finalizer")


def _move_step(
    snap: Snapshot,
    memory: Memory,
    config: OperatorConfig,
    nodes: NodePolicy | None,
    limits: MoveLimits,
) -> tuple[Stage, Memory, float | None]:
    """Workload moves: GPU nodes whose workload config changed, cordoned and drained before
    their stacks are swapped. First in the pass: a node it writes waits for the watch before
    its labels follow the new record."""
    plan = plan_workload_moves(snap, memory, nodes, limits)
    stage, memory = move_stage(plan, snap, memory, config)
    return stage, memory, plan.next_deadline


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


def _workload_problems(
    nodes: Sequence[NodeView], policy: NodePolicy
) -> tuple[tuple[str, str], ...]:
    """GPU nodes whose workload config label cannot be used, and why."""
    return tuple(
        (node.name, why) for node in nodes if (why := workload_problem(node, policy)) is not None
    )


def _workload_moves(nodes: Sequence[NodeView]) -> tuple[tuple[str, str], ...]:
    """GPU nodes moving between workload stacks, and where each move is."""
    found = []
    for node in nodes:
        move = Move.parse(node.annotations)
        if move is not None:
            where = f"{move.source} -> {move.target}, {move.phase.value}"
            found.append((node.name, where + (f" ({move.blocked})" if move.blocked else "")))
    return tuple(found)


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
    actions += _workload_events(current, observation, now, config)
    return actions, new


def _workload_events(
    current: Mapping[str, Any], observation: Observation, now: str, config: OperatorConfig
) -> list[Action]:
    """A Warning on each node whose invalid workload config the status did not report yet
    (once per problem, not once per pass: the status remembers what was told)."""
    told = next(
        (
            c.get("message") or ""
            for c in current.get("conditions") or []
            if c.get("type") == WORKLOAD_CONFIG_INVALID
        ),
        "",
    )
    actions: list[Action] = []
    for node, why in observation.workload_problems:
        if workload_problems_message([(node, why)]) in told:
            continue
        about = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
        actions.append(
            Create(object_event(about, "Warning", "InvalidWorkloadConfig", why, now, config))
        )
    return actions
