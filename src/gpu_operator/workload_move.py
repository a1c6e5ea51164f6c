"""Moving a GPU node between workload stacks (``container``, ``vm-passthrough``, ``vm-vgpu``)
safely, when its ``nvidia.com/gpu.workload.config`` label changes (pure).

The move is a driver upgrade's shape: cordon, drain the pods that hold the node's NVIDIA
devices, take the old stack off and wait until its pods are gone, deploy the new stack, and
uncordon once its validator is Ready. Where it is lives on the node (:class:`Move`), written
in one guarded patch per step, so a restarted operator carries on and two passes planned from
one read cannot both step. The deploy labels follow the recorded phase
(:func:`gpu_operator.node_labels.stack`), so this planner only writes the record, the cordon,
the evictions and the Events. A move past its time is told once and keeps trying: the node
stays cordoned on the old stack (or the new one unvalidated) rather than losing a VM's GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.jsonpatch import map_ops
from gpu_operator.labels import (
    DEPLOY_PREFIX,
    HEALTH_WAS_CORDONED,
    WORKLOAD_CONFIG,
    WORKLOAD_MOVE,
)
from gpu_operator.node_labels import (
    CONTAINER,
    WORKLOAD_STACKS,
    Move,
    MovePhase,
    NodePolicy,
    desired_labels,
    is_gpu_node,
    running_config,
    workload_config,
)
from gpu_operator.nodeops.drain import drain_pods, gpu_pods, names, remove
from gpu_operator.nodeops.operations import DeletePod, Event, Evict
from gpu_operator.nodeops.pods import Pod
from gpu_operator.selector import Selector
from gpu_operator.views import NodeView

RECHECK_S = 3.0  # workload pods are not watched: look again this soon while draining
# Every component of any workload stack: none of their pods may be left on a switching node.
STACK_COMPONENTS = frozenset({"kata-sandbox-device-plugin"}.union(*WORKLOAD_STACKS.values()))


@dataclass(frozen=True)
class MoveLimits:
    """How a move drains and how long it waits, from the driver upgrade's ``drain`` and
    ``podDeletion`` settings (a move empties a node of GPU pods as an upgrade does)."""

    force: bool = False
    drain_timeout_s: int = 300  # 0: wait forever
    delete_empty_dir: bool = False
    drain_all: bool = False  # drain.enable: every pod the selector picks, not only GPU pods
    drain_selector: Selector | None = None
    settle_timeout_s: int = 600  # for the old stack's pods to go and the new validator


@dataclass(frozen=True)
class MoveNode:
    """A GPU node as the move planner reads it."""

    view: NodeView
    pods: tuple[Pod, ...] = ()  # its workload pods (read while it moves)
    operands: tuple[tuple[str, Pod], ...] = ()  # (component, pod) of the operator's DaemonSets
    quarantined: bool = False  # a GPU health quarantine holds the cordon


@dataclass(frozen=True)
class MoveStep:
    """One guarded write to a node: its move record (None: the move is over) and its cordon
    (True: cordon, False: uncordon, None: leave it). The write fails, and the next pass plans
    again, if the record is no longer what the plan read."""

    node: NodeView
    move: Move | None
    cordon: bool | None = None
    hand_over_cordon: bool = False  # a quarantine holds the node: it uncordons when it lets go

    def patch(self) -> list[dict[str, Any]]:
        annotations: dict[str, str | None] = {
            WORKLOAD_MOVE: self.move.dump() if self.move is not None else None
        }
        ops = map_ops("/metadata/annotations", annotations, self.node.annotations, guard=True)
        if self.hand_over_cordon:
            handed = {HEALTH_WAS_CORDONED: "false"}
            ops += map_ops("/metadata/annotations", handed, self.node.annotations)
        if self.cordon is not None:
            ops.append({"op": "add", "path": "/spec/unschedulable", "value": self.cordon})
        return ops


MoveAction = MoveStep | Evict | DeletePod | Event


@dataclass
class MovePlan:
    """The moves' next steps, each node's in order, and when to look again."""

    actions: list[MoveAction] = field(default_factory=list)
    deadlines: list[float] = field(default_factory=list)
    moving: list[str] = field(default_factory=list)  # nodes mid-move after this pass

    @property
    def next_deadline(self) -> float | None:
        return min(self.deadlines, default=None)


def moving_nodes(nodes: Iterable[NodeView]) -> list[str]:
    """Nodes with a move under way: their workload pods are read for the next pass."""
    return [n.name for n in nodes if Move.parse(n.annotations) is not None]


def plan_moves(
    nodes: Sequence[MoveNode], policy: NodePolicy | None, limits: MoveLimits, now: float
) -> MovePlan:
    """Each node's next move step: a move starts where a GPU node's wanted workload config is
    not the one it runs, and ends (cancelled) where there is no policy any more."""
    plan = MovePlan()
    for node in nodes:
        _plan_node(node, policy, limits, now, plan)
    return plan


def _plan_node(
    node: MoveNode, policy: NodePolicy | None, limits: MoveLimits, now: float, plan: MovePlan
) -> None:
    view = node.view
    move = Move.parse(view.annotations)
    if policy is None or not is_gpu_node(view):
        if move is not None:
            why = "no active ClusterPolicy" if policy is None else "not a GPU node any more"
            _end(node, move, plan, "WorkloadMoveCancelled", f"{why}: the move is stopped")
        return
    wanted = workload_config(view, policy)
    if move is None:
        running = running_config(view)
        if wanted is None or running is None or running == wanted:
            return
        started = Move(running, wanted, MovePhase.DRAINING, now, view.unschedulable)
        plan.actions.append(MoveStep(view, started, cordon=None if view.unschedulable else True))
        message = (
            f"{WORKLOAD_CONFIG} changed from {running} to {wanted}: cordoned; the {running} "
            "stack stays until the pods using the node's NVIDIA devices are gone"
        )
        plan.actions.append(Event(view.name, "Normal", "WorkloadMoveStarted", message))
        plan.moving.append(view.name)
        plan.deadlines.append(now + RECHECK_S)
        return
    plan.moving.append(view.name)
    if wanted is not None and wanted != move.target:
        _retarget(node, move, wanted, now, plan)
        return
    if move.phase is MovePhase.DRAINING:
        _drain(node, move, limits, now, plan)
    elif move.phase is MovePhase.SWITCHING:
        _switch(node, move, limits, now, plan)
    else:
        _validate(node, move, policy, limits, now, plan)


def _retarget(node: MoveNode, move: Move, wanted: str, now: float, plan: MovePlan) -> None:
    """The label changed again mid-move: back to where the node was while it still runs its
    old stack, else on to the newest config (from the stack it runs by then)."""
    view = node.view
    if move.phase is MovePhase.DRAINING and wanted == move.source:
        plan.moving.remove(view.name)
        message = f"{WORKLOAD_CONFIG} is {wanted} again: the move to {move.target} is cancelled"
        _end(node, move, plan, "WorkloadMoveCancelled", message)
        return
    if move.phase is MovePhase.VALIDATING:
        moved = Move(move.target, wanted, MovePhase.DRAINING, now, move.was_cordoned)
    else:
        moved = replace(move, target=wanted, blocked="")
    plan.actions.append(MoveStep(view, moved))
    message = f"{WORKLOAD_CONFIG} changed to {wanted} mid-move: moving to {wanted} instead"
    plan.actions.append(Event(view.name, "Normal", "WorkloadMoveRetargeted", message))


def _drain(node: MoveNode, move: Move, limits: MoveLimits, now: float, plan: MovePlan) -> None:
    view = node.view
    pods = gpu_pods(node.pods)
    if limits.drain_all:
        pods += [p for p in drain_pods(node.pods, limits.drain_selector) if p not in pods]
    timeout = limits.drain_timeout_s
    timed_out = bool(pods) and timeout > 0 and now - move.since >= timeout
    removal = remove(
        pods,
        node=view.name,
        stage=f"Drain for the move to {move.target}",
        force=limits.force,
        timeout_s=timeout,
        empty_dir=limits.delete_empty_dir,
        timed_out=timed_out,
    )
    if removal.done:
        switching = replace(move, phase=MovePhase.SWITCHING, since=now, blocked="")
        plan.actions.append(MoveStep(view, switching))
        message = f"no pod uses the node's NVIDIA devices: the {move.source} stack is taken off"
        plan.actions.append(Event(view.name, "Normal", "WorkloadMoveDrained", message))
        return
    if removal.failure is not None:
        _block(view, move, removal.failure + f"; the node keeps the {move.source} stack", plan)
        # PodDisruptionBudgets may allow later what they refuse now: keep asking
        plan.actions.extend(Evict(p.name, p.namespace, view.name) for p in pods if not p.deleting)
    else:
        plan.actions.extend(removal.requests)
        if timeout > 0:
            plan.deadlines.append(move.since + timeout)
    plan.deadlines.append(now + RECHECK_S)


def _switch(node: MoveNode, move: Move, limits: MoveLimits, now: float, plan: MovePlan) -> None:
    view = node.view
    left = [pod for component, pod in node.operands if component in STACK_COMPONENTS]
    if left:
        why = (
            f"the {move.source} stack's pods are still on the node after "
            f"{limits.settle_timeout_s}s: {names(p.name for p in left)}"
        )
        _wait(view, move, limits, now, why, plan)
        return
    validating = replace(move, phase=MovePhase.VALIDATING, since=now, blocked="")
    plan.actions.append(MoveStep(view, validating))
    message = f"the {move.source} stack is gone: deploying the {move.target} stack"
    plan.actions.append(Event(view.name, "Normal", "WorkloadMoveSwitched", message))


def validator_of(config: str) -> str:
    """The component whose Ready pod says ``config``'s stack works on a node."""
    return "operator-validator" if config == CONTAINER else "sandbox-validator"


