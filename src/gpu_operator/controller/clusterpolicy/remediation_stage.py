"""The ClusterPolicy pass's GPU health remediation (pure): the planner's view of the fleet,
its steps as API actions, and its status summary."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpu_operator.api import ClusterPolicySpec
from gpu_operator.controller.clusterpolicy.memory import Memory
from gpu_operator.controller.nodeops_stage import node_request
from gpu_operator.controller.runtime.actions import Action, Patch, Stage
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.labels import UPGRADE_STATE
from gpu_operator.node_labels import is_gpu_node
from gpu_operator.remediation import (
    HealthNode,
    HealthPlan,
    HealthPolicy,
    HealthSummary,
    Quarantine,
    Release,
    SetPhase,
    plan_health,
)
from gpu_operator.upgrade import IN_PROGRESS, Fleet, State


def plan_remediation(
    spec: ClusterPolicySpec, snap: Snapshot, fleet: Fleet, memory: Memory, gpu_nodes: int
) -> HealthPlan:
    """The health remediation's next steps; nodes whose last write the watch has not shown
    yet wait a pass (one write per change, never two planned from the same read)."""
    drivers: dict[str, list[Any]] = {}
    for pod in fleet.driver_pods:
        drivers.setdefault(pod.node, []).append(pod)
    pods: dict[str, list[Any]] = {}
    for pod in fleet.workload_pods:
        pods.setdefault(pod.node, []).append(pod)
    mid_upgrade = {s.value for s in IN_PROGRESS}
    holding_cordon = mid_upgrade | {State.FAILED.value}
    nodes = [
        HealthNode(
            n,
            pods=tuple(pods.get(n.name, ())),
            drivers=tuple(drivers.get(n.name, ())),
            upgrading=n.labels.get(UPGRADE_STATE, "") in holding_cordon,
            mid_upgrade=n.labels.get(UPGRADE_STATE, "") in mid_upgrade,
            pending=memory.patched_nodes.get(n.name) == n.resource_version,
        )
        for n in snap.nodes
        if is_gpu_node(n) or n.gpu_health is not None or HealthNode(n).phase is not None
    ]
    return plan_health(
        nodes, HealthPolicy.from_spec(spec.health_remediation), snap.now, gpu_nodes=gpu_nodes
    )


def remediation_stage(
    health: HealthPlan, snap: Snapshot, memory: Memory, config: OperatorConfig
) -> tuple[Stage, Memory]:
    """The planner's steps as API actions, each node's in order (its later steps are skipped
    once one of its writes fails); nodes written are remembered until the watch shows them."""
    actions: list[Action] = []
    groups: list[str] = []
    written: dict[str, str] = {}
    for index, step in enumerate(health.actions):
        tally = health.tallies.get(index)
        count = ("remediations", tally.action, tally.outcome) if tally else None
        request: Action
        if isinstance(step, (Quarantine, SetPhase, Release)):
            name = step.node.name
            request = Patch("Node", name, step.patch(), "health", patch_type="json", tally=count)
            written[name] = step.node.resource_version
        else:
            name = step.node
            request = node_request(step, snap, config, purpose="health", tally=count)
        actions.append(request)
        groups.append(name)
    remembered = replace(memory, patched_nodes={**memory.patched_nodes, **written})
    return Stage(tuple(actions), concurrent=False, groups=tuple(groups)), remembered


def remediation_status(summary: HealthSummary) -> dict[str, Any] | None:
    """Shown once remediation is on or holds a node (NVIDIA's documents: no new field)."""
    if not summary.enabled and not summary.quarantined:
        return None
    return {
        "enabled": summary.enabled,
        "unhealthy": summary.unhealthy,
        "quarantined": summary.quarantined,
        "limit": summary.limit,
        "held": list(summary.held),
        "message": summary.line,
    }
