"""Whether an operand is ready, from its DaemonSets and, for OnDelete ones, their pods."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.controller.readiness import (
    DaemonSetReadiness,
    by_owner,
    component_readiness,
    daemonset_readiness,
)
from tests.unit.controller.builders import daemonset, pod, revision

DS = daemonset("nvidia-driver-daemonset", "driver", desired=2, on_delete=True)
UID = DS["metadata"]["uid"]
REVISIONS = [revision(UID, 1, "old"), revision(UID, 2, "new")]


@pytest.mark.parametrize(
    ("ds", "ready", "message"),
    [
        (daemonset("d", "c", desired=3), True, None),
        (daemonset("d", "c", desired=3, ready=2), False, "2/3 ready, 3/3 updated"),
        (daemonset("d", "c", desired=3, updated=1), False, "3/3 ready, 1/3 updated"),
        (daemonset("d", "c", desired=0), True, None),  # no GPU node yet
        (daemonset("d", "c", generation=2, observed=1), False, "rollout not observed yet"),
    ],
)
def test_rolling_daemonsets_use_the_controllers_numbers(
    ds: dict[str, Any], ready: bool, message: str | None
) -> None:
    result = daemonset_readiness(ds)
    assert (result.ready, result.message) == (ready, message)
    assert result.name == "d"


def drivers(*specs: tuple[str, bool]) -> list[dict[str, Any]]:
    return [
        pod(f"driver-{i}", owner_uid=UID, node=f"gpu-{i}", revision=rev, ready=ok)
        for i, (rev, ok) in enumerate(specs)
    ]


@pytest.mark.parametrize(
    ("pods", "revisions", "ready", "counted"),
    [
        (drivers(("new", True), ("new", True)), REVISIONS, True, 2),
        # the controller's status says nothing about pods left on an old template
        (drivers(("new", True), ("old", True)), REVISIONS, False, 1),
        (drivers(("new", True), ("new", False)), REVISIONS, False, 1),
        (drivers(("new", True)), REVISIONS, False, 1),  # one pod missing
        (drivers(("new", True), ("new", True)), [], False, 0),  # revisions not seen yet
    ],
)
def test_on_delete_daemonsets_check_every_pod(
    pods: list[dict[str, Any]], revisions: list[dict[str, Any]], ready: bool, counted: int
) -> None:
    result = daemonset_readiness(DS, pods, revisions)
    assert result.ready is ready
    assert result.available == counted
    assert (
        result.message is None
        if ready
        else result.message == f"{counted}/2 pods ready on the newest revision"
    )


def test_an_on_delete_daemonset_with_nothing_to_run_is_ready() -> None:
    empty = daemonset("nvidia-driver-daemonset", "driver", desired=0, on_delete=True)
    assert daemonset_readiness(empty, [], []).ready


def test_objects_are_grouped_by_their_owning_daemonset() -> None:
    a, b = pod("a", owner_uid="uid-x"), pod("b", owner_uid="uid-y")
    orphan = pod("c")
    assert by_owner([a, b, orphan, *REVISIONS]) == {
        "uid-x": [a], "uid-y": [b], UID: REVISIONS,
    }  # fmt: skip


def test_component_readiness_looks_at_its_own_daemonsets_only() -> None:
    mine = daemonset("nvidia-driver-daemonset-rhel", "driver", desired=1)
    other = daemonset("nvidia-device-plugin-daemonset", "device-plugin", desired=1, ready=0)
    pods = by_owner(drivers(("new", True), ("new", True)))
    revisions = by_owner(REVISIONS)
    result = component_readiness("driver", [DS, mine, other], pods, revisions)
    assert [(r.name, r.ready) for r in result] == [
        ("nvidia-driver-daemonset", True),
        ("nvidia-driver-daemonset-rhel", True),
    ]


def test_a_component_without_daemonsets_is_not_ready_yet() -> None:
    assert component_readiness("dcgm", [DS], {}, {}) == [
        DaemonSetReadiness("dcgm", False, 0, 0, 0, "DaemonSet not created yet")
    ]
