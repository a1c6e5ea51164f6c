"""NVIDIA's DRA opaque configs: decoding, normalization, validation and precedence, as a table
of that driver's rules."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.draconfig import (
    GROUP_VERSION,
    ClaimConfig,
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    VfioDeviceConfig,
    claim_configs,
    config_for,
    decode,
    defaults,
    pinned_limits,
)
from gpu_operator.api.dragates import Gates, resolve
from tests.dra_configs import ALL, BAD, GOOD, NONE, gpu, mig


def test_time_slicing_without_its_section_means_interval_default() -> None:
    config = decode(gpu({"strategy": "TimeSlicing"}), ALL)
    assert isinstance(config, GpuConfig) and config.sharing is not None
    assert config.sharing.time_slicing_config is not None
    assert config.sharing.time_slicing_config.interval == "Default"


def test_no_sharing_is_time_slicing_default_where_its_gate_is_on() -> None:
    config = decode(gpu(), ALL)
    assert config.sharing is not None and config.sharing.strategy == "TimeSlicing"
    assert decode(gpu(), NONE).sharing is None  # the gate off: nothing to set


def test_mps_without_its_section_means_an_empty_one() -> None:
    config = decode(gpu({"strategy": "MPS"}), ALL)
    assert config.sharing is not None and config.sharing.mps_config is not None
    assert config.sharing.mps_config.default_active_thread_percentage is None
    config = decode(mig({"strategy": "MPS"}), ALL)
    assert isinstance(config, MigDeviceConfig) and config.sharing is not None
    assert config.sharing.mps_config is not None


def test_the_values_asked_for_are_kept() -> None:
    mps = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}
    config = decode(gpu({"strategy": "MPS", "mpsConfig": mps}), ALL)
    assert config.sharing is not None and config.sharing.mps_config is not None
    assert config.sharing.mps_config.default_active_thread_percentage == 50
    long = decode(gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}), ALL)
    assert long.sharing.time_slicing_config.interval == "Long"  # type: ignore[union-attr]


@pytest.mark.parametrize(("parameters", "gates", "says"), [(p, g, says) for p, g, says, _ in BAD])
def test_bad_configs_name_the_field(parameters: dict[str, Any], gates: Gates, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode(parameters, gates)
    assert says in str(err.value)


@pytest.mark.parametrize("parameters", GOOD)
def test_good_configs_decode(parameters: dict[str, Any]) -> None:
    assert decode(parameters, ALL).kind == parameters["kind"]


def _entry(parameters: dict[str, Any], *requests: str) -> dict[str, Any]:
    return {
        "requests": list(requests),
        "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters},
    }


def test_claim_configs_keep_this_drivers_entries_and_name_every_bad_one() -> None:
    entries = [
        _entry(gpu({"strategy": "MPS"}), "a"),
        {"opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}},
        _entry(gpu({"strategy": "TimeSlicing"})),
    ]
    found = claim_configs(entries, ALL, "spec.devices.config")
    assert [c.requests for c in found] == [("a",), ()]
    bad = [_entry(gpu(x=1)), _entry(gpu({"strategy": "MPS", "mpsConfig": {"y": 2}}))]
    with pytest.raises(ConfigError) as err:
        claim_configs(bad, ALL, "spec.devices.config")
    assert len(err.value.problems) == 2
    assert err.value.problems[0].startswith("spec.devices.config[0].opaque.parameters.x")
    assert err.value.problems[1].startswith("spec.devices.config[1].opaque.parameters.sharing")


def test_precedence_defaults_then_class_then_claim_later_wins() -> None:
    klass = claim_configs([_entry(gpu({"strategy": "TimeSlicing"}))], ALL, "class")
    claim = claim_configs([_entry(gpu({"strategy": "MPS"}), "shared")], ALL, "claim")
    configs = [*defaults(ALL), *klass, *claim]
    assert config_for(configs, "shared", "gpu").sharing.strategy == "MPS"  # type: ignore[union-attr]
    assert config_for(configs, "other", "gpu").sharing.strategy == "TimeSlicing"  # type: ignore[union-attr]
    # A MIG device of any request: the MIG default (the GpuConfigs name no MIG type).
    assert config_for(configs, "other", "mig").kind == "MigDeviceConfig"


def test_a_subrequest_is_named_by_itself_or_its_request() -> None:
    by_request = claim_configs([_entry(gpu({"strategy": "MPS"}), "gpu")], ALL, "claim")
    by_itself = claim_configs([_entry(gpu({"strategy": "MPS"}), "gpu/large")], ALL, "claim")
    for named in (by_request, by_itself):
        config = config_for([*defaults(ALL), *named], "gpu/large", "gpu")
        assert config.sharing is not None and config.sharing.strategy == "MPS"
    config = config_for([*defaults(ALL), *by_itself], "gpu/small", "gpu")
    assert config.sharing is not None and config.sharing.strategy == "TimeSlicing"


def test_a_config_naming_a_request_must_fit_its_device_type() -> None:
    configs: list[ClaimConfig] = [
        *defaults(ALL),
        *claim_configs([_entry(gpu({"strategy": "MPS"}), "small")], ALL, "claim"),
    ]
    with pytest.raises(ConfigError, match="a GpuConfig cannot configure request 'small'"):
        config_for(configs, "small", "mig")
    unnamed = [*defaults(ALL), *claim_configs([_entry(gpu({"strategy": "MPS"}))], ALL, "c")]
    assert config_for(unnamed, "small", "mig").kind == "MigDeviceConfig"  # skipped, not refused


def test_pinned_limits_per_device_by_uuid_or_index() -> None:
    mps = decode(
        gpu(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"1": "2Gi", "GPU-a": "1536Mi"},
                },
            }
        ),
        ALL,
    ).sharing.mps_config  # type: ignore[union-attr]
    assert mps is not None
    assert pinned_limits(mps, ["GPU-a", "GPU-b", "GPU-c"]) == {
        "GPU-a": "1536M",
        "GPU-b": "2048M",
        "GPU-c": "10240M",
    }
    with pytest.raises(ConfigError, match="not a GPU UUID of the claim nor an index below 1"):
        pinned_limits(mps, ["GPU-z"])


# -- VfioDeviceConfig (PassthroughSupport) --------------------------------------------------------
PASSTHROUGH = resolve({"PassthroughSupport": True})


def vfio(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": "VfioDeviceConfig", **fields}


@pytest.mark.parametrize(
    ("parameters", "policy", "api_device"),
    [
        (vfio(), "LegacyOnly", False),  # NVIDIA's defaults
        (vfio(iommu={"backendPolicy": "LegacyOnly"}), "LegacyOnly", False),
        (vfio(iommu={"backendPolicy": "PreferIommuFD"}), "PreferIommuFD", False),
        (
            vfio(iommu={"backendPolicy": "PreferIommuFD", "enableAPIDevice": True}),
            "PreferIommuFD",
            True,
        ),
        (
            vfio(iommu={"backendPolicy": "LegacyOnly", "enableAPIDevice": False}),
            "LegacyOnly",
            False,
        ),
    ],
)
def test_vfio_configs_decode_with_nvidias_defaults(
    parameters: dict[str, Any], policy: str, api_device: bool
) -> None:
    config = decode(parameters, PASSTHROUGH)
    assert isinstance(config, VfioDeviceConfig) and config.iommu is not None
    assert (config.iommu.backend_policy, config.iommu.enable_api_device) == (policy, api_device)


@pytest.mark.parametrize(
    ("parameters", "gates", "says"),
    [
        (vfio(), Gates.defaults(), "VfioDeviceConfig needs the DRA driver's feature gate"),
        (vfio(iommu={}), PASSTHROUGH, "parameters.iommu.backendPolicy"),
        (vfio(iommu={"backendPolicy": "IommuFDOnly"}), PASSTHROUGH, "iommu.backendPolicy"),
        (vfio(iommu={"backendPolicy": "legacyonly"}), PASSTHROUGH, "iommu.backendPolicy"),
        (
            vfio(iommu={"backendPolicy": "LegacyOnly", "enableAPIDevice": "yes"}),
            PASSTHROUGH,
            "iommu.enableAPIDevice",
        ),
        (
            vfio(iommu={"backendPolicy": "LegacyOnly", "enableApiDevice": True}),
            PASSTHROUGH,
            "iommu.enableApiDevice: unknown field",
        ),
        (vfio(sharing={"strategy": "MPS"}), PASSTHROUGH, "parameters.sharing: unknown field"),
        (vfio(iommus={}), PASSTHROUGH, "parameters.iommus: unknown field"),
        (
            {"apiVersion": GROUP_VERSION, "kind": "VFIODeviceConfig"},
            PASSTHROUGH,
            "VfioDeviceConfig expected",
        ),
    ],
)
def test_bad_vfio_configs_name_the_field(
    parameters: dict[str, Any], gates: Gates, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        decode(parameters, gates)
    assert says in str(err.value)


def test_vfio_defaults_only_with_the_gate_and_only_for_vfio_devices() -> None:
    assert [c.config.kind for c in defaults(Gates.defaults())] == ["GpuConfig", "MigDeviceConfig"]
    configs = defaults(PASSTHROUGH)
    assert [c.config.kind for c in configs] == ["GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"]
    assert config_for(configs, "vm", "vfio").kind == "VfioDeviceConfig"
    assert config_for(configs, "vm", "gpu").kind == "GpuConfig"
    claim = claim_configs([_entry(vfio(), "vm")], PASSTHROUGH, "spec.devices.config")
    with pytest.raises(ConfigError, match="a VfioDeviceConfig cannot configure request 'vm'"):
        config_for([*configs, *claim], "vm", "gpu")
