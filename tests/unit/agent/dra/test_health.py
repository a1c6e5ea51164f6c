"""Device taints from GPU health: NVIDIA's keys on an unhealthy GPU and the MIG devices cut
from it, published once (the server's ``timeAdded`` is no change), gone when the GPU is
healthy again."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_operator.agent.dra import slices
from gpu_operator.agent.dra.health import (
    LOST_TAINT,
    UNHEALTHY_TAINT,
    XID_TAINT,
    gpu_taints,
    taint_devices,
)
from gpu_operator.agent.gpuhealth.state import FaultKind, GpuHealth, Seen

OWNER = {"name": "node-a", "uid": "1234"}


def sick(uuid: str, *seen: tuple[FaultKind, str]) -> GpuHealth:
    return GpuHealth(uuid, 0, healthy=False, last_fault_s=1.0,
                     seen=tuple(Seen(k, w, 1.0) for k, w in seen))  # fmt: skip


def device(name: str, uuid: str, parent: str | None = None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"uuid": {"string": uuid}}
    if parent:
        attributes["parentUUID"] = {"string": parent}
    return {"name": name, "attributes": attributes, "capacity": {}}


@pytest.mark.parametrize(
    ("seen", "taints"),
    [
        ([(FaultKind.XID, "XID 79")], [(XID_TAINT, "79")]),
        ([(FaultKind.XID, "XID 48"), (FaultKind.XID, "XID 79")], [(XID_TAINT, "79")]),
        ([(FaultKind.LOST, "gone from NVML's GPUs"), (FaultKind.XID, "XID 79")],
         [(LOST_TAINT, None), (XID_TAINT, "79")]),
        ([(FaultKind.ECC, "uncorrected ECC errors: 3"), (FaultKind.THERMAL, "thermal slowdown")],
         [(UNHEALTHY_TAINT, "ecc")]),
        ([], [(UNHEALTHY_TAINT, "unknown")]),  # carried over a restart: still tainted
    ],
)  # fmt: skip
def test_each_fault_gets_its_key(
    seen: list[tuple[FaultKind, str]], taints: list[tuple[str, str | None]]
) -> None:
    got = gpu_taints(sick("GPU-a", *seen))
    assert [(t["key"], t.get("value")) for t in got] == taints
    assert {t["effect"] for t in got} == {"NoSchedule"}  # never NoExecute: claims there stay
    assert gpu_taints(GpuHealth("GPU-a", 0)) == []


def test_a_gpus_taints_go_on_it_and_its_mig_devices_only() -> None:
    devices = [
        device("gpu-0", "GPU-a"),
        device("gpu-1-mig-1g10gb-19-0", "MIG-1", parent="GPU-b"),
        device("gpu-2", "GPU-c"),
    ]
    health = {"GPU-a": GpuHealth("GPU-a", 0), "GPU-b": sick("GPU-b", (FaultKind.XID, "XID 79"))}
    got = {d["name"]: d.get("taints") for d in taint_devices(devices, health)}
    assert got == {
        "gpu-0": None,
        "gpu-1-mig-1g10gb-19-0": [{"key": XID_TAINT, "value": "79", "effect": "NoSchedule"}],
        "gpu-2": None,
    }
    assert "taints" not in devices[1]  # the inventory's devices are not changed


def test_a_taint_is_published_once_and_goes_when_healthy() -> None:
    clean = [device("gpu-0", "GPU-a")]
    tainted = taint_devices(clean, {"GPU-a": sick("GPU-a", (FaultKind.XID, "XID 79"))})
    first = slices.plan("node-a", slices.desired_slices("node-a", clean, 1, OWNER), tainted, OWNER)
    assert first.writes == 1 and first.generation == 2
    # As the API server returns it: timeAdded filled in. Nothing to write again.
    stored = copy.deepcopy(list(first.apply))
    stored[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-12-02T05:00:00Z"
    assert slices.plan("node-a", stored, copy.deepcopy(tainted), OWNER).writes == 0
    healed = slices.plan("node-a", stored, clean, OWNER)
    assert healed.writes == 1 and "taints" not in healed.apply[0]["spec"]["devices"][0]
