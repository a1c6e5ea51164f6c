"""The k8s-device-plugin ``version: v1`` config file, as far as the agents need it.

Feature discovery reads it for the MIG strategy and for GPU sharing (time-slicing or MPS
replicas, renames), which change the labels. Unknown keys are ignored rather than rejected: the
file is shared with the device plugin, which understands more of it. Parsed by hand (no
pydantic) because feature discovery runs on every GPU node and pydantic costs it ~15 MiB RSS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["none", "time-slicing", "mps"]
MIG_STRATEGIES: tuple[MigStrategy, ...] = ("none", "single", "mixed")


class DevicePluginConfigError(ValueError):
    """The device-plugin config file is malformed (the message names the field)."""


@dataclass(frozen=True)
class Replicated:
    name: str  # the resource shared, e.g. "nvidia.com/gpu" or "nvidia.com/mig-1g.5gb"
    replicas: int
    rename: str | None = None  # advertised under another name: no "-SHARED" product suffix


@dataclass(frozen=True)
class Sharing:
    strategy: SharingStrategy = "none"
    resources: tuple[Replicated, ...] = ()

    def lookup(self, resource: str) -> Replicated | None:
        return next((r for r in self.resources if r.name == resource), None)


@dataclass(frozen=True)
class PluginFlags:
    pass_device_specs: bool | None = None
    device_list_strategy: str | list[str] | None = None
    device_id_strategy: str | None = None


@dataclass(frozen=True)
class GfdFlags:
    oneshot: bool | None = None
    no_timestamp: bool | None = None
    sleep_interval: str | None = None
    output_file: str | None = None
    machine_type_file: str | None = None


@dataclass(frozen=True)
class Flags:
    mig_strategy: MigStrategy | None = None
    fail_on_init_error: bool | None = None
    plugin: PluginFlags | None = None
    gfd: GfdFlags | None = None


@dataclass(frozen=True)
class DevicePluginConfig:
    version: str = "v1"
    flags: Flags = field(default_factory=Flags)
    sharing: Sharing = field(default_factory=Sharing)

    def sharing_settings(self) -> Sharing:
        """The sharing view the label code uses (renames resolved)."""
        return self.sharing


def _section(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DevicePluginConfigError(f"{where}{key}: expected a mapping, got {value!r}")
    return value


def _typed(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key)
    if value is not None and not isinstance(value, kind):
        raise DevicePluginConfigError(f"{where}{key}: unexpected value {value!r}")
    return value


def _replication(doc: Mapping[str, Any], where: str) -> tuple[Replicated, ...]:
    rename_by_default = bool(_typed(doc, "renameByDefault", bool, where))
    resources = doc.get("resources") or []
    if not isinstance(resources, list):
        raise DevicePluginConfigError(f"{where}resources: expected a list")
    found = []
    for i, item in enumerate(resources):
        at = f"{where}resources[{i}]."
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise DevicePluginConfigError(f"{at}name: required")
        replicas = item.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise DevicePluginConfigError(
                f"{at}replicas: must be an integer >= 1, got {replicas!r}"
            )
        rename = _typed(item, "rename", str, at) or None
        if rename is None and rename_by_default:
            rename = f"{item['name']}.shared"
        found.append(Replicated(item["name"], replicas, rename))
    return tuple(found)


def parse_device_plugin_config(text: str) -> DevicePluginConfig:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise DevicePluginConfigError(f"device-plugin config is not valid YAML: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise DevicePluginConfigError("device-plugin config: expected a mapping")
    version = doc.get("version", "v1")
    if version != "v1":
        raise DevicePluginConfigError(f"version: unsupported {version!r} (expected v1)")
    flags_doc = _section(doc, "flags", "")
    strategy = flags_doc.get("migStrategy")
    if strategy is not None and strategy not in MIG_STRATEGIES:
        raise DevicePluginConfigError(
            f"flags.migStrategy: {strategy!r} is not one of {', '.join(MIG_STRATEGIES)}"
        )
    plugin_doc = _section(flags_doc, "plugin", "flags.")
    gfd_doc = _section(flags_doc, "gfd", "flags.")
    interval = gfd_doc.get("sleepInterval")
    flags = Flags(
        mig_strategy=cast(MigStrategy | None, strategy),
        fail_on_init_error=_typed(flags_doc, "failOnInitError", bool, "flags."),
        plugin=PluginFlags(
            pass_device_specs=_typed(plugin_doc, "passDeviceSpecs", bool, "flags.plugin."),
            device_list_strategy=_typed(
                plugin_doc, "deviceListStrategy", (str, list), "flags.plugin."
            ),
            device_id_strategy=_typed(plugin_doc, "deviceIDStrategy", str, "flags.plugin."),
        )
        if plugin_doc
        else None,
        gfd=GfdFlags(
            oneshot=_typed(gfd_doc, "oneshot", bool, "flags.gfd."),
            no_timestamp=_typed(gfd_doc, "noTimestamp", bool, "flags.gfd."),
            sleep_interval=None if interval is None else str(interval),
            output_file=_typed(gfd_doc, "outputFile", str, "flags.gfd."),
            machine_type_file=_typed(gfd_doc, "machineTypeFile", str, "flags.gfd."),
        )
        if gfd_doc
        else None,
    )
    sharing_doc = _section(doc, "sharing", "")
    time_slicing = _replication(
        _section(sharing_doc, "timeSlicing", "sharing."), "sharing.timeSlicing."
    )
    mps = _replication(_section(sharing_doc, "mps", "sharing."), "sharing.mps.")
    if time_slicing and mps:
        raise DevicePluginConfigError("sharing: timeSlicing and mps cannot both list resources")
    sharing = Sharing()
    if time_slicing:
        sharing = Sharing("time-slicing", time_slicing)
    elif mps:
        sharing = Sharing("mps", mps)
    return DevicePluginConfig(version="v1", flags=flags, sharing=sharing)


def load_device_plugin_config(path: str | Path | None) -> DevicePluginConfig:
    """Read CONFIG_FILE; no path means the defaults (no sharing)."""
    if not path:
        return DevicePluginConfig()
    return parse_device_plugin_config(Path(path).read_text())
