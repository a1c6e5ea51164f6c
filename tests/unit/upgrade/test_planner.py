"""The planner's transitions, one table row per rule, and its budget arithmetic."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpu_operator.labels import (
    UPGRADE_REQUESTED,
    UPGRADE_SINCE,
    UPGRADE_SKIP,
    UPGRADE_STATE,
    UPGRADE_WAS_CORDONED,
)
from gpu_operator.nodeops.operations import Cordon, DeletePod, Event, Evict, Uncordon
from gpu_operator.nodeops.pods import Pod
from gpu_operator.upgrade import (
    Action,
    Fail,
    Fleet,
    Node,
    Policy,
    Selector,
    SetState,
    State,
    plan,
)
from gpu_operator.upgrade.fleet import unobserved
from tests.unit.upgrade.fleets import (
    AUTO,
    DS,
    NEW,
    NOW,
    OLD,
    driver,
    fleet,
    node,
    validator,
    workload,
)

STAMP = int(NOW)


def moves(actions: tuple[Action, ...]) -> list[tuple[str, str]]:
    """(node, new state) of every state change, failures included."""
    out = []
    for a in actions:
        if isinstance(a, SetState):
            out.append((a.node, a.state.value))
        elif isinstance(a, Fail):
            out.append((a.node, State.FAILED.value))
    return out


def reason(actions: tuple[Action, ...]) -> str:
    """The reason of the plan's one failure."""
    (fail,) = [a for a in actions if isinstance(a, Fail)]
    return fail.reason


def kinds(actions: tuple[Action, ...]) -> list[str]:
    return [type(a).__name__ for a in actions]


# ---- entering and starting ----


def test_out_of_date_driver_marks_node_upgrade_required() -> None:
    result = plan(fleet([node("n1"), node("n2", "upgrade-done")]), AUTO, NOW)
    assert moves(result.actions) == [("n1", "upgrade-required"), ("n2", "upgrade-required")]
    assert result.actions[0] == SetState("n1", State.REQUIRED, STAMP, "driver pod out of date")


def test_current_driver_needs_nothing_and_writes_nothing() -> None:
    f = fleet([node("n1"), node("n2", "upgrade-done")], [driver("n1", NEW), driver("n2", NEW)])
    result = plan(f, AUTO, NOW)
    assert result.actions == ()
    assert result.summary.done == 2 and result.summary.pending == 0


def test_requested_annotation_marks_node_and_the_patch_consumes_it() -> None:
    n = node("n1", "upgrade-done", annotations={UPGRADE_REQUESTED: "true"})
    result = plan(fleet([n], [driver("n1", NEW)]), AUTO, NOW)
    assert moves(result.actions) == [("n1", "upgrade-required")]
    action = result.actions[0]
    assert isinstance(action, SetState)
    patch = action.patch()
    assert patch["metadata"]["labels"] == {UPGRADE_STATE: "upgrade-required"}
    assert patch["metadata"]["annotations"][UPGRADE_REQUESTED] is None
    assert patch["metadata"]["annotations"][UPGRADE_SINCE] == str(STAMP)


def test_driver_of_unknown_daemonset_is_not_upgraded() -> None:
    result = plan(fleet([node("n1")], [driver("n1", OLD, owner="other-ds")]), AUTO, NOW)
    assert result.actions == ()


def test_terminating_old_driver_does_not_make_a_node_need_an_upgrade() -> None:
    f = fleet([node("n1", "upgrade-done")], [driver("n1", OLD, deleting=True)])
    assert plan(f, AUTO, NOW).actions == ()


def test_required_node_starts_with_cordon_required_and_an_event() -> None:
    result = plan(fleet([node("n1", "upgrade-required")]), AUTO, NOW)
    assert result.actions == (
        SetState("n1", State.CORDON, STAMP, "upgrade started"),
        Event("n1", "Normal", "DriverUpgradeStarted", "driver upgrade started"),
    )


def test_not_ready_node_is_not_started() -> None:
    f = fleet([node("n1", "upgrade-required", ready=False), node("n2", "upgrade-required")])
    result = plan(f, replace(AUTO, max_parallel_upgrades=0, max_unavailable=5), NOW)
    assert moves(result.actions) == [("n2", "cordon-required")]
    assert any("wait to be Ready" in n and "n1" in n for n in result.notes)


