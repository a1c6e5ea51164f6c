"""Moving a GPU node between workload stacks: cordon, drain, switch, validate, uncordon."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gpu_operator.api import parse_spec
from gpu_operator.controller.clusterpolicy.facts import node_policy
from gpu_operator.labels import HEALTH_WAS_CORDONED, WORKLOAD_CONFIG, WORKLOAD_MOVE
from gpu_operator.node_labels import Move, MovePhase, NodePolicy, plan_node
from gpu_operator.nodeops.operations import DeletePod, Event, Evict
from gpu_operator.nodeops.pods import Pod
from gpu_operator.views import NodeView
from gpu_operator.workload_move import (
    MoveLimits,
    MoveNode,
    MovePlan,
    MoveStep,
    moving_nodes,
    plan_moves,
)

NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
SANDBOX = {
    "sandboxWorkloads": {"enabled": True},
    "sandboxDevicePlugin": {"enabled": True},
    "vfioManager": {"enabled": True},
}
POLICY = node_policy(parse_spec(SANDBOX))
UNVALIDATED = replace(POLICY, deploy=tuple(d for d in POLICY.deploy if d != "sandbox-validator"))
NOW = 10_000.0
DRAINING, SWITCHING, VALIDATING = MovePhase


def labelled(config: str, policy: NodePolicy = POLICY, *, unschedulable: bool = False) -> NodeView:
    """A GPU node the operator labelled for ``config``."""
    node = NodeView("n1", labels={**NFD, WORKLOAD_CONFIG: config}, unschedulable=unschedulable)
    patch = plan_node(node, policy)
    assert patch is not None
    labels = {k: v for k, v in {**node.labels, **patch.labels}.items() if v is not None}
    annotations = {k: v for k, v in patch.annotations.items() if v is not None}
    return NodeView(
        "n1", labels=labels, annotations=annotations, unschedulable=unschedulable, taints=()
    )


def with_label(node: NodeView, config: str) -> NodeView:
    return NodeView(
        node.name,
        labels={**node.labels, WORKLOAD_CONFIG: config},
        annotations=node.annotations,
        unschedulable=node.unschedulable,
    )


def moving(
    node: NodeView, phase: MovePhase, *, since: float = NOW - 1, was_cordoned: bool = False
) -> NodeView:
    """``node`` relabelled to vm-passthrough, cordoned, with its move in ``phase``."""
    record = Move("container", "vm-passthrough", phase, since, was_cordoned).dump()
    return NodeView(
        node.name,
        labels={**node.labels, WORKLOAD_CONFIG: "vm-passthrough"},
        annotations={**node.annotations, WORKLOAD_MOVE: record},
        unschedulable=True,
    )


def pod(name: str, *, gpu: bool = True, daemonset: bool = False, **kw: Any) -> Pod:
    return Pod(name, node="n1", uses_gpu=gpu, is_daemonset_pod=daemonset, **kw)


def plan(node: MoveNode, policy: NodePolicy | None = POLICY, **limits: Any) -> MovePlan:
    return plan_moves([node], policy, MoveLimits(**limits), NOW)


def steps(result: MovePlan) -> list[MoveStep]:
    return [a for a in result.actions if isinstance(a, MoveStep)]


def events(result: MovePlan) -> list[tuple[str, str]]:
    return [(a.type, a.reason) for a in result.actions if isinstance(a, Event)]


def test_a_relabelled_node_is_cordoned_and_its_move_recorded() -> None:
    node = with_label(labelled("container"), "vm-passthrough")
    result = plan(MoveNode(node))
    (step,) = steps(result)
    assert step.move == Move("container", "vm-passthrough", DRAINING, NOW, was_cordoned=False)
    assert step.cordon is True
    assert events(result) == [("Normal", "WorkloadMoveStarted")]
    assert result.moving == ["n1"]
    # the record is written only if the annotation is still absent (two passes, one read)
    ops = step.patch()
    assert {"op": "test", "path": "/metadata/annotations/" + WORKLOAD_MOVE.replace("/", "~1"),
            "value": None} in ops  # fmt: skip
    assert {"op": "add", "path": "/spec/unschedulable", "value": True} in ops


def test_an_already_cordoned_node_stays_cordoned_after_its_move() -> None:
    node = with_label(labelled("container", unschedulable=True), "vm-passthrough")
    (step,) = steps(plan(MoveNode(node)))
    assert step.move is not None and step.move.was_cordoned and step.cordon is None
    done = moving(labelled("container"), VALIDATING, was_cordoned=True)
    (end,) = steps(plan(MoveNode(done), UNVALIDATED))  # no sandbox validator to wait for
    assert end.move is None and end.cordon is None


def test_nothing_moves_on_a_fresh_node_an_unchanged_one_or_an_invalid_label() -> None:
    fresh = NodeView("n1", labels={**NFD, WORKLOAD_CONFIG: "vm-passthrough"})
    settled = labelled("vm-passthrough")
    invalid = with_label(labelled("container"), "vm-passthru")
    for node in (fresh, settled, invalid):
        assert plan(MoveNode(node)).actions == []


def test_the_drain_evicts_pods_holding_nvidia_devices_and_vms_alike() -> None:
    node = moving(labelled("container"), DRAINING)
    pods = (
        pod("cuda"),
        pod("vm", labels={"kubevirt.io": "virt-launcher"}),
        pod("web", gpu=False),
        pod("plugin", daemonset=True),
        pod("done", phase="Succeeded"),
        pod("going", deleting=True),
    )
    result = plan(MoveNode(node, pods=pods))
    evicted = [a.pod for a in result.actions if isinstance(a, Evict)]
    assert evicted == ["cuda", "vm"]
    assert steps(result) == []  # still draining
    assert result.next_deadline == NOW + 3.0
    everything = plan(MoveNode(node, pods=pods), drain_all=True)
    assert [a.pod for a in everything.actions if isinstance(a, Evict)] == ["cuda", "vm", "web"]


def test_a_drained_node_switches_stacks() -> None:
    node = moving(labelled("container"), DRAINING)
    result = plan(MoveNode(node, pods=(pod("web", gpu=False),)))
    (step,) = steps(result)
    assert step.move is not None and step.move.phase is SWITCHING and step.move.since == NOW
    assert events(result) == [("Normal", "WorkloadMoveDrained")]


def test_a_drain_past_its_time_is_told_once_and_keeps_asking() -> None:
    node = moving(labelled("container"), DRAINING, since=NOW - 301)
    held = MoveNode(node, pods=(pod("cuda"),))
    result = plan(held)
    (step,) = steps(result)
    assert step.move is not None and "force is false" in step.move.blocked
    assert events(result) == [("Warning", "WorkloadMoveBlocked")]
    assert [a.pod for a in result.actions if isinstance(a, Evict)] == ["cuda"]
    told = MoveNode(
        NodeView(
            "n1",
            labels=node.labels,
            annotations={**node.annotations, WORKLOAD_MOVE: step.move.dump()},
            unschedulable=True,
        ),
        pods=held.pods,
    )
    again = plan(told)
    assert steps(again) == [] and events(again) == []
    assert [a.pod for a in again.actions if isinstance(a, Evict)] == ["cuda"]
    forced = plan(held, force=True)
    assert [a.pod for a in forced.actions if isinstance(a, DeletePod) and a.force] == ["cuda"]


def test_the_new_stack_waits_until_the_old_stacks_pods_are_gone() -> None:
    node = moving(labelled("container"), SWITCHING)
    left = MoveNode(node, operands=(("driver", pod("nvidia-driver-x", gpu=False)),))
    result = plan(left)
    assert steps(result) == [] and result.moving == ["n1"]
    other = MoveNode(node, operands=(("dra-kubelet-plugin", pod("dra", gpu=False)),))
    (step,) = steps(plan(other))  # not a workload stack's: it does not hold the move
    assert step.move is not None and step.move.phase is VALIDATING
    late = plan(MoveNode(moving(labelled("container"), SWITCHING, since=NOW - 601), left.pods,
                         left.operands))  # fmt: skip
    assert events(late) == [("Warning", "WorkloadMoveBlocked")]


def test_the_node_is_uncordoned_once_the_new_stacks_validator_is_ready() -> None:
    policy = POLICY
    node = moving(labelled("container", policy), VALIDATING)
    starting = MoveNode(node, operands=(("sandbox-validator", pod("v", gpu=False, ready=False)),))
    assert steps(plan(starting, policy)) == []
    ready = MoveNode(node, operands=(("sandbox-validator", pod("v", gpu=False)),))
    result = plan(ready, policy)
    (step,) = steps(result)
    assert step.move is None and step.cordon is False
    assert events(result) == [("Normal", "WorkloadMoveComplete")]
    assert result.moving == []
    ops = step.patch()
    path = "/metadata/annotations/" + WORKLOAD_MOVE.replace("/", "~1")
    assert {"op": "remove", "path": path} in ops


def test_a_quarantine_that_holds_the_node_gets_the_cordon() -> None:
    node = moving(labelled("container"), VALIDATING)
    (step,) = steps(plan(MoveNode(node, quarantined=True), UNVALIDATED))
    assert step.move is None and step.cordon is None and step.hand_over_cordon
    assert {"op": "add", "path": "/metadata/annotations/" + HEALTH_WAS_CORDONED.replace("/", "~1"),
            "value": "false"} in step.patch()  # fmt: skip


def test_changing_the_label_back_while_draining_cancels_the_move() -> None:
    node = moving(labelled("container"), DRAINING)
    back = with_label(node, "container")
    result = plan(MoveNode(back))
    (step,) = steps(result)
    assert step.move is None and step.cordon is False
    assert events(result) == [("Normal", "WorkloadMoveCancelled")]
    assert result.moving == []


def test_a_new_label_after_the_switch_moves_on_from_the_new_stack() -> None:
    node = with_label(moving(labelled("container"), VALIDATING), "vm-vgpu")
    (step,) = steps(plan(MoveNode(node)))
    assert step.move == Move("vm-passthrough", "vm-vgpu", DRAINING, NOW, was_cordoned=False)
    switching = with_label(moving(labelled("container"), SWITCHING), "vm-vgpu")
    (step,) = steps(plan(MoveNode(switching)))
    assert step.move is not None and (step.move.source, step.move.target) == (
        "container",
        "vm-vgpu",
    )
    assert step.move.phase is SWITCHING


def test_without_a_policy_a_move_is_stopped_and_the_node_uncordoned() -> None:
    node = moving(labelled("container"), DRAINING)
    (step,) = steps(plan(MoveNode(node), None))
    assert step.move is None and step.cordon is False
    assert moving_nodes([node, labelled("container")]) == ["n1"]


def test_a_mangled_record_is_no_move() -> None:
    node = labelled("container")
    for raw in ("{", json.dumps({"from": "container"}), json.dumps({"from": "x", "to": "y",
                "phase": "draining", "since": 1})):  # fmt: skip
        assert Move.parse({WORKLOAD_MOVE: raw}) is None
    assert moving_nodes([node]) == []
