"""A node's pool: the slices it should have and the fewest writes to get there."""

from __future__ import annotations

import copy
from typing import Any

import pytest

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


# -- DynamicMIG: counter sets laid out as the API server wants them -------------------------------
# The 1.34 API server's limits on one ResourceSlice (pkg/apis/resource/types.go).
MAX_SHARED_COUNTERS = 32  # counters in all counter sets of a slice
MAX_DEVICE_COUNTERS = 1024  # counters all devices of a slice consume
MAX_COUNTERS_PER_DEVICE = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # per device


def node_pool(key: str, gpus: int = 8) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The DynamicMIG devices and counter sets of a node with ``gpus`` GPUs of ``key``."""
    from gpu_operator.agent.dra import partitions
    from gpu_operator.agent.nvml import Nvml
    from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml

    install_simulated_nvml(f"{key}:{gpus}", seed="slices")
    try:
        with Nvml() as nvml:
            return partitions.pool(nvml.inventory())
    finally:
        uninstall_simulated_nvml()


def counters_in(entries: list[dict[str, Any]]) -> int:
    return sum(len(e["counters"]) for e in entries)


@pytest.mark.parametrize("key", ["a100-40gb", "h100-80gb", "h200-141gb", "b200-180gb"])
def test_a_dynamic_mig_pool_is_one_slice_per_gpu_with_its_counter_set_within_1_34_limits(
    key: str,
) -> None:
    devs, sets = node_pool(key)
    out = slices.desired_slices("node-a", devs, 1, OWNER, sets, slices.COMBINED)
    assert len(out) == 8
    for i, s in enumerate(out):
        spec = s["spec"]
        if not sets:  # an A100 out of MIG mode: whole, as without DynamicMIG
            assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}"]
            continue
        (counter_set,) = spec["sharedCounters"]
        assert counter_set["name"] == f"gpu-{i}-counter-set"
        assert {c["counterSet"] for d in spec["devices"] for c in d["consumesCounters"]} == {
            counter_set["name"]
        }, "a device's counter set is in its own slice (1.34)"
        assert len(spec["devices"]) <= slices.MAX_DEVICES_PER_SLICE
        assert counters_in(spec["sharedCounters"]) <= MAX_SHARED_COUNTERS
        consumed = [counters_in(d["consumesCounters"]) for d in spec["devices"]]
        assert sum(consumed) <= MAX_DEVICE_COUNTERS
        assert max(consumed) <= MAX_COUNTERS_PER_DEVICE
        for d in spec["devices"]:
            assert len(d["attributes"]) + len(d["capacity"]) <= MAX_ATTRIBUTES_AND_CAPACITIES
    assert [d for s in out for d in s["spec"]["devices"]] == devs, "every device, in order"


def test_from_1_35_counter_sets_have_a_slice_of_their_own() -> None:
    devs, sets = node_pool("h100-80gb", gpus=2)
    first, *per_gpu = slices.desired_slices("node-a", devs, 1, OWNER, sets, slices.SPLIT)
    assert "devices" not in first["spec"] and first["spec"]["sharedCounters"] == sets
    assert len(per_gpu) == 2
    assert all("sharedCounters" not in s["spec"] for s in per_gpu)
    assert [d for s in per_gpu for d in s["spec"]["devices"]] == devs
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in [first, *per_gpu]} == {3}
    assert slices.dynamic_layout((1, 34)) == slices.COMBINED
    assert slices.dynamic_layout((1, 35)) == slices.dynamic_layout((2, 0)) == slices.SPLIT
    # No counter set (no GPU in MIG reach): no empty slice for them; no device: one empty slice
    whole, _ = node_pool("a100-40gb", gpus=1)
    (only,) = slices.desired_slices("node-a", whole[:1], 1, OWNER, (), slices.SPLIT)
    assert "sharedCounters" not in only["spec"] and only["spec"]["devices"] == whole[:1]
    (empty,) = slices.desired_slices("node-a", [], 1, OWNER, (), slices.SPLIT)
    assert empty["spec"]["pool"]["resourceSliceCount"] == 1


def test_an_unchanged_dynamic_mig_pool_writes_nothing_and_a_changed_counter_set_rewrites() -> None:
    devs, sets = node_pool("h100-80gb", gpus=2)
    stored = published_with("node-a", devs, sets, 1)
    unchanged = slices.plan("node-a", stored, copy.deepcopy(devs), OWNER, sets, slices.COMBINED)
    assert unchanged.writes == 0
    smaller = copy.deepcopy(sets)
    smaller[1]["counters"]["memory"]["value"] = "1Gi"
    again = slices.plan("node-a", stored, devs, OWNER, smaller, slices.COMBINED)
    assert again.generation == 2 and again.writes == 2  # the whole pool, at a new generation


def published_with(
    node: str, devs: list[dict[str, Any]], sets: list[dict[str, Any]], generation: int
) -> list[dict[str, Any]]:
    out = slices.desired_slices(node, devs, generation, OWNER, sets, slices.COMBINED)
    for s in out:
        s["metadata"].update(uid="u", resourceVersion="7")
    return out
