"""ClusterPolicy status from observations, and which policy is the active one."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.controller.active_policy import active_policy
from gpu_operator.controller.clusterpolicy.status import Observation, compute_status
from gpu_operator.controller.readiness import DaemonSetReadiness
from tests.unit.controller.builders import LATER, NAMESPACE, STAMP, policy

READY = DaemonSetReadiness("nvidia-device-plugin-daemonset", True, 2, 2, 2)
NOT_READY = DaemonSetReadiness("nvidia-driver-daemonset", False, 2, 1, 2, "1/2 ready, 2/2 updated")


def obs(**kw: Any) -> Observation:
    base: dict[str, Any] = {
        "namespace": NAMESPACE,
        "generation": 3,
        "gpu_nodes": 2,
        "nfd_present": True,
        "components": {"device-plugin": [READY]},
    }
    return Observation(**(base | kw))


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    cond: dict[str, Any] = status["conditions"][0]
    return cond


@pytest.mark.parametrize(
    ("observation", "state", "reason", "message"),
    [
        (obs(), "ready", "Reconciled", "all components ready on 2 GPU nodes"),
        (obs(components={"driver": [NOT_READY], "device-plugin": [READY]}),
         "notReady", "OperandNotReady", "not ready: driver"),
        (obs(gpu_nodes=0), "notReady", "NoGPUNodes", "no node with an NVIDIA GPU was found"),
        (obs(gpu_nodes=0, nfd_present=False), "notReady", "NFDLabelsMissing",
         "no node carries Node Feature Discovery labels"),
        (obs(apply_error="forbidden (DaemonSet/x)"), "notReady", "ReconcileFailed",
         "forbidden (DaemonSet/x)"),
        (obs(problems=("spec.a: bad", "spec.b: worse")), "notReady", "ReconcileFailed",
         "invalid spec, nothing applied: spec.a: bad; spec.b: worse"),
        # an invalid spec is the first thing to fix, whatever else is wrong
        (obs(problems=("spec.a: bad",), apply_error="x", gpu_nodes=0), "notReady",
         "ReconcileFailed", "invalid spec"),
        (obs(ignored_because="first"), "ignored", "Ignored",
         "ClusterPolicy first is the active one; this one is ignored"),
    ],
)  # fmt: skip
def test_state_and_ready_condition(
    observation: Observation, state: str, reason: str, message: str
) -> None:
    status = compute_status(observation, {}, STAMP)
    assert status["state"] == state
    ready, error = status["conditions"][:2]
    assert (ready["type"], ready["reason"]) == ("Ready", reason)
    assert ready["message"].startswith(message)
    assert ready["status"] == ("True" if state == "ready" else "False")
    assert error["type"] == "Error"
    assert error["status"] == ("True" if reason == "ReconcileFailed" else "False")
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])
    assert status["observedGeneration"] == 3 and status["namespace"] == NAMESPACE


def test_components_are_summed_over_their_daemonsets_with_their_messages() -> None:
    other = DaemonSetReadiness("nvidia-driver-daemonset-rhel", True, 1, 1, 1)
    status = compute_status(obs(components={"driver": [NOT_READY, other]}), {}, STAMP)
    assert status["components"] == [
        {
            "name": "driver",
            "ready": False,
            "desired": 3,
            "available": 2,
            "updated": 3,
            "message": "nvidia-driver-daemonset: 1/2 ready, 2/2 updated",
        }
    ]
    ready_only = compute_status(obs(), {}, STAMP)["components"][0]
    assert "message" not in ready_only


def test_unimplemented_sections_add_a_condition() -> None:
    status = compute_status(obs(unimplemented=("vgpuManager", "kataManager")), {}, STAMP)
    (extra,) = status["conditions"][2:]
    assert extra["status"] == "True"
    assert extra["message"].endswith("vgpuManager, kataManager")
    assert len(compute_status(obs(), {}, STAMP)["conditions"]) == 2


def test_the_upgrade_summary_is_reported_as_given() -> None:
    summary = {"total": 2, "done": 1, "message": "driver upgrade: 1/2 done"}
    assert compute_status(obs(upgrade=summary), {}, STAMP)["upgrade"] == summary
    assert "upgrade" not in compute_status(obs(), {}, STAMP)


def test_transition_times_move_only_when_a_condition_flips() -> None:
    before = compute_status(obs(), {}, STAMP)
    same = compute_status(obs(), before, LATER)
    assert same == before  # nothing changed: nothing to write
    flipped = compute_status(obs(gpu_nodes=0), before, LATER)
    ready, error = flipped["conditions"]
    assert ready["lastTransitionTime"] == LATER  # True -> False
    assert error["lastTransitionTime"] == STAMP  # False stays False, though its reason moved


@pytest.mark.parametrize(
    ("policies", "active"),
    [
        ([], None),
        ([policy("b", created="2027-01-02T00:00:00Z"),
          policy("a", created="2027-01-03T00:00:00Z")], "b"),
        ([policy("b"), policy("a")], "a"),  # created together: by name
        ([policy("old", deleting=True), policy("new", created="2027-02-01T00:00:00Z")], "new"),
        ([policy("gone", deleting=True)], None),
    ],
)  # fmt: skip
def test_the_oldest_live_policy_is_active(
    policies: list[dict[str, Any]], active: str | None
) -> None:
    assert active_policy(policies) == active
