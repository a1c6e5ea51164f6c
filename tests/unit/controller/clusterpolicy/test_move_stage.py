"""Workload moves in the ClusterPolicy pass: the record first, the labels only after it."""

from __future__ import annotations

from typing import Any

from gpu_operator.controller.clusterpolicy.decide import Decision, decide
from gpu_operator.controller.clusterpolicy.memory import Memory
from gpu_operator.controller.runtime.actions import Create, Evict, Patch
from gpu_operator.jsonpatch import pointer
from gpu_operator.labels import DEPLOY_PREFIX, WORKLOAD_CONFIG, WORKLOAD_MOVE
from gpu_operator.node_labels import Move, MovePhase
from gpu_operator.views import NodeView
from tests.unit.controller.builders import (
    CONFIG,
    NOW,
    daemonset,
    gpu_node,
    patched,
    pod,
    policy,
    snapshot,
)

SANDBOX = {"sandboxWorkloads": {"enabled": True}, "vfioManager": {"enabled": True}}


def run(nodes: list[NodeView], **fields: Any) -> Decision:
    return decide(snapshot([policy(spec=SANDBOX)], nodes, **fields), Memory(), CONFIG)


def node_patches(decision: Decision) -> list[Patch]:
    return [a for a in decision.actions if isinstance(a, Patch) and a.kind == "Node"]


def container_node() -> NodeView:
    """A GPU node the operator labelled for the container stack."""
    fresh = gpu_node(labels={WORKLOAD_CONFIG: "container"})
    (patch,) = node_patches(run([fresh]))
    return patched(fresh, patch.body)


def relabelled(node: NodeView, config: str, move: Move | None = None) -> NodeView:
    annotations = dict(node.annotations)
    if move is not None:
        annotations[WORKLOAD_MOVE] = move.dump()
    return NodeView(
        node.name,
        labels={**node.labels, WORKLOAD_CONFIG: config},
        annotations=annotations,
        taints=node.taints,
        unschedulable=move is not None,
        resource_version="2",
    )


def test_a_relabelled_node_gets_its_move_record_and_cordon_before_any_label() -> None:
    node = relabelled(container_node(), "vm-passthrough")
    decision = run([node])
    (patch,) = node_patches(decision)  # the move step's only: the labels wait for it
    ops = {op["path"]: op for op in patch.body if op["op"] != "test"}
    written = ops["/metadata/annotations/" + pointer(WORKLOAD_MOVE)]["value"]
    record = Move.parse({WORKLOAD_MOVE: written})
    assert record is not None and record.phase is MovePhase.DRAINING
    assert (record.source, record.target) == ("container", "vm-passthrough")
    assert ops["/spec/unschedulable"]["value"] is True
    reasons = [a.obj["reason"] for a in decision.actions if isinstance(a, Create)]
    assert "WorkloadMoveStarted" in reasons
    assert decision.requeue_at is not None and decision.requeue_at <= NOW + 3.0


def test_a_draining_node_has_its_gpu_pods_evicted_and_keeps_its_labels() -> None:
    move = Move("container", "vm-passthrough", MovePhase.DRAINING, NOW - 1, False)
    node = relabelled(container_node(), "vm-passthrough", move)
    training = pod("train", namespace="default", gpus=1)
    decision = run([node], workload_pods=(training,))
    assert [(a.pod, a.namespace) for a in decision.actions if isinstance(a, Evict)] == [
        ("train", "default")
    ]
    assert node_patches(decision) == []  # the container stack's labels stay while it drains
    (status,) = [a for a in decision.actions if isinstance(a, Patch) and a.purpose == "status"]
    conditions = {c["type"]: c for c in status.body["status"]["conditions"]}
    assert conditions["WorkloadMoving"]["message"] == (
        "node gpu-1: container -> vm-passthrough, draining"
    )


def test_a_switching_node_loses_its_stack_and_waits_for_its_pods() -> None:
    move = Move("container", "vm-passthrough", MovePhase.SWITCHING, NOW - 1, False)
    node = relabelled(container_node(), "vm-passthrough", move)
    driver = daemonset("nvidia-driver-daemonset-ubuntu22.04", "driver")
    driver_pod = pod("nvidia-driver-x", owner_uid="uid-nvidia-driver-daemonset-ubuntu22.04")
    decision = run([node], daemonsets=(driver,), pods=(driver_pod,))
    (patch,) = node_patches(decision)  # the labels: every deploy label goes
    removed = {
        op["path"].rsplit("/", 1)[1].replace("~1", "/") for op in patch.body if op["op"] == "remove"
    }
    assert DEPLOY_PREFIX + "driver" in removed and DEPLOY_PREFIX + "device-plugin" in removed
    assert not any(op["op"] == "add" and "deploy" in op["path"] for op in patch.body)
    gone = run([patched(node, patch.body)], daemonsets=(driver,))
    (step,) = node_patches(gone)  # no pod of the old stack left: on to validation
    assert any(MovePhase.VALIDATING.value in str(op.get("value")) for op in step.body)
