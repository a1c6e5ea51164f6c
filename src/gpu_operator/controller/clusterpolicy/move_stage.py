"""The ClusterPolicy pass's workload moves (pure): the move planner's view of the GPU nodes
(:mod:`gpu_operator.workload_move`) and its steps as API actions."""

from __future__ import annotations

from dataclasses import replace

from gpu_operator.controller.clusterpolicy.memory import Memory
from gpu_operator.controller.nodeops_stage import node_request
from gpu_operator.controller.runtime.actions import Action, Patch, Stage
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.labels import COMPONENT, HEALTH_STATE
from gpu_operator.node_labels import Move, NodePolicy, is_gpu_node
from gpu_operator.nodeops.pods import Pod
from gpu_operator.upgrade import Policy
from gpu_operator.views import daemonset_owners
from gpu_operator.workload_move import MoveLimits, MoveNode, MovePlan, MoveStep, plan_moves


def move_limits(policy: Policy) -> MoveLimits:
    """A move drains as the driver upgrade's ``drain`` section says and waits as long for its
    new stack to validate."""
    return MoveLimits(
        force=policy.drain_force,
        drain_timeout_s=policy.drain_timeout_s,
        delete_empty_dir=policy.drain_delete_empty_dir,
        drain_all=policy.drain_enable,
        drain_selector=policy.drain_selector,
        settle_timeout_s=policy.validation_timeout_s,
    )


def plan_workload_moves(
    snap: Snapshot, memory: Memory, nodes: NodePolicy | None, limits: MoveLimits
) -> MovePlan:
    """The moves' next steps; a node whose last write the watch does not show yet waits a
    pass (its record would be planned twice from one read)."""
    components = {
        d["metadata"].get("uid", ""): (d["metadata"].get("labels") or {}).get(COMPONENT, "")
        for d in snap.daemonsets
    }
    operands: dict[str, list[tuple[str, Pod]]] = {}
    for raw in snap.pods:
        for uid in daemonset_owners(raw):
            if components.get(uid):
                pod = Pod.from_k8s(raw)
                operands.setdefault(pod.node, []).append((components[uid], pod))
    workloads: dict[str, list[Pod]] = {}
    for raw in snap.workload_pods:
        pod = Pod.from_k8s(raw)
        workloads.setdefault(pod.node, []).append(pod)
    considered = [
        MoveNode(
            n,
            pods=tuple(workloads.get(n.name, ())),
            operands=tuple(operands.get(n.name, ())),
            quarantined=bool(n.labels.get(HEALTH_STATE)),
        )
        for n in snap.nodes
        if (is_gpu_node(n) or Move.parse(n.annotations) is not None)
        and memory.patched_nodes.get(n.name) != n.resource_version
    ]
    return plan_moves(considered, nodes, limits, snap.now)


def move_stage(
    plan: MovePlan, snap: Snapshot, memory: Memory, config: OperatorConfig
) -> tuple[Stage, Memory]:
    """The planner's steps as API actions, each node's in order (its later steps are skipped
    once one of its writes fails); nodes written are remembered until the watch shows them."""
    actions: list[Action] = []
    groups: list[str] = []
    written: dict[str, str] = {}
    for step in plan.actions:
        request: Action
        if isinstance(step, MoveStep):
            name = step.node.name
            request = Patch("Node", name, step.patch(), "labels", patch_type="json")
            written[name] = step.node.resource_version
        else:
            name = step.node
            request = node_request(step, snap, config, purpose="labels")
        actions.append(request)
        groups.append(name)
    remembered = replace(memory, patched_nodes={**memory.patched_nodes, **written})
    return Stage(tuple(actions), concurrent=False, groups=tuple(groups)), remembered
