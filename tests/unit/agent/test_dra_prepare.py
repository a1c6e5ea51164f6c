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
REFS = {"gpu-0": DeviceRef("GPU-0", 0), "gpu-1-mig-1g10gb-0": DeviceRef("MIG-1", 1, (1, 0))}
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
        (
            [opaque("GpuConfig", {"strategy": "MPS"})],
            MPS,
            "request 'gpu': MPS sharing is not built in this DRA plugin yet",
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
    assert prepare_claim(claim(configs, ("gpu/large", "gpu-0")), "u1", NODE, REFS, both)
    with pytest.raises(PrepareError, match="MPS sharing is not built"):
        prepare_claim(claim(configs, ("other", "gpu-0")), "u1", NODE, REFS, both)
