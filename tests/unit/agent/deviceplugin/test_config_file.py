"""NVIDIA's device-plugin config file (version v1) as the device plugin reads it: the fields,
their defaults, NVIDIA's env/flag overrides, named-config selection, and errors that name the
field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.agent.deviceplugin.config_file import (
    DevicePluginConfigError,
    Replicated,
    Sharing,
    parse_device_plugin_config,
)
from gpu_operator.agent.deviceplugin.configs import (
    ConfigSelectionError,
    available_configs,
    parse_fallbacks,
    select_config,
)
from gpu_operator.agent.deviceplugin.settings import PluginSettings, plugin_settings

NVIDIA_TIME_SLICING = """
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def test_nvidia_time_slicing_example_reads_unchanged() -> None:
    config = parse_device_plugin_config(NVIDIA_TIME_SLICING)
    assert config.sharing == Sharing("time-slicing", (Replicated("nvidia.com/gpu", 10),))
    assert plugin_settings(config) == PluginSettings(
        mig_strategy="none",
        fail_on_init_error=True,
        pass_device_specs=False,
        device_list_strategies=("envvar",),
        device_id_strategy="uuid",
        driver_root="/run/nvidia/driver",
    )


@pytest.mark.parametrize(
    ("sharing", "expected"),
    [
        (
            "timeSlicing: {resources: [{name: gpu, replicas: 4}]}",
            Sharing("time-slicing", (Replicated("nvidia.com/gpu", 4),)),
        ),
        (
            "timeSlicing: {renameByDefault: true, resources: "
            "[{name: nvidia.com/gpu, replicas: 4}]}",
            Sharing("time-slicing", (Replicated("nvidia.com/gpu", 4, "nvidia.com/gpu.shared"),)),
        ),
        (
            "timeSlicing: {renameByDefault: true, resources: "
            "[{name: gpu, replicas: 2, rename: gpu.half}]}",
            Sharing("time-slicing", (Replicated("nvidia.com/gpu", 2, "nvidia.com/gpu.half"),)),
        ),
        (
            "timeSlicing: {failRequestsGreaterThanOne: true, resources: "
            "[{name: mig-1g.5gb, replicas: 2, devices: [0, '1:0']}]}",
            Sharing(
                "time-slicing",
                (Replicated("nvidia.com/mig-1g.5gb", 2, None, ("0", "1:0")),),
                fail_requests_greater_than_one=True,
            ),
        ),
        (
            "timeSlicing: {resources: [{name: gpu, replicas: 3, devices: 2}]}",
            Sharing("time-slicing", (Replicated("nvidia.com/gpu", 3, None, 2),)),
        ),
        (  # MPS keeps NVIDIA's historical one-replica-per-container rule unless relaxed
            "mps: {resources: [{name: gpu, replicas: 4}]}",
            Sharing("mps", (Replicated("nvidia.com/gpu", 4),), True),
        ),
        (
            "mps: {failRequestsGreaterThanOne: false, resources: [{name: gpu, replicas: 4}]}",
            Sharing("mps", (Replicated("nvidia.com/gpu", 4),), False),
        ),
        (
            "mps: {resources: [{name: gpu, replicas: 2, devices: "
            "[GPU-8fde612e-b5ea-51e9-8907-12492e511fbe]}]}",
            Sharing(
                "mps",
                (
                    Replicated(
                        "nvidia.com/gpu", 2, None, ("GPU-8fde612e-b5ea-51e9-8907-12492e511fbe",)
                    ),
                ),
                True,
            ),
        ),
        ("timeSlicing: {}", Sharing()),
    ],
)
def test_sharing_sections(sharing: str, expected: Sharing) -> None:
    assert parse_device_plugin_config(f"version: v1\nsharing:\n  {sharing}\n").sharing == expected


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("flags: {migStrategy: sometimes}", "flags.migStrategy"),
        ("flags: {plugin: {deviceListStrategy: nvml}}", "flags.plugin.deviceListStrategy"),
        ("flags: {plugin: {deviceListStrategy: [envvar, cdi]}}", "flags.plugin.deviceListStrategy"),
        ("flags: {plugin: {deviceIDStrategy: serial}}", "flags.plugin.deviceIDStrategy"),
        ("flags: {failOnInitError: maybe}", "flags.failOnInitError"),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 0}]}}",
            "sharing.timeSlicing.resources[0].replicas",
        ),
        (
            "sharing: {timeSlicing: {resources: [{replicas: 2}]}}",
            "sharing.timeSlicing.resources[0].name",
        ),
        (
            "sharing: {mps: {resources: [{name: Big_GPU, replicas: 2}]}}",
            "sharing.mps.resources[0].name",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, rename: '"
            + "x" * 60
            + "'}]}}",
            "sharing.timeSlicing.resources[0].rename",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: some}]}}",
            "sharing.timeSlicing.resources[0].devices",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 0}]}}",
            "sharing.timeSlicing.resources[0].devices",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [GPU-1]}]}}",
            "sharing.timeSlicing.resources[0].devices[0]",
        ),
        (
            "sharing: {timeSlicing: {resources: "
            "[{name: gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 3}]}}",
            "sharing.timeSlicing.resources",
        ),
        (
            "sharing: {timeSlicing: {failRequestsGreaterThanOne: 'yes', resources: []}}",
            "sharing.timeSlicing.failRequestsGreaterThanOne",
        ),
        ("version: v2", "version"),
    ],
)
def test_errors_name_the_field(text: str, field: str) -> None:
    with pytest.raises(DevicePluginConfigError) as error:
        parse_device_plugin_config(text)
    assert str(error.value).startswith(field), str(error.value)


