"""The health-remediation planner, case by case."""

from __future__ import annotations

from gpu_operator.labels import (
    HEALTH_ACTION,
    HEALTH_EXTERNAL_LABEL,
    HEALTH_RESET_REQUESTED,
    HEALTH_SINCE,
    HEALTH_STATE,
    HEALTH_TAINTED,
    HEALTH_WAS_CORDONED,
    UNHEALTHY_TAINT,
    UPGRADE_WAS_CORDONED,
)
from gpu_operator.nodeops.operations import DeletePod, Event, Evict
from gpu_operator.nodeops.pods import Pod
from gpu_operator.remediation import (
    HealthNode,
    HealthPolicy,
    Phase,
    Quarantine,
    Release,
    SetPhase,
    plan_health,
)
from gpu_operator.views import NodeView
from tests.unit.remediation.cluster import apply, health_nodes, node, set_health

ON = HealthPolicy(enabled=True, max_unavailable=1, recovery_delay_s=60)
T0 = 1_000_000.0


def gpu_pod(name: str, node_name: str, **kw: object) -> Pod:
    return Pod(name, "jobs", node_name, uses_gpu=True, **kw)  # type: ignore[arg-type]


def held(name: str, phase: Phase, since: float, **annotations: str) -> dict:
    return node(
        name,
        healthy=False,
        since=since,
        labels={HEALTH_STATE: phase.value},
        annotations={
            HEALTH_SINCE: str(int(since)),
            HEALTH_WAS_CORDONED: "false",
            HEALTH_TAINTED: "true",
            **annotations,
        },
        taints=[{"key": UNHEALTHY_TAINT, "value": "quarantined", "effect": "NoSchedule"}],
        unschedulable=True,
    )


def test_an_unhealthy_node_is_tainted_cordoned_and_recorded_in_one_write_with_an_event() -> None:
    objs = {"a": node("a", healthy=False, since=T0)}
    plan = plan_health(health_nodes(objs.values()), ON, T0 + 1, gpu_nodes=4)
    assert [type(a) for a in plan.actions] == [Quarantine, Event]
    assert plan.actions[1].reason == "GPUQuarantined"  # type: ignore[union-attr]
    assert "XID 79" in plan.actions[1].message  # type: ignore[union-attr]
    apply(objs, plan.actions)
    after = objs["a"]
    assert after["spec"]["unschedulable"] is True
    assert after["spec"]["taints"] == [
        {"key": UNHEALTHY_TAINT, "value": "quarantined", "effect": "NoSchedule"}
    ]
    assert after["metadata"]["labels"][HEALTH_STATE] == "draining"
    meta = after["metadata"]["annotations"]
    assert meta[HEALTH_WAS_CORDONED] == "false" and meta[HEALTH_TAINTED] == "true"
    assert plan.tallies[0].action == "quarantine"


def test_noexecute_is_used_when_asked() -> None:
    objs = {"a": node("a", healthy=False, since=T0)}
    policy = HealthPolicy(enabled=True, max_unavailable=1, taint_effect="NoExecute")
    apply(objs, plan_health(health_nodes(objs.values()), policy, T0, gpu_nodes=4).actions)
    assert objs["a"]["spec"]["taints"][0]["effect"] == "NoExecute"


def test_disabled_quarantines_nothing_and_says_so() -> None:
    objs = {"a": node("a", healthy=False, since=T0)}
    plan = plan_health(health_nodes(objs.values()), HealthPolicy(), T0, gpu_nodes=1)
    assert plan.actions == ()
    assert plan.summary.unhealthy == 1 and "off" in plan.summary.line


def test_the_limit_holds_the_newest_faults_back_and_names_them() -> None:
    objs = {f"n{i}": node(f"n{i}") for i in range(10)}
    for i, name in enumerate(["n7", "n2", "n5", "n9"]):
        set_health(objs[name], False, T0 + i)
    policy = HealthPolicy(enabled=True, max_unavailable="20%")
    plan = plan_health(health_nodes(objs.values()), policy, T0 + 10, gpu_nodes=10)
    quarantined = [a.node.name for a in plan.actions if isinstance(a, Quarantine)]
    assert quarantined == ["n7", "n2"]  # oldest first
    assert plan.summary.held == ("n5", "n9") and plan.summary.limit == 2
    assert "held back by maxUnavailable: n5, n9" in plan.summary.line


def test_nodes_already_held_use_up_the_limit() -> None:
    objs = {"a": held("a", Phase.QUARANTINED, T0), "b": node("b", healthy=False, since=T0)}
    plan = plan_health(health_nodes(objs.values()), ON, T0 + 1, gpu_nodes=2)
    assert not [a for a in plan.actions if isinstance(a, Quarantine)]
    assert plan.summary.held == ("b",)