# ---- cordon ----


@pytest.mark.parametrize(
    ("cordoned", "recorded", "expected_cordon"),
    [
        (False, None, Cordon("n1", was_cordoned=False)),
        (True, None, Cordon("n1", was_cordoned=True)),  # someone else's cordon: remembered
        (False, False, Cordon("n1", was_cordoned=False)),
        (True, False, None),  # our cordon already applied: only move on
        (True, True, None),
    ],
)
def test_cordon_records_whether_the_node_was_cordoned(
    cordoned: bool, recorded: bool | None, expected_cordon: Cordon | None
) -> None:
    n = node("n1", "cordon-required", cordoned=cordoned, was_cordoned=recorded)
    result = plan(fleet([n]), AUTO, NOW)
    expected: list[Action] = [] if expected_cordon is None else [expected_cordon]
    expected.append(SetState("n1", State.POD_DELETION, STAMP, "cordoned"))
    assert list(result.actions) == expected


def test_cordon_patch_records_before_cordoning_in_one_patch() -> None:
    assert Cordon("n1", was_cordoned=True).patch() == {
        "metadata": {"annotations": {UPGRADE_WAS_CORDONED: "true"}},
        "spec": {"unschedulable": True},
    }


def test_cordon_goes_to_wait_for_jobs_when_a_selector_is_set() -> None:
    policy = replace(AUTO, wait_selector=Selector.parse("job=train"))
    result = plan(fleet([node("n1", "cordon-required")]), policy, NOW)
    assert moves(result.actions) == [("n1", "wait-for-jobs-required")]


# ---- wait for jobs ----

WAIT = replace(AUTO, wait_selector=Selector.parse("job=train"), wait_timeout_s=600)


@pytest.mark.parametrize(
    ("pods", "elapsed", "policy", "expected"),
    [
        ([workload("j", labels={"job": "train"})], 10, WAIT, []),
        ([workload("j", labels={"job": "train"}, phase="Succeeded")], 10, WAIT, ["pod-del"]),
        ([workload("j", labels={"job": "other"})], 10, WAIT, ["pod-del"]),
        ([], 10, WAIT, ["pod-del"]),
        ([workload("j", labels={"job": "train"})], 600, WAIT, ["pod-del", "event"]),
        # timeout 0: wait for ever
        ([workload("j", labels={"job": "train"})], 10**6, replace(WAIT, wait_timeout_s=0), []),
        # no selector: nothing to wait for
        ([workload("j", labels={"job": "train"})], 10, AUTO, ["pod-del"]),
    ],
)
def test_wait_for_jobs(
    pods: list[Pod], elapsed: float, policy: Policy, expected: list[str]
) -> None:
    n = node("n1", "wait-for-jobs-required", since=NOW - elapsed, cordoned=True)
    result = plan(fleet([n], workloads=pods), policy, NOW)
    got = [
        "pod-del"
        if isinstance(a, SetState) and a.state is State.POD_DELETION
        else "event"
        if isinstance(a, Event) and a.reason == "WaitForJobsTimedOut"
        else repr(a)
        for a in result.actions
    ]
    assert got == expected


# ---- GPU pod deletion ----


def deletion(elapsed: float = 10, cordoned: bool = True) -> Node:
    return node("n1", "pod-deletion-required", since=NOW - elapsed, cordoned=cordoned)


def test_pod_deletion_evicts_only_running_non_daemonset_gpu_pods() -> None:
    pods = [
        workload("gpu"),
        workload("cpu", gpu=False),
        workload("gpu-ds", daemonset=True),
        workload("gpu-done", phase="Succeeded"),
        workload("gpu-leaving", deleting=True),
        workload("elsewhere", on="n2"),
    ]
    result = plan(fleet([deletion()], workloads=pods), AUTO, NOW)
    assert result.actions == (Evict("gpu", "work", "n1"),)


def test_pod_deletion_moves_on_when_no_gpu_pod_remains() -> None:
    result = plan(fleet([deletion()], workloads=[workload("cpu", gpu=False)]), AUTO, NOW)
    assert moves(result.actions) == [("n1", "pod-restart-required")]
    with_drain = replace(AUTO, drain_enable=True)
    assert moves(plan(fleet([deletion()]), with_drain, NOW).actions) == [("n1", "drain-required")]