def test_unused_fields_of_nvidias_file_are_accepted() -> None:
    config = parse_device_plugin_config(
        "version: v1\nflags: {gdsEnabled: false, mofedEnabled: false, plugin: "
        "{nvidiaCTKPath: /usr/bin/nvidia-ctk, containerDriverRoot: /driver-root}}\n"
        "resources: {gpus: [{pattern: '*', name: gpu}]}\nimex: {channelIDs: [0]}\n"
    )
    assert plugin_settings(config) == PluginSettings()


@pytest.mark.parametrize(
    ("file_flags", "overrides", "expected"),
    [
        ("", {}, PluginSettings()),
        (
            "flags: {migStrategy: mixed, plugin: {deviceListStrategy: [cdi-cri, envvar]}}",
            {},
            PluginSettings(mig_strategy="mixed", device_list_strategies=("cdi-cri", "envvar")),
        ),
        (  # NVIDIA's env vars win over the file (the operator's DaemonSet sets several)
            "flags: {migStrategy: mixed, plugin: {deviceListStrategy: cdi-cri}}",
            {"MIG_STRATEGY": "single", "DEVICE_LIST_STRATEGY": "envvar,volume-mounts"},
            PluginSettings(
                mig_strategy="single", device_list_strategies=("envvar", "volume-mounts")
            ),
        ),
        (
            "flags: {failOnInitError: false, plugin: {passDeviceSpecs: false}}",
            {"FAIL_ON_INIT_ERROR": "true", "PASS_DEVICE_SPECS": "true", "MIG_STRATEGY": None},
            PluginSettings(fail_on_init_error=True, pass_device_specs=True),
        ),
        (
            "flags: {mpsRoot: /var/mps, nvidiaDriverRoot: /run/nvidia/driver, nvidiaDevRoot: /}",
            {"DEVICE_ID_STRATEGY": "index", "CDI_ANNOTATION_PREFIX": "cdi.example/"},
            PluginSettings(
                device_id_strategy="index",
                cdi_annotation_prefix="cdi.example/",
                mps_root="/var/mps",
                driver_root="/run/nvidia/driver",
                dev_root="/",
            ),
        ),
    ],
)
def test_settings_precedence(
    file_flags: str, overrides: dict[str, str | None], expected: PluginSettings
) -> None:
    assert plugin_settings(parse_device_plugin_config(file_flags), overrides) == expected


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({"MIG_STRATEGY": "some"}, "MIG_STRATEGY"),
        ({"DEVICE_LIST_STRATEGY": "envvar,files"}, "DEVICE_LIST_STRATEGY"),
        ({"DEVICE_ID_STRATEGY": "serial"}, "DEVICE_ID_STRATEGY"),
        ({"PASS_DEVICE_SPECS": "sometimes"}, "PASS_DEVICE_SPECS"),
    ],
)
def test_bad_overrides_name_the_variable(overrides: dict[str, str | None], name: str) -> None:
    with pytest.raises(DevicePluginConfigError, match=f"^{name}"):
        plugin_settings(parse_device_plugin_config(""), overrides)


# -- which named config (NVIDIA's config-manager) ----------------------------------------------
@pytest.mark.parametrize(
    ("label", "available", "default", "fallbacks", "chosen"),
    [
        ("a100", ["a100", "t4"], "t4", ("named", "single"), "a100"),
        (None, ["a100", "t4"], "t4", ("named", "single"), "t4"),
        (None, ["default", "t4"], None, ("named", "single"), "default"),
        (None, ["t4"], None, ("named", "single"), "t4"),
        (None, ["a100", "t4"], None, ("named", "single", "empty"), None),
        (None, ["a100", "t4"], None, ("empty", "named"), None),
    ],
)
def test_select_config(
    label: str | None,
    available: list[str],
    default: str | None,
    fallbacks: tuple[str, ...],
    chosen: str | None,
) -> None:
    assert select_config(label, available, default, fallbacks) == chosen


@pytest.mark.parametrize(
    ("label", "available", "default", "fallbacks", "message"),
    [
        ("h100", ["a100", "t4"], None, (), "nvidia.com/device-plugin.config=h100 names no config"),
        (None, ["a100"], "t4", (), "default config 't4'"),
        (None, ["a100", "t4"], None, ("named", "single"), "no nvidia.com/device-plugin.config"),
    ],
)
def test_select_config_errors(
    label: str | None,
    available: list[str],
    default: str | None,
    fallbacks: tuple[str, ...],
    message: str,
) -> None:
    with pytest.raises(ConfigSelectionError, match=message):
        select_config(label, available, default, fallbacks)


def test_configmap_volume_entries_are_not_configs(tmp_path: Path) -> None:
    (tmp_path / "..2025_01_01").mkdir()
    (tmp_path / "..data").symlink_to(tmp_path / "..2025_01_01")
    (tmp_path / "a100").write_text("version: v1\n")
    (tmp_path / "t4").write_text("version: v1\n")
    assert available_configs(tmp_path) == ["a100", "t4"]


def test_fallback_strategies() -> None:
    assert parse_fallbacks("named, single") == ("named", "single")
    assert parse_fallbacks("") == ()
    with pytest.raises(ConfigSelectionError, match="FALLBACK_STRATEGIES"):
        parse_fallbacks("named,closest")
