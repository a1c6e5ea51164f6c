"""The NVIDIADriver pass's decisions (pure): one snapshot in, every write out.

With ``driver.useNvidiaDriverCRD: true`` in the active ClusterPolicy, each NVIDIADriver drives
its pool of GPU nodes (``controller.pools``): one DaemonSet per OS (and kernel, for precompiled
drivers) among them, its upgrades under its own ``upgradePolicy`` through the fleet planner,
and its status. Upgrades of all pools together stay within the ClusterPolicy's own
``driver.upgradePolicy`` limits when it sets them (the cluster-wide budget). Without the flag
every NVIDIADriver is ``ignored`` and owns nothing. With the flag and no NVIDIADriver at all,
a ``default`` one is created from the ClusterPolicy's ``driver`` section, as NVIDIA's chart
does, so switching the flag on keeps the driver version and settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.api import ClusterPolicySpec, PolicyError, parse_spec
from gpu_operator.api import nvidiadriver as api
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec, parse_driver_spec
from gpu_operator.controller.active_policy import active_policy
from gpu_operator.controller.conditions import UPGRADE_FAILED, condition, upgrade_failed
from gpu_operator.controller.pools import (
    Assignment,
    DriverSelector,
    HandBack,
    assign,
    hand_back,
    label_patch,
    legacy_driver_nodes,
    pool_driver_ready,
    pools_with_driver,
    seen_in_pools,
)
from gpu_operator.controller.readiness import by_owner, daemonset_readiness
from gpu_operator.controller.rollout_stage import (
    drivers_synced,
    renders_stable,
    retry_requested,
    rollout_actions,
    settings_of,
    with_settings,
)
from gpu_operator.controller.runtime.actions import Action, Apply, Create, Patch, Prune, Stage
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.plan import Observed, Owner, plan_changes, stamp
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.controller.upgrade_stage import upgrade_stage
from gpu_operator.events import event_body, iso_time
from gpu_operator.jsonpatch import merge_patch_to
from gpu_operator.node_labels import is_gpu_node
from gpu_operator.render.driver import (
    POOL_LABEL,
    ExtraConfig,
    Pool,
    driver_names,
    render_driver,
)
from gpu_operator.upgrade import Policy, UpgradePlan, fleet_from_objects, plan
from gpu_operator.upgrade.canary import CanaryPolicy, Rollout, RolloutDecision, decide_rollout
from gpu_operator.upgrade.model import scaled_max_unavailable
from gpu_operator.upgrade.planner import progress

EVENT_SOURCE = "gpu-operator"
DRIVER_KINDS = frozenset(
    {"ConfigMap", "DaemonSet", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
     "ClusterRoleBinding"}
)  # fmt: skip


@dataclass(frozen=True)
class DriverSnapshot:
    """What an NVIDIADriver pass decides from; ``base`` is the ClusterPolicy loop's snapshot
    shape (nodes, DaemonSets, pods, revisions, workload pods, ClusterPolicies)."""

    base: Snapshot
    drivers: tuple[Mapping[str, Any], ...]
    managed: tuple[Observed, ...] = ()  # objects owned by NVIDIADrivers
    configmap_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolUpgrade:
    driver: str
    plan: UpgradePlan


@dataclass(frozen=True)
class DriverDecision:
    stages: tuple[Stage, ...] = ()
    requeue_at: float | None = None
    upgrades: tuple[PoolUpgrade, ...] = ()
    assignment: Assignment | None = None

    @property
    def actions(self) -> list[Action]:
        return [a for s in self.stages for a in s.actions]


def decide_drivers(snap: DriverSnapshot, config: OperatorConfig) -> DriverDecision:
    """The NVIDIADriver loop's judgement, pure: which pool each GPU node belongs to, a driver
    DaemonSet per pool and node OS, each pool's rolling upgrade within its own limits, and
    the statuses; nothing while the active ClusterPolicy does not hand the driver to
    NVIDIADrivers (``driver.useNvidiaDriverCRD``), except to say they are ignored."""
    base = snap.base
    drivers = [d for d in snap.drivers if not d["metadata"].get("deletionTimestamp")]
    active = _active_policy(base)
    if active is None:
        return _ignored(snap, drivers, config, None)
    try:
        policy = parse_spec(active.get("spec"))
    except PolicyError:
        return DriverDecision()  # its status says what is wrong; nothing moves until it is fixed
    if not policy.driver.use_nvidia_driver_crd:
        return _ignored(snap, drivers, config, policy)
    if not snap.drivers:
        return DriverDecision((Stage((Create(default_driver(policy)),)),))

    specs: dict[str, NVIDIADriverSpec] = {}
    problems: dict[str, list[str]] = {}
    for driver in drivers:
        try:
            specs[driver["metadata"]["name"]] = parse_driver_spec(driver.get("spec"))
        except PolicyError as err:
            problems[driver["metadata"]["name"]] = err.problems
    gpu_nodes = seen_in_pools((n for n in base.nodes if is_gpu_node(n)), base.daemonsets, base.pods)
    selectors = [
        DriverSelector(
            name,
            dict(spec.node_selector or {}),
            spec.default,
            max(1, _pool_policy(spec, policy).max_parallel_upgrades),
        )
        for name, spec in specs.items()
    ]
    assignment = assign(
        gpu_nodes,
        selectors,
        legacy_driver_nodes=legacy_driver_nodes(base.nodes, base.daemonsets, base.pods),
        new_driver_ready=pool_driver_ready(gpu_nodes, base.daemonsets, base.pods),
        pools_with_driver=pools_with_driver(base.daemonsets),
    )
    by_name = {d["metadata"]["name"]: d for d in drivers}
    desired: list[dict[str, Any]] = []
    unpooled: dict[str, list[str]] = {}
    extra = ExtraConfig(
        namespace=config.namespace,
        configmap_keys=snap.configmap_keys,
        image_env=config.image_env,
        gpu_taint_key=policy.gpu_node_taint.key,
        quarantine_taint=policy.health_remediation.enabled,
    )
    nodes = {n.name: n for n in gpu_nodes}

    def render(name: str, spec: NVIDIADriverSpec) -> list[dict[str, Any]]:
        meta = by_name[name]["metadata"]
        owner = Owner(api.API_VERSION, api.KIND, name, meta["uid"])
        pools: dict[tuple[str, str | None], Pool] = {}
        unpooled.pop(name, None)
        problems.pop(name, None)
        out: list[dict[str, Any]] = []
        # Its nodes, and those still on their way out of it: its driver stays there until they
        # have moved (deleting its DaemonSet would take every one of them down at once).
        leaving = (n for n, v in nodes.items() if v.labels.get(POOL_LABEL) == name)
        for node_name in sorted({*assignment.nodes_of(name), *leaving}):
            pool = Pool.of_node(nodes[node_name].labels, bool(spec.use_precompiled), name)
            if pool is None:
                unpooled.setdefault(name, []).append(node_name)
                continue
            pools.setdefault((pool.os_tag, pool.kernel), pool)
        for _, pool in sorted(pools.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            names = driver_names(name, meta["uid"], spec, pool)
            try:
                objects = render_driver(spec, pool, names, extra)
            except ValueError as err:
                problems.setdefault(name, []).append(str(err))
                continue
            out += stamp(objects, owner)
        return out

    # Each NVIDIADriver's rollout (canary, rollback, hold: :mod:`gpu_operator.upgrade.canary`)
    # picks the settings its pools render: the spec's, or the last good ones.
    rollouts = _Rollouts(by_name, specs)
    rendered = {name: render(name, rollouts.spec_for(name)) for name in sorted(specs)}
    desired = [o for name in sorted(rendered) for o in rendered[name]]
    changes = plan_changes(desired, snap.managed, None, DRIVER_KINDS)
    rerender = rollouts.decide(snap, rendered, changes.apply, policy)
    if rerender:
        rendered.update({name: render(name, rollouts.spec_for(name)) for name in rerender})
        desired = [o for name in sorted(rendered) for o in rendered[name]]
        changes = plan_changes(desired, snap.managed, None, DRIVER_KINDS)
    object_stages = [
        Stage(tuple(Apply(o) for o in changes.apply if o["kind"] != "DaemonSet")),
        Stage(tuple(Apply(o) for o in changes.apply if o["kind"] == "DaemonSet")),
        Stage(tuple(Prune(k) for k in changes.prune)),
    ]
    labels = Stage(
        tuple(
            Patch("Node", node, label_patch(value), "labels")
            for node, value in sorted(assignment.label_patches.items())
        )
    )
    upgrades = _upgrades(snap, specs, policy, by_name, rollouts.allowed)
    upgrade_stages = [upgrade_stage(u.plan, base, config) for u in upgrades]
    upgrade_stages.append(Stage(tuple(rollouts.actions(base.stamp, config))))
    status: list[Action] = []
    for driver in drivers:
        name = driver["metadata"]["name"]
        status += _status_actions(
            driver,
            _driver_status(driver, snap, assignment, problems.get(name), unpooled.get(name),
                           next((u.plan for u in upgrades if u.driver == name), None), config,
                           rollouts.decisions.get(name)),
            base.stamp,
            config,
        )  # fmt: skip
    deadlines = [u.plan.next_deadline for u in upgrades if u.plan.next_deadline is not None]
    deadlines += [d.deadline for d in rollouts.decisions.values() if d.deadline is not None]
    stages = [*object_stages, labels, *upgrade_stages, Stage(tuple(status), concurrent=False)]
    return DriverDecision(
        tuple(s for s in stages if s.actions),
        requeue_at=min(deadlines) if deadlines else None,
        upgrades=tuple(upgrades),
        assignment=assignment,
    )


def _active_policy(base: Snapshot) -> Mapping[str, Any] | None:
    name = active_policy(base.policies)
    return next((p for p in base.policies if p["metadata"]["name"] == name), None)


def _ignored(
    snap: DriverSnapshot,
    drivers: Sequence[Mapping[str, Any]],
    config: OperatorConfig,
    policy: ClusterPolicySpec | None,
) -> DriverDecision:
    """Without the flag the ClusterPolicy drives every node: NVIDIADrivers own nothing once
    its driver has taken their nodes back (:func:`hand_back`; at once when it has no driver)."""
    base = snap.base
    if policy is not None and policy.driver.enabled:
        slots = max(1, Policy.from_spec(policy.driver.upgrade_policy).max_parallel_upgrades)
        back = hand_back(base.nodes, base.daemonsets, base.pods, slots)
    else:
        back = HandBack({n.name: None for n in base.nodes if POOL_LABEL in n.labels})
    labels = Stage(
        tuple(Patch("Node", n, label_patch(None), "labels") for n in sorted(back.label_patches))
    )
    prunes = Stage(tuple(Prune(o.key) for o in snap.managed) if back.released else ())
    message = ("the ClusterPolicy does not set driver.useNvidiaDriverCRD: true; its own driver "
               "section applies")  # fmt: skip
    if back.in_pools:
        message += f" (its driver is taking the nodes back: {len(back.in_pools)} still in a pool)"
    status: list[Action] = []
    for driver in drivers:
        new = {
            "state": "ignored",
            "namespace": config.namespace,
            "conditions": _conditions(
                driver,
                snap.base.stamp,
                ready=("False", "Ignored", message),
                error=None,
                selection=None,
            ),
        }
        status += _status_actions(driver, new, snap.base.stamp, config)
    return DriverDecision(tuple(s for s in (labels, prunes, Stage(tuple(status))) if s.actions))


def default_driver(policy: ClusterPolicySpec) -> dict[str, Any]:
    """The ``default`` NVIDIADriver: the ClusterPolicy's driver section, field for field."""
    spec = {"default": True, **api.spec_from_clusterpolicy(policy.driver)}
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": api.DEFAULT_NAME},
        "spec": spec,
    }