def test_pod_deletion_timeout_fails_without_force() -> None:
    result = plan(fleet([deletion(300)], workloads=[workload("gpu")]), AUTO, NOW)
    assert kinds(result.actions) == ["Fail"]
    fail = result.actions[0]
    assert isinstance(fail, Fail) and "gpu" in fail.reason and "force is false" in fail.reason


def test_pod_deletion_timeout_force_deletes_with_force() -> None:
    policy = replace(AUTO, pod_deletion_force=True)
    pods = [workload("gpu"), workload("stuck", deleting=True)]
    result = plan(fleet([deletion(300)], workloads=pods), policy, NOW)
    assert [a for a in result.actions if isinstance(a, DeletePod)] == [
        DeletePod("gpu", "work", True, "n1"),
        DeletePod("stuck", "work", True, "n1"),
    ]


def test_pod_deletion_before_timeout_retries_eviction_a_pdb_refused() -> None:
    # The pod is still there and not terminating: ask again (the PDB may allow it now).
    f = fleet([deletion(299)], workloads=[workload("gpu")])
    assert plan(f, AUTO, NOW).actions == (Evict("gpu", "work", "n1"),)


def test_pod_deletion_zero_timeout_waits_for_ever() -> None:
    policy = replace(AUTO, pod_deletion_timeout_s=0)
    f = fleet([deletion(10**7)], workloads=[workload("gpu")])
    assert plan(f, policy, NOW).actions == (Evict("gpu", "work", "n1"),)


def test_empty_dir_pods_stay_unless_allowed_and_force_does_not_override() -> None:
    pods = [workload("scratch", empty_dir=True)]
    forced = replace(AUTO, pod_deletion_force=True)
    assert plan(fleet([deletion()], workloads=pods), forced, NOW).actions == ()
    timed_out = plan(fleet([deletion(300)], workloads=pods), forced, NOW)
    assert kinds(timed_out.actions) == ["Fail"]
    assert "emptyDir" in reason(timed_out.actions)
    allowed = replace(AUTO, pod_deletion_delete_empty_dir=True)
    assert plan(fleet([deletion()], workloads=pods), allowed, NOW).actions == (
        Evict("scratch", "work", "n1"),
    )


# ---- drain ----

DRAIN = replace(AUTO, drain_enable=True)


def draining(elapsed: float = 10) -> Node:
    return node("n1", "drain-required", since=NOW - elapsed, cordoned=True)


def test_drain_disabled_skips_to_pod_restart() -> None:
    result = plan(fleet([draining()], workloads=[workload("web", gpu=False)]), AUTO, NOW)
    assert moves(result.actions) == [("n1", "pod-restart-required")]


def test_drain_evicts_every_non_daemonset_pod_but_skipped_ones() -> None:
    pods = [
        workload("web", gpu=False),
        workload("keep", gpu=False, labels={"nvidia.com/gpu-driver-upgrade-drain.skip": "true"}),
        workload("ds", gpu=False, daemonset=True),
        workload("done", gpu=False, phase="Failed"),
        workload("cache", gpu=False, empty_dir=True),
    ]
    result = plan(fleet([draining()], workloads=pods), DRAIN, NOW)
    assert result.actions == (Evict("web", "work", "n1"),)
    allowed = replace(DRAIN, drain_delete_empty_dir=True)
    result = plan(fleet([draining()], workloads=pods), allowed, NOW)
    assert result.actions == (Evict("web", "work", "n1"), Evict("cache", "work", "n1"))


def test_drain_selector_limits_what_is_evicted_and_what_blocks() -> None:
    policy = replace(DRAIN, drain_selector=Selector.parse("tier in (batch)"))
    pods = [workload("a", gpu=False, labels={"tier": "batch"}), workload("b", gpu=False)]
    result = plan(fleet([draining()], workloads=pods), policy, NOW)
    assert result.actions == (Evict("a", "work", "n1"),)
    only_b = plan(fleet([draining()], workloads=pods[1:]), policy, NOW)
    assert moves(only_b.actions) == [("n1", "pod-restart-required")]


