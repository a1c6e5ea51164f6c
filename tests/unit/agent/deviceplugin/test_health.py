"""Which XIDs make a device unhealthy (NVIDIA's rule and its env vars), which devices a fault
covers, when a fault may clear, and XID events read through the real pynvml wrappers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpu_operator.agent.deviceplugin.health import (
    APPLICATION_XIDS,
    Fault,
    due_for_probe,
    fault_key,
    record,
    unhealthy_ids,
    xid_policy,
)
from gpu_operator.agent.deviceplugin.resources import Device, MigPart
from gpu_operator.agent.inventory import XidEvent
from gpu_operator.agent.nvml import Nvml
from tests.unit.agent.conftest import Simulate


@pytest.mark.parametrize(
    ("disable", "enable", "counted", "ignored"),
    [
        (None, None, {48, 79, 94, 95, 119}, set(APPLICATION_XIDS)),
        ("74, 79", None, {48}, {13, 74, 79}),
        ("all", None, set(), {13, 48, 79}),
        ("xids", "79", {79}, {13, 48}),
        (None, "13", {13, 79}, {31, 43}),
        ("48", "all", {13, 48, 79}, set()),
        ("not-a-number,79", None, {48}, {79}),
    ],
)
def test_xid_policy_follows_nvidias_env_vars(
    disable: str | None, enable: str | None, counted: set[int], ignored: set[int]
) -> None:
    policy = xid_policy(disable, enable)
    assert {x for x in counted if policy.counts(x)} == counted
    assert {x for x in ignored if not policy.counts(x)} == ignored


def test_all_disabled_means_no_watching() -> None:
    assert not xid_policy("all").watches
    assert xid_policy("all", "79").watches
    assert xid_policy().watches


def device(gpu: int, position: int | None = None, replica: int | None = None) -> Device:
    uuid = f"GPU-{gpu}" if position is None else f"MIG-{gpu}-{position}"
    return Device(
        id=uuid if replica is None else f"{uuid}::{replica}",
        uuid=uuid,
        index=str(gpu) if position is None else f"{gpu}:{position}",
        gpu_uuid=f"GPU-{gpu}",
        gpu_index=gpu,
        minor=gpu,
        pci_bus_id="",
        memory_mib=0,
        mig=None if position is None else MigPart(position + 5, 0, "1g.5gb"),
        replica=replica,
    )


DEVICES = [
    device(0, replica=0),
    device(0, replica=1),
    device(1),
    device(2, 0),
    replace(device(2, 0), id="MIG-2-0::1", replica=1),
    device(2, 1),
]


@pytest.mark.parametrize(
    ("keys", "unhealthy"),
    [
        ([("GPU-0", None, None)], {"GPU-0::0", "GPU-0::1"}),  # every replica of the GPU
        ([("GPU-2", None, None)], {"MIG-2-0", "MIG-2-0::1", "MIG-2-1"}),  # its MIG devices
        ([("GPU-2", 6, 0)], {"MIG-2-1"}),  # only the MIG device NVML named
        ([("GPU-2", 9, 0)], set()),
        ([("GPU-1", None, None), ("GPU-2", 5, 0)], {"GPU-1", "MIG-2-0", "MIG-2-0::1"}),
        ([], set()),
    ],
)
def test_which_devices_a_fault_covers(
    keys: list[tuple[str, int | None, int | None]], unhealthy: set[str]
) -> None:
    faults = {key: Fault(79, 0.0) for key in keys}
    assert unhealthy_ids(DEVICES, faults) == unhealthy


def test_fault_keys() -> None:
    assert fault_key("GPU-1", None, None) == ("GPU-1", None, None)
    assert fault_key("GPU-1", 3, None) == ("GPU-1", None, None)
    assert fault_key("GPU-1", 3, 0) == ("GPU-1", 3, 0)


def test_a_fault_is_probed_after_a_quiet_window() -> None:
    faults = record({}, ("GPU-0", None, None), 48, now_s=100.0)
    faults = record(faults, ("GPU-1", None, None), 79, now_s=150.0)
    assert due_for_probe(faults, 155.0, 60.0) == []
    assert due_for_probe(faults, 165.0, 60.0) == [("GPU-0", None, None)]
    faults = record(faults, ("GPU-0", None, None), 48, now_s=165.0)  # it came again
    assert due_for_probe(faults, 215.0, 60.0) == [("GPU-1", None, None)]
    assert due_for_probe(faults, 10_000.0, 0.0) == []  # 0: never clears (NVIDIA's behaviour)


def test_nvml_reports_injected_xids_once(simulate: Simulate) -> None:
    sim = simulate("a100-40gb:4")
    with Nvml() as nvml:
        assert nvml.xid_events([0, 1, 2, 3]) == []
        sim.inject_xid(2, 79)
        sim.inject_xid(0, 13)
        assert sorted(nvml.xid_events([0, 1, 2, 3], timeout_ms=10), key=lambda e: e.gpu_index) == [
            XidEvent(gpu_index=0, xid=13),
            XidEvent(gpu_index=2, xid=79),
        ]
        assert nvml.xid_events([0, 1, 2, 3]) == []