def _pool_policy(spec: NVIDIADriverSpec, policy: ClusterPolicySpec) -> Policy:
    """The CR's own upgradePolicy; absent, the ClusterPolicy's."""
    return Policy.from_spec(spec.upgrade_policy or policy.driver.upgrade_policy)


def _upgrades(
    snap: DriverSnapshot,
    specs: Mapping[str, NVIDIADriverSpec],
    policy: ClusterPolicySpec,
    by_name: Mapping[str, Mapping[str, Any]],
    allowed: Mapping[str, frozenset[str] | None],
) -> list[PoolUpgrade]:
    """Each pool's plan under its own policy, all pools within the cluster-wide budget.

    A first plan per pool measures what is in progress, unavailable and waiting; what is left
    of the cluster's maxParallelUpgrades and maxUnavailable (the ClusterPolicy's
    driver.upgradePolicy, when it sets one) is then shared out among the waiting pools.
    """
    base = snap.base
    fleets = {}
    policies = {}
    for name, spec in sorted(specs.items()):
        uid = by_name[name]["metadata"]["uid"]
        daemonsets = [d for d in base.daemonsets if uid in _owner_uids_of(d)]
        nodes = [n for n in base.nodes if n.labels.get(POOL_LABEL) == name]
        if not daemonsets or not nodes:
            continue
        fleets[name] = fleet_from_objects(
            nodes, daemonsets, base.pods, base.revisions, base.workload_pods
        )
        policies[name] = _pool_policy(spec, policy)
    first = {
        name: plan(fleets[name], policies[name], base.now, allowed.get(name)) for name in fleets
    }
    cluster = policy.driver.upgrade_policy
    parallel_left: float = float("inf")
    room_left: float = float("inf")
    if cluster is not None:
        limits = Policy.from_spec(cluster)
        total = sum(p.summary.total for p in first.values())
        busy = sum(p.summary.in_progress for p in first.values())
        unavailable = sum(p.summary.unavailable for p in first.values())
        if limits.max_parallel_upgrades:
            parallel_left = max(0, limits.max_parallel_upgrades - busy)
        room_left = max(0, scaled_max_unavailable(limits.max_unavailable, total) - unavailable)
    # New starts are shared out one at a time, pool by pool, so two pools that both wait
    # upgrade together instead of the first in name order taking the whole cluster budget.
    want = {n: min(p.summary.budget_slots, p.summary.pending) for n, p in first.items()}
    share = dict.fromkeys(first, 0)
    budget = min(parallel_left, room_left)
    while budget > 0 and any(share[n] < want[n] for n in share):
        for name in sorted(share):
            if budget > 0 and share[name] < want[name]:
                share[name] += 1
                budget -= 1
    out = []
    for name in sorted(fleets):
        summary = first[name].summary
        pool_policy = policies[name]
        if share[name] < want[name]:
            capped = summary.unavailable + share[name]
            pool_policy = replace(pool_policy, max_unavailable=capped)
        out.append(PoolUpgrade(name, plan(fleets[name], pool_policy, base.now, allowed.get(name))))
    return out