def test_drain_timeout_force_and_fail() -> None:
    pods = [workload("web", gpu=False)]
    assert kinds(plan(fleet([draining(300)], workloads=pods), DRAIN, NOW).actions) == ["Fail"]
    forced = replace(DRAIN, drain_force=True)
    result = plan(fleet([draining(300)], workloads=pods), forced, NOW)
    assert [a for a in result.actions if isinstance(a, DeletePod)] == [
        DeletePod("web", "work", True, "n1")
    ]


# ---- pod restart ----


def restarting(elapsed: float = 10) -> Node:
    return node("n1", "pod-restart-required", since=NOW - elapsed, cordoned=True)


def test_pod_restart_deletes_the_old_driver_pod() -> None:
    result = plan(fleet([restarting()], [driver("n1", OLD)]), AUTO, NOW)
    assert result.actions == (DeletePod("driver-n1-old-hash", "gpu-operator", False, "n1"),)


def test_pod_restart_does_not_delete_a_terminating_pod_again() -> None:
    f = fleet([restarting()], [driver("n1", OLD, deleting=True)])
    assert plan(f, AUTO, NOW).actions == ()


def test_pod_restart_waits_for_new_pod_ready_then_validation() -> None:
    pending = driver("n1", NEW, ready=False, created=NOW - 5)
    assert plan(fleet([restarting()], [pending]), AUTO, NOW).actions == ()
    ready = replace(pending, ready=True)
    result = plan(fleet([restarting()], [ready]), AUTO, NOW)
    assert moves(result.actions) == [("n1", "validation-required")]


def test_pod_restart_restarts_a_current_pod_older_than_the_state() -> None:
    # A requested upgrade with an unchanged template still restarts the driver, once.
    old_current = driver("n1", NEW, created=NOW - 1000)
    result = plan(fleet([restarting(10)], [old_current]), AUTO, NOW)
    assert kinds(result.actions) == ["DeletePod"]


def test_pods_the_daemonset_controller_has_not_seen_are_not_deleted() -> None:
    """ci-i1: after an API server restart kube-controller-manager's pod watch was down for 12 s;
    it created a driver pod from its stale cache, the operator deleted it (and two others) for
    the upgrade before that watch came back, and the DaemonSet created nothing for 5 minutes.
    While the DaemonSet's status does not count every pod seen here, its pods are left."""
    stale = fleet([restarting()], [driver("n1", OLD)], validators=[validator("n1")])
    held = replace(stale, unobserved=frozenset({DS}))
    assert plan(held, AUTO, NOW).actions == ()
    assert plan(stale, AUTO, NOW).actions == (
        DeletePod("driver-n1-old-hash", "gpu-operator", False, "n1"),
    )
    # The same for the validators a recovering node restarts, DaemonSet by DaemonSet.
    f = fleet(
        [failed()],
        [driver("n1", NEW, created=RESTARTED)],
        validators=[validator("n1", ready_since=RESTARTED - 1)],
    )
    assert (
        plan(replace(f, unobserved=frozenset({"nvidia-operator-validator"})), AUTO, NOW).actions
        == ()
    )
    assert kinds(plan(replace(f, unobserved=frozenset({DS})), AUTO, NOW).actions) == ["DeletePod"]


def _ds(name: str, scheduled: int | None, misscheduled: int = 0) -> dict[str, Any]:
    status = {} if scheduled is None else {"currentNumberScheduled": scheduled}
    if misscheduled:
        status["numberMisscheduled"] = misscheduled
    return {"metadata": {"name": name}, "status": status}


@pytest.mark.parametrize(
    ("status", "pods", "behind"),
    [
        (_ds(DS, 2), [driver("n1"), driver("n2")], False),
        (_ds(DS, 1), [driver("n1"), driver("n2")], True),  # a pod its cache does not hold
        (_ds(DS, 1, misscheduled=1), [driver("n1"), driver("n2")], False),
        (_ds(DS, None), [driver("n1")], True),  # created, no status written yet
        (_ds(DS, 1), [driver("n1"), driver("n2", deleting=True)], False),
        (_ds(DS, 1), [driver("n1"), driver("gone")], False),  # its node deleted: counted nowhere
        (_ds(DS, 1), [driver("n1"), driver("n1", NEW)], False),  # nodes are counted, not pods
        (_ds("other", 0), [driver("n1")], False),  # another DaemonSet's status says nothing
    ],
)
def test_a_daemonset_is_behind_while_its_status_counts_fewer_nodes_than_pods_are_on(
    status: dict[str, Any], pods: list[Pod], behind: bool
) -> None:
    assert (DS in unobserved([status], pods, {"n1", "n2"})) is behind


