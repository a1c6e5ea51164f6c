"""What a node advertises: resource names and counts from the inventory and the config,
replica ids, and refusals that say what to fix."""

from __future__ import annotations

import pytest

from gpu_operator.agent.deviceplugin.config_file import MigStrategy, parse_device_plugin_config
from gpu_operator.agent.deviceplugin.resources import (
    ResourceError,
    advertised_resources,
    device_map,
    physical_devices,
    physical_id,
)
from gpu_operator.agent.inventory import Inventory
from tests.unit.agent.conftest import Simulate, inventory_with

TIME_SLICED = "sharing: {timeSlicing: {%s resources: [{name: nvidia.com/gpu, replicas: 4}]}}"


def counts(
    inventory: Inventory, text: str = "", strategy: MigStrategy | None = None
) -> dict[str, int]:
    return advertised_resources(inventory, parse_device_plugin_config(text), strategy)


@pytest.mark.parametrize(
    ("spec", "mig_config", "text", "strategy", "expected"),
    [
        ("a100-40gb:8", None, "", None, {"nvidia.com/gpu": 8}),
        ("t4:1,l4:2", None, "", None, {"nvidia.com/gpu": 3}),
        (
            "a100-40gb:8",
            None,
            TIME_SLICED % "renameByDefault: true,",
            None,
            {"nvidia.com/gpu.shared": 32},
        ),
        ("a100-40gb:8", None, TIME_SLICED % "", None, {"nvidia.com/gpu": 32}),
        (
            "h100-80gb:2",
            None,
            "sharing: {mps: {resources: [{name: gpu, replicas: 3, rename: gpu.mps}]}}",
            None,
            {"nvidia.com/gpu.mps": 6},
        ),
        # MIG mixed: 2 x 1g.5gb + 1 x 2g.10gb + 1 x 3g.20gb on each of 8 GPUs
        (
            "a100-40gb:8",
            "all-balanced",
            "",
            "mixed",
            {"nvidia.com/mig-1g.5gb": 16, "nvidia.com/mig-2g.10gb": 8, "nvidia.com/mig-3g.20gb": 8},
        ),
        ("a100-40gb:8", "all-1g.5gb", "flags: {migStrategy: single}", None, {"nvidia.com/gpu": 56}),
        ("a100-40gb:8", "all-1g.5gb", "", "none", {"nvidia.com/gpu": 8}),
        ("h100-80gb:2", "all-1g.10gb", "", "mixed", {"nvidia.com/mig-1g.10gb": 14}),
        # MIG on one GPU, off on the other, mixed: both kinds side by side
        (
            "a100-40gb:2",
            "custom-0",
            "",
            "mixed",
            {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.20gb": 2},
        ),
        (
            "a100-40gb:8",
            "all-balanced",
            "sharing: {timeSlicing: {resources: [{name: mig-1g.5gb, replicas: 2}]}}",
            "mixed",
            {"nvidia.com/mig-1g.5gb": 32, "nvidia.com/mig-2g.10gb": 8, "nvidia.com/mig-3g.20gb": 8},
        ),
        (
            "a100-40gb:8",
            None,
            "sharing: {timeSlicing: {resources: "
            "[{name: gpu, replicas: 4, rename: gpu.shared, devices: 2}]}}",
            None,
            {"nvidia.com/gpu": 6, "nvidia.com/gpu.shared": 8},
        ),
        (
            "a100-40gb:4",
            None,
            "sharing: {timeSlicing: {resources: "
            "[{name: gpu, replicas: 2, rename: gpu.shared, devices: [1, '3']}]}}",
            None,
            {"nvidia.com/gpu": 2, "nvidia.com/gpu.shared": 4},
        ),
        # a shared resource the node does not have is skipped, as NVIDIA does
        (
            "t4:1",
            None,
            "sharing: {timeSlicing: {resources: [{name: mig-1g.5gb, replicas: 2}]}}",
            None,
            {"nvidia.com/gpu": 1},
        ),
        ("a100-40gb:1", None, "", None, {"nvidia.com/gpu": 1}),
    ],
)
def test_advertised_resources(
    simulate: Simulate,
    spec: str,
    mig_config: str | None,
    text: str,
    strategy: MigStrategy | None,
    expected: dict[str, int],
) -> None:
    if mig_config == "custom-0":
        inventory = _a100_pair_with_mig_on_gpu0(simulate)
    else:
        inventory = inventory_with(simulate, spec, mig_config)
    assert counts(inventory, text, strategy) == expected


def test_a_node_without_gpus_advertises_nothing() -> None:
    assert counts(Inventory(driver_version="580.95.05", cuda_driver_version=13000)) == {}


def _a100_pair_with_mig_on_gpu0(simulate: Simulate) -> Inventory:
    from gpu_operator.agent.inventory import Placement
    from gpu_operator.agent.nvml import Nvml

    simulate("a100-40gb:2")
    with Nvml() as nvml:
        nvml.set_mig_mode(0, True)
        nvml.reset_gpu(0)
        for start in (0, 4):
            gi = nvml.create_gpu_instance(0, 2, Placement(start, 4))
            nvml.create_compute_instance(0, gi, 3)
        return nvml.inventory()


def test_replicas_stand_for_their_gpu(simulate: Simulate) -> None:
    inventory = inventory_with(simulate, "a100-40gb:2")
    devices = device_map(inventory, parse_device_plugin_config(TIME_SLICED % ""))["nvidia.com/gpu"]
    gpu0 = inventory.gpus[0]
    assert [d.id for d in devices[:4]] == [f"{gpu0.uuid}::{n}" for n in range(4)]
    assert {physical_id(d.id) for d in devices} == {g.uuid for g in inventory.gpus}
    assert all(d.replicas == 4 and d.uuid == physical_id(d.id) for d in devices)
    assert [d.uuid for d in physical_devices(devices)] == [g.uuid for g in inventory.gpus]


def test_mig_devices_carry_their_parent(simulate: Simulate) -> None:
    inventory = inventory_with(simulate, "a100-40gb:2", "all-balanced")
    found = device_map(inventory, parse_device_plugin_config(""), "mixed")
    small = found["nvidia.com/mig-1g.5gb"]
    assert [d.index for d in small] == ["0:2", "0:3", "1:2", "1:3"]
    parent = inventory.gpus[1]
    assert {d.gpu_uuid for d in small if d.gpu_index == 1} == {parent.uuid}
    assert all(d.minor == parent.minor_number for d in small if d.gpu_index == 1)
    assert all(d.uuid.startswith("MIG-") and d.mig is not None for d in small)


@pytest.mark.parametrize(
    ("spec", "mig_config", "text", "strategy", "message"),
    [
        ("a100-40gb:2", "all-balanced", "", "single", "single needs one MIG profile"),
        ("a100-40gb:1", "all-enabled", "", "mixed", "MIG is enabled on GPU 0 but it has no MIG"),
        (
            "a100-40gb:2",
            None,
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 3}]}}",
            None,
            "sharing.timeSlicing.resources[0].devices: 3 devices to replicate",
        ),
        (
            "a100-40gb:2",
            None,
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: ['5']}]}}",
            None,
            "sharing.timeSlicing.resources[0].devices: no nvidia.com/gpu device '5'",
        ),
        (
            "a100-40gb:1",
            "all-1g.5gb",
            "sharing: {mps: {resources: [{name: mig-1g.5gb, replicas: 2}]}}",
            "mixed",
            "sharing.mps.resources[0].name: MPS cannot share MIG devices",
        ),
    ],
)
def test_refusals_say_what_to_fix(
    simulate: Simulate,
    spec: str,
    mig_config: str | None,
    text: str,
    strategy: MigStrategy | None,
    message: str,
) -> None:
    inventory = inventory_with(simulate, spec, mig_config)
    with pytest.raises(ResourceError) as error:
        counts(inventory, text, strategy)
    assert message in str(error.value)


def test_single_strategy_refuses_mig_and_full_gpus_together(simulate: Simulate) -> None:
    inventory = _a100_pair_with_mig_on_gpu0(simulate)
    with pytest.raises(ResourceError, match="GPU 1 has MIG disabled"):
        counts(inventory, "", "single")
