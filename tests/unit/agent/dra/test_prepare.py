"""Prepare checks a claim's configs before anything is written: NVIDIA's precedence over the
allocation's configs, and a sharing setting this plugin would ignore is refused, not ignored."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.agent.dra.devices import DRIVER, DeviceRef
from gpu_operator.agent.dra.prepare import (
    PreparedDevice,
    PrepareError,
    TimeSlice,
    prepare_claim,
)
from gpu_operator.api.draconfig import GROUP_VERSION
from gpu_operator.api.dragates import Gates, resolve

NODE = "node-a"
REFS = {
    "gpu-0": DeviceRef("GPU-0", 0),
    "gpu-1-mig-1g10gb-0": DeviceRef("MIG-1", 1, (1, 0), "GPU-1"),
}
SLICING = resolve({"TimeSlicingSettings": True})
MPS = resolve({"MPSSupport": True})


def claim(configs: list[dict[str, Any]], *results: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": NODE, "device": d}
                        for r, d in results
                    ],
                    "config": configs,
                }
            }
        },
    }


def opaque(
    kind: str, sharing: dict[str, Any], *requests: str, source: str = "FromClaim"
) -> dict[str, Any]:
    parameters = {"apiVersion": GROUP_VERSION, "kind": kind, "sharing": sharing}
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }
    if requests:
        entry["requests"] = list(requests)
    return entry


def test_no_config_prepares_as_before() -> None:
    (prepared,) = prepare_claim(claim([], ("gpu", "gpu-0")), "u1", NODE, REFS, Gates.defaults())
    assert prepared.device == "gpu-0"


def test_time_slicing_default_is_prepared() -> None:
    configs = [opaque("GpuConfig", {"strategy": "TimeSlicing"})]
    (prepared,) = prepare_claim(claim(configs, ("gpu", "gpu-0")), "u1", NODE, REFS, SLICING)
    assert prepared.time_slice == TimeSlice("GPU-0", "Default")


@pytest.mark.parametrize(
    ("configs", "gates", "full"),
    [
        ([], Gates.defaults(), None),  # the gate off: the driver sets nothing
        ([], SLICING, "Default"),  # on: NVIDIA's default config, interval Default
        (
            [
                opaque(
                    "GpuConfig",
                    {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
                )
            ],
            SLICING,
            "Long",
        ),
        (
            [
                opaque(
                    "GpuConfig",
                    {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
                    "gpu",
                ),
                opaque("MigDeviceConfig", {"strategy": "TimeSlicing"}, "small"),
            ],
            SLICING,
            "Short",
        ),
    ],
)
def test_each_full_gpu_gets_the_time_slice_its_config_asks_for(
    configs: list[dict[str, Any]], gates: Gates, full: str | None
) -> None:
    doc = claim(configs, ("gpu", "gpu-0"), ("small", "gpu-1-mig-1g10gb-0"))
    got = {p.device: p.time_slice for p in prepare_claim(doc, "u1", NODE, REFS, gates)}
    assert got == {
        "gpu-0": TimeSlice("GPU-0", full) if full else None,
        "gpu-1-mig-1g10gb-0": None,  # scheduled as its GPU is: no time-slice of its own
    }
    for p in prepare_claim(doc, "u1", NODE, REFS, gates):  # the checkpoint keeps it
        assert PreparedDevice.from_json(p.to_json()) == p


@pytest.mark.parametrize(
    ("configs", "gates", "says"),
    [
        (
            [opaque("GpuConfig", {"strategy": "MPS"})],
            Gates.defaults(),
            "status.allocation.devices.config[0].opaque.parameters.sharing.strategy: MPS needs "
            "the DRA driver's feature gate MPSSupport",
        ),
        (  # what admission cannot judge: the devices the claim was given
            [
                opaque(
                    "GpuConfig",
                    {
                        "strategy": "MPS",
                        "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}},
                    },
                    "gpu",
                )
            ],
            MPS,
            "mpsConfig.defaultPerDevicePinnedMemoryLimit.1: not a GPU UUID of the claim nor an "
            "index below 1",
        ),
        (
            [opaque("GpuConfig", {"strategy": "TimeSlicing", "oops": 1})],
            SLICING,
            "sharing.oops: unknown field",
        ),
        (
            [opaque("GpuConfig", {"strategy": "TimeSlicing"}, "small")],
            SLICING,
            "a GpuConfig cannot configure request 'small', which was given a MIG device",
        ),
    ],
)
def test_a_config_it_cannot_apply_fails_prepare_naming_it(
    configs: list[dict[str, Any]], gates: Gates, says: str
) -> None:
    doc = claim(configs, ("gpu", "gpu-0"), ("small", "gpu-1-mig-1g10gb-0"))
    with pytest.raises(PrepareError) as err:
        prepare_claim(doc, "u1", NODE, REFS, gates)
    assert says in str(err.value)


def test_the_claims_config_wins_over_the_class_and_subrequests_follow_their_request() -> None:
    configs = [
        opaque("GpuConfig", {"strategy": "MPS"}, source="FromClass"),  # refused if it won
        opaque("GpuConfig", {"strategy": "TimeSlicing"}, "gpu"),
    ]
    both = resolve({"TimeSlicingSettings": True, "MPSSupport": True})
    (sliced,) = prepare_claim(claim(configs, ("gpu/large", "gpu-0")), "u1", NODE, REFS, both)
    assert sliced.time_slice == TimeSlice("GPU-0", "Default") and sliced.mps is None
    (shared,) = prepare_claim(claim(configs, ("other", "gpu-0")), "u1", NODE, REFS, both)
    assert shared.mps is not None and shared.time_slice is None


def test_devices_sharing_one_mps_config_share_one_daemon_with_its_limits() -> None:
    """One daemon per distinct MPS config of a claim, over the devices it applies to (a MIG
    device's GPU goes exclusive), its name NVIDIA's; the checkpoint keeps it."""
    refs = {**REFS, "gpu-2": DeviceRef("GPU-2", 2)}
    mps = {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
            "defaultPerDevicePinnedMemoryLimit": {"GPU-2": "2Gi"},
        },
    }
    doc = claim(
        [opaque("GpuConfig", mps, "a", "b"), opaque("MigDeviceConfig", {"strategy": "MPS"}, "m")],
        ("a", "gpu-0"), ("b", "gpu-2"), ("m", "gpu-1-mig-1g10gb-0"),
    )  # fmt: skip
    prepared = {p.device: p for p in prepare_claim(doc, "u1", NODE, refs, MPS)}
    gpus, mig = prepared["gpu-0"].mps, prepared["gpu-1-mig-1g10gb-0"].mps
    assert gpus is not None and mig is not None
    assert prepared["gpu-2"].mps == gpus != mig
    assert gpus.name == f"mps-control-daemon-{gpus.id}" and gpus.id.startswith("u1-")
    assert gpus.devices == ("GPU-0", "GPU-2") and gpus.gpus == ("GPU-0", "GPU-2")
    assert gpus.thread_percentage == 50
    assert gpus.pinned_limits == {"GPU-0": "10240M", "GPU-2": "2048M"}
    assert mig.devices == ("MIG-1",) and mig.gpus == ("GPU-1",)
    assert mig.thread_percentage is None and mig.pinned_limits == {}
    for p in prepared.values():
        assert PreparedDevice.from_json(p.to_json()) == p