@pytest.mark.parametrize(("restarts", "fails"), [(10, False), (11, True)])
def test_pod_restart_fails_when_the_new_driver_crash_loops(restarts: int, fails: bool) -> None:
    pod = driver("n1", NEW, ready=False, created=NOW - 5, restarts=restarts)
    result = plan(fleet([restarting()], [pod]), AUTO, NOW)
    assert kinds(result.actions) == (["Fail"] if fails else [])


def test_pod_restart_times_out_when_the_new_pod_never_schedules() -> None:
    pending = driver("n1", NEW, ready=False, created=NOW - 1500)
    f = fleet([restarting(1799)], [pending])
    assert plan(f, AUTO, NOW).actions == ()
    f = fleet([restarting(1800)], [pending])
    result = plan(f, AUTO, NOW)
    assert kinds(result.actions) == ["Fail"]
    assert "Pending" in reason(result.actions)


def test_next_deadline_is_the_earliest_timeout_of_a_waiting_node() -> None:
    nodes = [
        node("n1", "pod-restart-required", since=NOW - 1000, cordoned=True),
        node("n2", "validation-required", since=NOW - 500, cordoned=True),
    ]
    drivers = [driver("n1", NEW, ready=False, created=NOW), driver("n2", NEW, created=NOW - 600)]
    f = fleet(nodes, drivers, validators=[validator("n2", ready=False)])
    policy = replace(AUTO, max_parallel_upgrades=2)
    assert plan(f, policy, NOW).next_deadline == NOW + 100  # validation: 600 s from NOW - 500
    assert plan(f, policy, NOW + 100).next_deadline == NOW + 800  # n2 failed; n1 at 1800 s
    assert plan(fleet(required(1)), AUTO, NOW).next_deadline is None


def test_missing_entry_time_is_recorded_so_timeouts_can_fire() -> None:
    n = node("n1", "pod-restart-required", cordoned=True)
    pending = driver("n1", NEW, ready=False)
    result = plan(fleet([n], [pending]), AUTO, NOW)
    assert result.actions == (SetState("n1", State.POD_RESTART, STAMP, "entry time recorded"),)


# ---- validation ----


def validating(elapsed: float = 10) -> Node:
    return node("n1", "validation-required", since=NOW - elapsed, cordoned=True)


@pytest.mark.parametrize(
    ("validators", "elapsed", "expected"),
    [
        ([validator("n1")], 10, ["uncordon-required"]),
        ([validator("n1", ready=False)], 10, []),
        ([validator("n1", ready=False)], 600, ["upgrade-failed"]),
        ([], 10, ["uncordon-required"]),  # no validator deployed anywhere
        ([validator("n2")], 10, []),  # deployed, but not (yet) on this node
    ],
)
def test_validation(validators: list[Pod], elapsed: float, expected: list[str]) -> None:
    drivers = [driver("n1", NEW), driver("n2", NEW)]
    f = fleet([validating(elapsed), node("n2", "upgrade-done")], drivers, validators=validators)
    assert [s for n, s in moves(plan(f, AUTO, NOW).actions) if n == "n1"] == expected


RESTARTED = NOW - 60  # when the new driver pod was created


