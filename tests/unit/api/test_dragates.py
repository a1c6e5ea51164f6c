"""NVIDIA's DRA driver's feature gates: its names, defaults, syntax and refused combinations."""

from __future__ import annotations

import pytest

from gpu_operator.api import dragates
from gpu_operator.api.dragates import GateError, from_env, parse, resolve


def test_unset_means_nvidias_defaults() -> None:
    gates = from_env(None)
    assert gates == from_env("") == dragates.Gates.defaults()
    on = {name for name, value in gates.values.items() if value}
    assert on == {"IMEXDaemonsWithDNSNames", "ComputeDomainCliques", "CrashOnNVLinkFabricErrors"}


def test_the_format_nvidias_driver_reads() -> None:
    assert parse("MPSSupport=true, TimeSlicingSettings=FALSE,") == {
        "MPSSupport": True,
        "TimeSlicingSettings": False,
    }
    gates = from_env("DynamicMIG=true,NVMLDeviceHealthCheck=true")
    assert gates.on("DynamicMIG") and gates.on("NVMLDeviceHealthCheck")
    assert not gates.on("MPSSupport")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("MPSSupport", "write it as Name=true or Name=false"),
        ("=true", "write it as Name=true or Name=false"),
        ("MPSSupport=yes", "MPSSupport=yes: the value must be true or false"),
        ("MpsSupport=true", "unknown feature gate(s) MpsSupport"),
        ("DynamicMIG=true,MPSSupport=true", "DynamicMIG and MPSSupport cannot both be on"),
        ("DynamicMIG=true,PassthroughSupport=true", "DynamicMIG and PassthroughSupport"),
        (
            "PassthroughSupport=true,NVMLDeviceHealthCheck=true",
            "PassthroughSupport and NVMLDeviceHealthCheck cannot both be on",
        ),
        (
            "ComputeDomainCliques=true,IMEXDaemonsWithDNSNames=false",
            "needs IMEXDaemonsWithDNSNames",
        ),
        ("DeviceMetadata=true", "DeviceMetadata needs PassthroughSupport on"),
    ],
)
def test_refused_gates_name_what_to_change(text: str, says: str) -> None:
    with pytest.raises(GateError) as err:
        from_env(text)
    assert says in str(err.value)


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(GateError) as err:
        resolve({"DynamicMIG": True, "MPSSupport": True, "PassthroughSupport": True})
    assert "DynamicMIG and PassthroughSupport" in str(err.value)
    assert "DynamicMIG and MPSSupport" in str(err.value)


def test_an_unknown_name_is_not_a_gate() -> None:
    with pytest.raises(KeyError):
        dragates.Gates.defaults().on("AdminAccess")
