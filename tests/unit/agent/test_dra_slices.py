"""A node's pool: the slices it should have and the fewest writes to get there."""

from __future__ import annotations

import copy
from typing import Any

from gpu_operator.agent.dra import slices

OWNER = {"name": "node-a", "uid": "1234"}


def device(name: str, memory: str = "40Gi") -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": memory}},
    }


def published(node: str, devs: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    """As the API server returns them: with fields it adds."""
    out = slices.desired_slices(node, devs, generation, OWNER)
    for s in out:
        s["metadata"].update(uid="u", resourceVersion="7")
    return out


def test_first_publication_is_one_write_at_generation_1() -> None:
    devs = [device(f"gpu-{i}") for i in range(8)]
    p = slices.plan("node-a", [], devs, OWNER)
    assert p.writes == 1 and p.generation == 1 and not p.delete
    (one,) = p.apply
    assert one["metadata"]["name"] == "node-a-gpu.nvidia.com-0"
    assert one["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert one["spec"]["driver"] == "gpu.nvidia.com"
    assert one["spec"]["nodeName"] == "node-a"
    assert one["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in one["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]


def test_nothing_changed_nothing_written() -> None:
    devs = [device(f"gpu-{i}") for i in range(8)]
    p = slices.plan("node-a", published("node-a", devs, 3), copy.deepcopy(devs), OWNER)
    assert p.writes == 0 and p.generation == 3


def test_changed_devices_bump_the_generation() -> None:
    before = [device("gpu-0")]
    after = [device("gpu-0-mig-1g5gb-19-0", "4864Mi"), device("gpu-0-mig-1g5gb-19-1", "4864Mi")]
    p = slices.plan("node-a", published("node-a", before, 4), after, OWNER)
    assert p.generation == 5 and p.writes == 1
    assert p.apply[0]["spec"]["pool"]["generation"] == 5


def test_a_changed_attribute_is_a_change() -> None:
    devs = [device("gpu-0")]
    changed = [device("gpu-0", "80Gi")]
    assert slices.plan("node-a", published("node-a", devs, 1), changed, OWNER).writes == 1


def test_more_than_128_devices_span_slices_and_shrinking_deletes() -> None:
    many = [device(f"gpu-0-mig-x-{i}") for i in range(130)]
    p = slices.plan("node-a", [], many, OWNER)
    assert [len(s["spec"]["devices"]) for s in p.apply] == [128, 2]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in p.apply} == {2}
    shrink = slices.plan("node-a", published("node-a", many, 1), many[:3], OWNER)
    assert shrink.delete == ("node-a-gpu.nvidia.com-1",)
    assert shrink.generation == 2


def test_a_node_without_gpus_publishes_an_empty_pool() -> None:
    p = slices.plan("node-a", [], [], OWNER)
    assert p.writes == 1 and p.apply[0]["spec"]["devices"] == []