@pytest.mark.parametrize(
    ("validators", "expected_deleted", "expected"),
    [
        # Ready since before the new driver existed: it validated the old one; restart it.
        ([validator("n1", ready_since=RESTARTED - 1)], ["validator-n1"], []),
        # Ready again after the new driver pod was created: it validated the new one.
        ([validator("n1", ready_since=RESTARTED)], [], ["uncordon-required"]),
        # The stale one is on its way out and its replacement is not Ready yet: wait.
        (
            [
                validator("n1", ready_since=RESTARTED - 1, deleting=True),
                validator("n1", ready=False, ready_since=RESTARTED + 5, name="validator-n1-b"),
            ],
            [],
            [],
        ),
    ],
)
def test_validation_needs_a_validator_ready_after_the_new_driver(
    validators: list[Pod], expected_deleted: list[str], expected: list[str]
) -> None:
    f = fleet([validating()], [driver("n1", NEW, created=RESTARTED)], validators=validators)
    actions = plan(f, AUTO, NOW).actions
    assert [a.pod for a in actions if isinstance(a, DeletePod)] == expected_deleted
    assert [s for _, s in moves(actions)] == expected


def test_validation_waits_for_a_ready_driver() -> None:
    f = fleet([validating()], [driver("n1", NEW, ready=False)], validators=[validator("n1")])
    assert plan(f, AUTO, NOW).actions == ()
    f = fleet([validating(600)], [driver("n1", NEW, ready=False)], validators=[validator("n1")])
    (fail,) = plan(f, AUTO, NOW).actions
    assert isinstance(fail, Fail) and "no Ready driver pod of the new version" in fail.reason


# ---- uncordon ----


def test_uncordon_only_what_the_upgrade_cordoned() -> None:
    ours = node("n1", "uncordon-required", cordoned=True, was_cordoned=False)
    theirs = node("n2", "uncordon-required", cordoned=True, was_cordoned=True)
    unknown = node("n3", "uncordon-required", cordoned=True)
    drivers = [driver(n, NEW) for n in ("n1", "n2", "n3")]
    result = plan(
        fleet([ours, theirs, unknown], drivers), replace(AUTO, max_parallel_upgrades=0), NOW
    )
    assert [a for a in result.actions if isinstance(a, Uncordon)] == [Uncordon("n1")]
    assert moves(result.actions) == [
        ("n1", "upgrade-done"),
        ("n2", "upgrade-done"),
        ("n3", "upgrade-done"),
    ]
    assert any(
        isinstance(a, Event) and a.reason == "LeftCordoned" and a.node == "n3"
        for a in result.actions
    )
    done = next(a for a in result.actions if isinstance(a, SetState) and a.node == "n1")
    assert done.patch()["metadata"]["annotations"][UPGRADE_WAS_CORDONED] is None
    assert Uncordon("n1").patch() == {"spec": {"unschedulable": None}}


# ---- failure and recovery ----


def failed(annotations: dict[str, str] | None = None) -> Node:
    return node(
        "n1",
        "upgrade-failed",
        cordoned=True,
        was_cordoned=False,
        since=NOW - 100,
        annotations=annotations,
    )


def test_failed_node_recovers_once_new_driver_and_validator_are_ready() -> None:
    f = fleet([failed()], [driver("n1", NEW)], validators=[validator("n1")])
    assert moves(plan(f, AUTO, NOW).actions) == [("n1", "uncordon-required")]


def test_failed_node_restarts_a_stale_validator_before_it_recovers() -> None:
    f = fleet(
        [failed()],
        [driver("n1", NEW, created=RESTARTED)],
        validators=[validator("n1", ready_since=RESTARTED - 1)],
    )
    result = plan(f, AUTO, NOW)
    assert result.actions == (DeletePod("validator-n1", "gpu-operator", False, "n1"),)
    assert result.summary.failed == 1


@pytest.mark.parametrize(
    ("drivers", "validators"),
    [
        ([driver("n1", OLD)], [validator("n1")]),  # old driver still there
        ([driver("n1", NEW, ready=False)], [validator("n1")]),
        ([driver("n1", NEW)], [validator("n1", ready=False)]),  # it failed validation
    ],
)
def test_failed_node_stays_failed(drivers: list[Pod], validators: list[Pod]) -> None:
    f = fleet([failed()], drivers, validators=validators)
    result = plan(f, AUTO, NOW)
    assert result.actions == ()
    assert result.summary.failed == 1


def test_failed_node_retries_when_requested_again() -> None:
    n = failed(annotations={UPGRADE_REQUESTED: "true"})
    result = plan(fleet([n], [driver("n1", OLD)]), AUTO, NOW)
    assert moves(result.actions) == [("n1", "upgrade-required")]