def _validate(
    node: MoveNode,
    move: Move,
    policy: NodePolicy,
    limits: MoveLimits,
    now: float,
    plan: MovePlan,
) -> None:
    view = node.view
    validator = validator_of(move.target)
    expected = DEPLOY_PREFIX + validator in desired_labels(view, policy)
    ready = any(
        component == validator and pod.ready and pod.running and not pod.deleting
        for component, pod in node.operands
    )
    if expected and not ready:
        why = (
            f"the {move.target} stack's {validator} is not Ready after "
            f"{limits.settle_timeout_s}s; the node stays cordoned until it is"
        )
        _wait(view, move, limits, now, why, plan)
        return
    plan.moving.remove(view.name)
    checked = f"{validator} Ready" if expected else f"no {validator} to wait for"
    _end(node, move, plan, "WorkloadMoveComplete", f"runs the {move.target} stack ({checked})")


def _wait(
    view: NodeView, move: Move, limits: MoveLimits, now: float, why: str, plan: MovePlan
) -> None:
    """Wait for the phase to settle: look again at its deadline, and past it tell ``why``."""
    if now - move.since >= limits.settle_timeout_s:
        _block(view, move, why, plan)
    else:
        plan.deadlines.append(move.since + limits.settle_timeout_s)


def _block(view: NodeView, move: Move, why: str, plan: MovePlan) -> None:
    """Tell once why the move cannot go on; it keeps trying."""
    if move.blocked == why:
        return
    plan.actions.append(MoveStep(view, replace(move, blocked=why)))
    plan.actions.append(Event(view.name, "Warning", "WorkloadMoveBlocked", why))


def _end(node: MoveNode, move: Move, plan: MovePlan, reason: str, message: str) -> None:
    """Drop the record and give the cordon back as the move found it: uncordoned, unless it
    was cordoned before or a GPU health quarantine holds it now (then the quarantine lifts it
    when it lets the node go)."""
    view = node.view
    ours = not move.was_cordoned
    uncordon = ours and not node.quarantined and view.unschedulable
    step = MoveStep(
        view,
        None,
        cordon=False if uncordon else None,
        hand_over_cordon=ours and node.quarantined,
    )
    plan.actions.append(step)
    told = message + ("; uncordoned" if uncordon else "")
    plan.actions.append(Event(view.name, "Normal", reason, told))