def test_a_write_not_yet_seen_stops_new_quarantines() -> None:
    objs = {"a": node("a", healthy=False, since=T0)}
    nodes = [HealthNode(NodeView.from_k8s(objs["a"]), pending=True)]
    policy = HealthPolicy(enabled=True, max_unavailable=5)
    assert plan_health(nodes, policy, T0, gpu_nodes=5).actions == ()


def test_draining_evicts_gpu_pods_until_gone_then_waits_quarantined() -> None:
    objs = {"a": held("a", Phase.DRAINING, T0)}
    pods = [gpu_pod("train", "a"), gpu_pod("protected", "a"), Pod("web", "x", "a")]
    plan = plan_health(health_nodes(objs.values(), pods), ON, T0 + 5, gpu_nodes=4)
    assert {(a.pod) for a in plan.actions if isinstance(a, Evict)} == {"train", "protected"}
    # A PodDisruptionBudget refused one: it is still there and asked again, nothing else moves.
    plan = plan_health(health_nodes(objs.values(), pods[1:]), ON, T0 + 8, gpu_nodes=4)
    assert [a.pod for a in plan.actions if isinstance(a, Evict)] == ["protected"]
    assert plan.next_deadline is not None and plan.next_deadline <= T0 + 11
    plan = plan_health(health_nodes(objs.values(), pods[2:]), ON, T0 + 9, gpu_nodes=4)
    phases = [a.phase for a in plan.actions if isinstance(a, SetPhase)]
    assert phases == [Phase.QUARANTINED]


def test_a_drain_that_times_out_without_force_leaves_the_node_quarantined_and_says_why() -> None:
    objs = {"a": held("a", Phase.DRAINING, T0)}
    policy = HealthPolicy(enabled=True, max_unavailable=1, drain_timeout_s=30)
    pods = [gpu_pod("stuck", "a")]
    plan = plan_health(health_nodes(objs.values(), pods), policy, T0 + 31, gpu_nodes=1)
    assert [a.phase for a in plan.actions if isinstance(a, SetPhase)] == [Phase.QUARANTINED]
    warning = next(a for a in plan.actions if isinstance(a, Event))
    assert warning.reason == "GPUDrainIncomplete" and "stuck" in warning.message


def test_drain_enable_takes_the_selected_pods_too() -> None:
    objs = {"a": held("a", Phase.DRAINING, T0)}
    policy = HealthPolicy(enabled=True, max_unavailable=1, drain_enable=True)
    pods = [gpu_pod("train", "a"), Pod("web", "x", "a"), Pod("ds", "x", "a", is_daemonset_pod=True)]
    plan = plan_health(health_nodes(objs.values(), pods), policy, T0 + 1, gpu_nodes=1)
    assert {a.pod for a in plan.actions if isinstance(a, Evict)} == {"train", "web"}


def test_remediation_actions_run_in_order_each_with_its_timeout() -> None:
    policy = HealthPolicy(
        enabled=True,
        max_unavailable=1,
        actions=("restartDriver", "resetGPU", "external"),
        action_timeout_s=100,
    )
    driver = Pod("driver-x", "gpu-operator", "a", is_daemonset_pod=True, created=T0 - 500)
    objs = {"a": held("a", Phase.DRAINING, T0)}
    plan = plan_health(health_nodes(objs.values(), [driver]), policy, T0 + 1, gpu_nodes=1)
    assert any(isinstance(a, DeletePod) and a.pod == "driver-x" for a in plan.actions)
    apply(objs, plan.actions)
    assert objs["a"]["metadata"]["labels"][HEALTH_STATE] == "remediating"
    assert objs["a"]["metadata"]["annotations"][HEALTH_ACTION] == "0"

    # Within the timeout, the deletion under way is not asked again (no double work).
    deleting = Pod("driver-x", "gpu-operator", "a", is_daemonset_pod=True, deleting=True)
    plan = plan_health(health_nodes(objs.values(), [deleting]), policy, T0 + 50, gpu_nodes=1)
    assert plan.actions == () and plan.next_deadline == T0 + 101

    plan = plan_health(health_nodes(objs.values()), policy, T0 + 102, gpu_nodes=1)
    assert [a.reason for a in plan.actions if isinstance(a, Event)] == [
        "GPURemediationTimedOut",
        "GPURemediationStarted",
    ]
    apply(objs, plan.actions)
    assert objs["a"]["metadata"]["annotations"][HEALTH_RESET_REQUESTED] == str(int(T0 + 102))

    plan = plan_health(health_nodes(objs.values()), policy, T0 + 203, gpu_nodes=1)
    apply(objs, plan.actions)
    assert objs["a"]["metadata"]["labels"][HEALTH_EXTERNAL_LABEL] == "requested"

    plan = plan_health(health_nodes(objs.values()), policy, T0 + 304, gpu_nodes=1)
    apply(objs, plan.actions)
    assert objs["a"]["metadata"]["labels"][HEALTH_STATE] == "quarantined"
    assert "GPURemediationFailed" in [a.reason for a in plan.actions if isinstance(a, Event)]