def _owner_uids_of(obj: Mapping[str, Any]) -> set[str]:
    return {r.get("uid", "") for r in (obj.get("metadata") or {}).get("ownerReferences") or ()}


def _driver_status(
    driver: Mapping[str, Any],
    snap: DriverSnapshot,
    assignment: Assignment,
    problems: Sequence[str] | None,
    unpooled: Sequence[str] | None,
    upgrade: UpgradePlan | None,
    config: OperatorConfig,
    rollout: RolloutDecision | None = None,
) -> dict[str, Any]:
    name = driver["metadata"]["name"]
    uid = driver["metadata"]["uid"]
    base = snap.base
    pods = by_owner(base.pods)
    revisions = by_owner(base.revisions)
    readiness = [
        daemonset_readiness(d, pods.get(d["metadata"]["uid"], ()),
                            revisions.get(d["metadata"]["uid"], ()))
        for d in base.daemonsets
        if uid in _owner_uids_of(d)
    ]  # fmt: skip
    conflicts = assignment.conflicts_of(name)
    error = None
    if problems:
        error = ("InvalidSpec", "; ".join(problems))
    elif conflicts:
        others = sorted({d for n in conflicts for d in assignment.conflicts[n]} - {name})
        error = (
            "NodeSelectorConflict",
            f"nodes selected by this and {', '.join(others)} get no driver until only one "
            f"selects them: {', '.join(conflicts)}",
        )
    nodes = assignment.nodes_of(name)
    not_ready = [r for r in readiness if not r.ready]
    if error is not None:
        ready = ("False", error[0], error[1])
    elif not nodes:
        ready = ("False", "NoNodes", "no GPU node is selected")
    elif unpooled:
        ready = ("False", "MissingNodeLabels", "nodes without the NFD OS labels (is NFD "
                 f"running?): {', '.join(unpooled)}")  # fmt: skip
    elif not readiness or not_ready:
        detail = "; ".join(f"{r.name}: {r.message}" for r in not_ready) or "rendering"
        ready = ("False", "DriverNotReady", detail)
    else:
        ready = ("True", "Ready", f"{len(nodes)} nodes in {len(readiness)} DaemonSets")
    unselected = assignment.unselected
    selection = (
        (
            "True",
            "NodesWithoutDriver",
            f"GPU nodes no NVIDIADriver selects: {', '.join(unselected)}",
        )
        if unselected
        else ("False", "AllNodesSelected", "")
    )
    status: dict[str, Any] = {
        "state": "ready" if ready[0] == "True" else "notReady",
        "namespace": config.namespace,
        "conditions": _conditions(
            driver, base.stamp, ready=ready, error=error, selection=selection
        ),
    }
    if upgrade is not None and upgrade.line:
        status["conditions"].append(
            condition(
                (driver.get("status") or {}).get("conditions") or [],
                "Upgrade",
                "True" if upgrade.summary.in_progress else "False",
                "InProgress" if upgrade.summary.in_progress else "Idle",
                upgrade.line,
                base.stamp,
                int(driver["metadata"].get("generation") or 0),
            )
        )
    if rollout is not None:
        status["rollout"] = rollout.rollout.to_status(iso_time)
        failed = upgrade_failed({"rollout": status["rollout"]})
        if failed is not None:
            previous = (driver.get("status") or {}).get("conditions") or []
            generation = int(driver["metadata"].get("generation") or 0)
            status["conditions"].append(
                condition(
                    previous, UPGRADE_FAILED, "True", "CanaryFailed", failed, base.stamp, generation
                )
            )
    return status


