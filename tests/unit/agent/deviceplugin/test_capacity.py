"""Simulated capacity: the status patch that gives a kwok node the device plugin's resources,
and the refusal to touch a node whose kubelet owns its capacity."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.agent.deviceplugin.capacity import (
    NotSimulatedError,
    capacity_patch,
    set_capacity,
)
from gpu_operator.labels import KWOK_NODE
from gpu_operator.views import NodeView

BASE = {"cpu": "32", "memory": "256Gi", "pods": "110"}


def node(extra: dict[str, str] | None = None, *, kwok: bool = True) -> NodeView:
    status = {**BASE, **(extra or {})}
    annotations = {KWOK_NODE: "fake"} if kwok else {}
    return NodeView("n", annotations=annotations, capacity=status, allocatable=dict(status))


def test_first_write_adds_the_resources_to_capacity_and_allocatable() -> None:
    assert capacity_patch(node(), {"nvidia.com/gpu": 8}) == {
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "8"},
        }
    }


def test_nothing_to_write_when_it_already_matches() -> None:
    assert capacity_patch(node({"nvidia.com/gpu": "8"}), {"nvidia.com/gpu": 8}) is None


def test_a_switch_removes_what_is_no_longer_advertised_and_keeps_the_rest() -> None:
    patch = capacity_patch(node({"nvidia.com/gpu": "8"}), {"nvidia.com/gpu.shared": 32})
    expected = {"nvidia.com/gpu": None, "nvidia.com/gpu.shared": "32"}
    assert patch == {"status": {"capacity": expected, "allocatable": expected}}


class Recorder:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Any, str | None]] = []

    def merge_patch(
        self, kind: str, name: str, patch: Any, *, subresource: str | None = None
    ) -> Any:
        self.patches.append((kind, name, patch, subresource))
        return {}


def test_writes_go_to_the_status_subresource_of_kwok_nodes_only() -> None:
    api = Recorder()
    assert set_capacity(api, node(), {"nvidia.com/gpu": 1})  # type: ignore[arg-type]
    assert api.patches[0][3] == "status"
    with pytest.raises(NotSimulatedError, match="kubelet owns its capacity"):
        set_capacity(api, node(kwok=False), {"nvidia.com/gpu": 1})  # type: ignore[arg-type]
    assert len(api.patches) == 1