def test_recovery_takes_a_parallel_slot() -> None:
    busy = node("n2", "pod-restart-required", cordoned=True, was_cordoned=False, since=NOW)
    f = fleet(
        [failed(), busy],
        [driver("n1", NEW), driver("n2", OLD, deleting=True)],
        validators=[validator("n1"), validator("n2", ready=False)],
    )
    policy = replace(AUTO, max_parallel_upgrades=1, max_unavailable=10)
    assert moves(plan(f, policy, NOW).actions) == []
    assert moves(plan(f, replace(policy, max_parallel_upgrades=2), NOW).actions) == [
        ("n1", "uncordon-required")
    ]


# ---- budget ----


def required(n: int) -> list[Node]:
    return [node(f"n{i}", "upgrade-required") for i in range(1, n + 1)]


def started(actions: tuple[Action, ...]) -> list[str]:
    return [n for n, s in moves(actions) if s == "cordon-required"]


@pytest.mark.parametrize(
    ("parallel", "max_unavailable", "count", "expected"),
    [
        (1, "25%", 8, 1),
        (3, "25%", 8, 2),  # 25% of 8 = 2
        (3, "25%", 9, 3),  # 25% of 9 = 2.25, rounded up
        (0, "25%", 9, 3),  # unlimited parallel: maxUnavailable decides
        (0, "100%", 9, 9),
        (0, 4, 9, 4),
        (0, "4", 9, 4),
        (5, 0, 9, 0),
        (5, "0%", 9, 0),
        (2, "50%", 1, 1),
    ],
)
def test_start_budget(parallel: int, max_unavailable: int | str, count: int, expected: int) -> None:
    policy = replace(AUTO, max_parallel_upgrades=parallel, max_unavailable=max_unavailable)
    result = plan(fleet(required(count)), policy, NOW)
    assert started(result.actions) == [f"n{i}" for i in range(1, expected + 1)]
    assert result.summary.budget_slots == expected


def test_in_progress_nodes_use_parallel_slots_and_budget() -> None:
    busy = node("n0", "validation-required", cordoned=True, since=NOW)
    f = fleet([busy, *required(5)], validators=[validator("n0", ready=False)])
    policy = replace(AUTO, max_parallel_upgrades=2, max_unavailable=10)
    assert started(plan(f, policy, NOW).actions) == ["n1"]


def test_cordon_required_counts_as_unavailable_before_it_is_cordoned() -> None:
    starting = node("n0", "cordon-required")
    policy = replace(AUTO, max_parallel_upgrades=0, max_unavailable=2)
    assert started(plan(fleet([starting, *required(5)]), policy, NOW).actions) == ["n1"]


def test_pre_existing_unavailability_limits_new_starts() -> None:
    others = [node("x1", "upgrade-done", cordoned=True), node("x2", "upgrade-done", ready=False)]
    drivers = [driver("x1", NEW), driver("x2", NEW), *(driver(f"n{i}") for i in range(1, 6))]
    policy = replace(AUTO, max_parallel_upgrades=0, max_unavailable=3)
    result = plan(fleet([*others, *required(5)], drivers), policy, NOW)
    assert started(result.actions) == ["n1"]
    assert result.summary.unavailable == 2


def test_already_cordoned_nodes_start_even_beyond_the_budget() -> None:
    # Upgrading a node that is cordoned anyway takes nothing more out of service.
    nodes = [node("n1", "upgrade-required"), node("n2", "upgrade-required", cordoned=True)]
    extra = [node(f"x{i}", "upgrade-done", cordoned=True) for i in range(3)]
    drivers = [driver("n1"), driver("n2"), *(driver(f"x{i}", NEW) for i in range(3))]
    policy = replace(AUTO, max_parallel_upgrades=0, max_unavailable=2)
    result = plan(fleet([*nodes, *extra], drivers), policy, NOW)
    assert started(result.actions) == ["n2"]
    assert any("maxUnavailable" in n for n in result.notes)