class _Rollouts:
    """Each NVIDIADriver's canary rollout in one pass: the settings to render, the decision
    (once the fleet is known), the nodes its plan may touch, its Events."""

    def __init__(
        self, by_name: Mapping[str, Mapping[str, Any]], specs: Mapping[str, NVIDIADriverSpec]
    ) -> None:
        self.by_name, self.specs = by_name, specs
        self.previous = {
            name: Rollout.from_status((by_name[name].get("status") or {}).get("rollout"))
            for name in specs
        }
        self.settings = {name: settings_of(spec.to_wire()) for name, spec in specs.items()}
        self.stable = {
            name: renders_stable(
                self.previous[name], self.settings[name], retry_requested(by_name[name])
            )
            for name in specs
        }
        self.decisions: dict[str, RolloutDecision] = {}

    def spec_for(self, name: str) -> NVIDIADriverSpec:
        previous = self.previous[name]
        if not self.stable[name] or previous is None or previous.stable_spec is None:
            return self.specs[name]
        wire = with_settings(previous.stable_spec, self.specs[name].upgrade_policy)
        return parse_driver_spec(wire)

    def decide(
        self,
        snap: DriverSnapshot,
        rendered: Mapping[str, Sequence[Mapping[str, Any]]],
        applies: Sequence[Mapping[str, Any]],
        policy: ClusterPolicySpec,
    ) -> list[str]:
        """Decide every pool's rollout; the names whose rendered settings must change."""
        base = snap.base
        health = {n.name: n.gpu_health for n in base.nodes}
        changed = []
        for name, spec in sorted(self.specs.items()):
            uid = self.by_name[name]["metadata"]["uid"]
            daemonsets = [d for d in base.daemonsets if uid in _owner_uids_of(d)]
            members = [n for n in base.nodes if n.labels.get(POOL_LABEL) == name]
            fleet = fleet_from_objects(
                members, daemonsets, base.pods, base.revisions, base.workload_pods
            )
            mine = {o["metadata"]["name"] for o in rendered[name]}
            upgrade_policy = spec.upgrade_policy
            decision = decide_rollout(
                self.previous[name],
                CanaryPolicy.from_spec(upgrade_policy.canary if upgrade_policy else None),
                self.settings[name],
                progress(fleet),
                health,
                retry=retry_requested(self.by_name[name]),
                now=base.now,
                synced=drivers_synced(
                    rendered[name],
                    [a for a in applies if a["metadata"]["name"] in mine],
                    daemonsets,
                ),
            )
            self.decisions[name] = decision
            if decision.render_stable != self.stable[name]:
                self.stable[name] = decision.render_stable
                changed.append(name)
        return changed

    @property
    def allowed(self) -> dict[str, frozenset[str] | None]:
        return {name: d.allowed for name, d in self.decisions.items()}

    def actions(self, stamp: str, config: OperatorConfig) -> list[Action]:
        out: list[Action] = []
        for name, decision in sorted(self.decisions.items()):
            about = {"apiVersion": api.API_VERSION, "kind": api.KIND, **self.by_name[name]}
            out += rollout_actions(decision, about, stamp, config)
        return out