def test_recovery_waits_for_the_delay_then_undoes_only_what_the_quarantine_did() -> None:
    objs = {"a": held("a", Phase.QUARANTINED, T0)}
    set_health(objs["a"], True, T0 + 10)
    plan = plan_health(health_nodes(objs.values()), ON, T0 + 40, gpu_nodes=1)
    assert plan.actions == () and plan.next_deadline == T0 + 70
    plan = plan_health(health_nodes(objs.values()), ON, T0 + 70, gpu_nodes=1)
    assert [type(a) for a in plan.actions] == [Release, Event]
    apply(objs, plan.actions)
    after = objs["a"]
    assert "unschedulable" not in after["spec"] and "taints" not in after["spec"]
    assert HEALTH_STATE not in after["metadata"]["labels"]
    annotations = after["metadata"].get("annotations") or {}
    assert not any(k.startswith("nvidia.com/gpu-health") for k in annotations)


def test_recovery_keeps_a_persons_cordon_and_taint() -> None:
    users = {"key": UNHEALTHY_TAINT, "value": "by-hand", "effect": "NoSchedule"}
    objs = {"a": node("a", healthy=False, since=T0, taints=[users], unschedulable=True)}
    apply(objs, plan_health(health_nodes(objs.values()), ON, T0, gpu_nodes=1).actions)
    annotations = objs["a"]["metadata"]["annotations"]
    assert annotations[HEALTH_WAS_CORDONED] == "true" and HEALTH_TAINTED not in annotations
    set_health(objs["a"], True, T0 + 1)
    apply(objs, plan_health(health_nodes(objs.values()), ON, T0 + 100, gpu_nodes=1).actions)
    assert objs["a"]["spec"]["unschedulable"] is True
    assert objs["a"]["spec"]["taints"] == [users]
    assert HEALTH_STATE not in objs["a"]["metadata"]["labels"]


def test_a_node_a_driver_upgrade_holds_is_handed_its_cordon_not_uncordoned() -> None:
    objs = {"a": held("a", Phase.QUARANTINED, T0)}
    set_health(objs["a"], True, T0)
    nodes = [HealthNode(NodeView.from_k8s(objs["a"]), upgrading=True)]
    apply(objs, plan_health(nodes, ON, T0 + 100, gpu_nodes=1).actions)
    assert objs["a"]["spec"]["unschedulable"] is True
    assert objs["a"]["metadata"]["annotations"][UPGRADE_WAS_CORDONED] == "false"


def test_with_remediation_turned_off_held_nodes_stay_until_healthy_then_are_released() -> None:
    objs = {"a": held("a", Phase.DRAINING, T0)}
    off = HealthPolicy(recovery_delay_s=60)
    pods = [gpu_pod("train", "a")]
    assert plan_health(health_nodes(objs.values(), pods), off, T0 + 5, gpu_nodes=1).actions == ()
    set_health(objs["a"], True, T0 + 5)
    plan = plan_health(health_nodes(objs.values(), pods), off, T0 + 70, gpu_nodes=1)
    assert [type(a) for a in plan.actions] == [Release, Event]


def test_a_node_whose_state_was_written_by_hand_gets_its_clock_started() -> None:
    obj = node("a", healthy=False, since=T0, labels={HEALTH_STATE: "remediating"})
    plan = plan_health(health_nodes([obj]), ON, T0 + 3, gpu_nodes=1)
    assert [(a.phase, a.since) for a in plan.actions if isinstance(a, SetPhase)] == [
        (Phase.REMEDIATING, int(T0 + 3))
    ]


def test_a_node_mid_driver_upgrade_is_not_quarantined_until_the_upgrade_is_over() -> None:
    objs = {"a": node("a", healthy=False, since=T0)}
    view = NodeView.from_k8s(objs["a"])
    plan = plan_health([HealthNode(view, mid_upgrade=True)], ON, T0 + 1, gpu_nodes=1)
    assert plan.actions == () and plan.summary.unhealthy == 1
    plan = plan_health([HealthNode(view)], ON, T0 + 1, gpu_nodes=1)
    assert any(isinstance(a, Quarantine) for a in plan.actions)