def test_a_failed_node_frees_its_slot_but_stays_unavailable() -> None:
    broken = node("n0", "upgrade-failed", cordoned=True, was_cordoned=False, since=NOW)
    nodes = [broken, *required(4)]
    one_slot = replace(AUTO, max_parallel_upgrades=1, max_unavailable=2)
    assert started(plan(fleet(nodes), one_slot, NOW).actions) == ["n1"]
    no_room = replace(AUTO, max_parallel_upgrades=1, max_unavailable=1)
    result = plan(fleet(nodes), no_room, NOW)
    assert started(result.actions) == []
    assert any("n0" in n for n in result.notes)


def test_skipped_nodes_are_not_managed() -> None:
    skipped = node("n1", labels={UPGRADE_SKIP: "true"})
    result = plan(fleet([skipped, node("n2")]), AUTO, NOW)
    assert moves(result.actions) == [("n2", "upgrade-required")]
    assert result.summary.total == 1


def test_percent_is_scaled_from_managed_nodes_only() -> None:
    skipped = [node(f"s{i}", labels={UPGRADE_SKIP: "true"}) for i in range(8)]
    non_gpu = [node(f"cpu{i}") for i in range(8)]
    drivers = [*(driver(f"s{i}") for i in range(8)), *(driver(f"n{i}") for i in range(1, 5))]
    policy = replace(AUTO, max_parallel_upgrades=0, max_unavailable="50%")
    result = plan(fleet([*skipped, *non_gpu, *required(4)], drivers), policy, NOW)
    assert result.summary.total == 4 and result.summary.max_unavailable == 2
    assert started(result.actions) == ["n1", "n2"]


# ---- auto upgrade off, summary, determinism ----


def test_auto_upgrade_off_touches_nothing_and_says_so() -> None:
    nodes = [node("n1"), node("n2"), node("n3", "pod-restart-required", cordoned=True)]
    drivers = [driver("n1"), driver("n2", NEW), driver("n3")]
    result = plan(fleet(nodes, drivers), Policy(), NOW)
    assert result.actions == ()
    assert any("automatic driver upgrades are off" in n and "1 of 3" in n for n in result.notes)
    assert any("mid-upgrade" in n for n in result.notes)
    assert "off" in result.line


def test_summary_counts_and_line() -> None:
    nodes = [
        node("a", "upgrade-done"),
        node("b"),
        node("c", "upgrade-required"),
        node("d", "validation-required", cordoned=True, since=NOW),
        node("e", "upgrade-failed", cordoned=True),
    ]
    drivers = [driver("a", NEW), driver("b"), driver("c"), driver("d", NEW), driver("e")]
    result = plan(fleet(nodes, drivers, validators=[validator("d", ready=False)]), AUTO, NOW)
    s = result.summary
    assert (s.total, s.done, s.pending, s.in_progress, s.failed) == (5, 1, 2, 1, 1)
    assert s.unavailable == 2 and s.max_unavailable == 2 and s.budget_slots == 0
    assert result.line == (
        "driver upgrade: 1/5 done, 1 in progress, 2 pending, 1 failed; 2/2 unavailable"
    )


def test_unknown_state_label_is_noted_and_treated_as_unset() -> None:
    result = plan(fleet([node("n1", "node-maintenance-required")]), AUTO, NOW)
    assert moves(result.actions) == [("n1", "upgrade-required")]
    assert any("unknown upgrade state" in n for n in result.notes)


def test_same_fleet_same_plan() -> None:
    nodes = [*required(3), node("n4", "pod-deletion-required", since=NOW - 5, cordoned=True)]
    f = fleet(nodes, workloads=[workload("gpu", on="n4")])
    policy = replace(AUTO, max_parallel_upgrades=3)
    assert plan(f, policy, NOW) == plan(f, policy, NOW)


def test_actions_for_one_node_are_contiguous() -> None:
    nodes = [node(f"n{i}", "cordon-required") for i in range(4)]
    result = plan(fleet(nodes), replace(AUTO, max_parallel_upgrades=0), NOW)
    order = [a.node for a in result.actions]
    assert order == sorted(order)


@pytest.mark.parametrize("empty", [Fleet(()), fleet([])], ids=["bare", "driver-daemonset-known"])
def test_empty_fleet(empty: Fleet) -> None:
    result = plan(empty, AUTO, NOW)
    assert result.actions == () and result.summary.total == 0