def _conditions(
    driver: Mapping[str, Any],
    now: str,
    *,
    ready: tuple[str, str, str],
    error: tuple[str, str] | None,
    selection: tuple[str, str, str] | None,
) -> list[dict[str, Any]]:
    previous = (driver.get("status") or {}).get("conditions") or []
    generation = int(driver["metadata"].get("generation") or 0)
    out = [condition(previous, "Ready", *ready, now, generation)]
    err = ("True", *error) if error else ("False", "NoError", "")
    out.append(condition(previous, "Error", *err, now, generation))
    if selection is not None:
        out.append(condition(previous, "NodeSelection", *selection, now, generation))
    return out


def _status_actions(
    driver: Mapping[str, Any], new: dict[str, Any], now: str, config: OperatorConfig
) -> list[Action]:
    """The status patch when it changes, and a Warning Event when a problem appears."""
    current = driver.get("status") or {}
    if new == current:
        return []
    name = driver["metadata"]["name"]
    body = {"status": merge_patch_to(current, new)}  # exactly ``new``: stale keys go too
    actions: list[Action] = [Patch(api.KIND, name, body, "status", subresource="status")]
    before = {c["type"]: c for c in current.get("conditions") or []}
    about = {"apiVersion": api.API_VERSION, "kind": api.KIND, **driver}
    for cond in new["conditions"]:
        if cond["type"] not in ("Error", "NodeSelection") or cond["status"] != "True":
            continue
        old = before.get(cond["type"])
        if old and old.get("message") == cond["message"]:
            continue
        body = event_body(
            about, "Warning", cond["reason"], cond["message"],
            component=EVENT_SOURCE, instance=config.identity, stamp=now,
        )  # fmt: skip
        actions.append(Create(body))
    return actions
