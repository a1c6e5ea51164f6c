"""The k8s-device-plugin ``version: v1`` config file, read unchanged.

Feature discovery reads it for the MIG strategy and for GPU sharing (time-slicing or MPS
replicas, renames), which change the labels; the device plugin for everything else (device list
and id strategies, which devices are replicated, failRequestsGreaterThanOne). Keys neither
agent uses (``resources``, ``imex``, ``flags.gdsEnabled``...) are ignored rather than rejected,
as NVIDIA's own plugin reads more of the file than it acts on. Resource names are completed with
``nvidia.com/`` as NVIDIA does (``name: gpu`` is ``nvidia.com/gpu``). Parsed by hand (no
pydantic) because feature discovery runs on every GPU node and pydantic costs it ~15 MiB RSS.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from gpu_operator.textfiles import parse_file, yaml_problem

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["none", "time-slicing", "mps"]
MIG_STRATEGIES: tuple[MigStrategy, ...] = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
RESOURCE_PREFIX = "nvidia.com"
MAX_RESOURCE_NAME = 63  # NVIDIA's limit on a fully qualified resource name

# ``devices`` of a replicated resource: "all", the first N devices, or a list of references
# (a GPU index "0", a MIG index "0:1", or a GPU-/MIG- UUID).
ReplicaDevices = str | int | tuple[str, ...]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class DevicePluginConfigError(ValueError):
    """The device-plugin config file is malformed (the message names the field)."""


@dataclass(frozen=True)
class Replicated:
    name: str  # the resource shared, e.g. "nvidia.com/gpu" or "nvidia.com/mig-1g.5gb"
    replicas: int
    rename: str | None = None  # advertised under another name: no "-SHARED" product suffix
    devices: ReplicaDevices = "all"


@dataclass(frozen=True)
class Sharing:
    strategy: SharingStrategy = "none"
    resources: tuple[Replicated, ...] = ()
    # A container may ask for one replica at most (NVIDIA's default: true for MPS only).
    fail_requests_greater_than_one: bool = False

    def lookup(self, resource: str) -> Replicated | None:
        return next((r for r in self.resources if r.name == resource), None)


@dataclass(frozen=True)
class PluginFlags:
    pass_device_specs: bool | None = None
    device_list_strategy: str | list[str] | None = None
    device_id_strategy: str | None = None
    cdi_annotation_prefix: str | None = None


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
    mps_root: str | None = None
    nvidia_driver_root: str | None = None
    nvidia_dev_root: str | None = None


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


def resource_name(name: str, where: str) -> str:
    """``gpu`` -> ``nvidia.com/gpu``; a name Kubernetes would refuse is an error here."""
    full = name if name.startswith(RESOURCE_PREFIX + "/") else f"{RESOURCE_PREFIX}/{name}"
    if len(full) > MAX_RESOURCE_NAME:
        raise DevicePluginConfigError(
            f"{where}: {full!r} is longer than {MAX_RESOURCE_NAME} characters"
        )
    short = full.split("/", 1)[1]
    if not short or len(short) > 253 or not all(_DNS_LABEL.fullmatch(p) for p in short.split(".")):
        raise DevicePluginConfigError(
            f"{where}: {full!r} is not a valid resource name (lower-case letters, digits, "
            "'-' and '.', e.g. nvidia.com/gpu.shared)"
        )
    return full


def is_device_reference(ref: str) -> bool:
    """A GPU index ``0``, a MIG index ``0:1``, or a GPU/MIG UUID (NVIDIA's accepted forms)."""
    if ref.isdigit() or re.fullmatch(r"\d+:\d+", ref):
        return True
    if ref.startswith("GPU-"):
        return bool(_UUID.fullmatch(ref[4:]))
    if ref.startswith("MIG-"):
        rest = ref[4:]
        if _UUID.fullmatch(rest):
            return True
        parts = rest.split("/")
        return (
            len(parts) == 3
            and parts[0].startswith("GPU-")
            and bool(_UUID.fullmatch(parts[0][4:]))
            and parts[1].isdigit()
            and parts[2].isdigit()
        )
    return False


def _replica_devices(value: Any, where: str) -> ReplicaDevices:
    if value is None or value == "all":
        return "all"
    if isinstance(value, bool):
        raise DevicePluginConfigError(f"{where}: expected 'all', a count or a list, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise DevicePluginConfigError(f"{where}: a count of devices must be > 0, got {value}")
        return value
    if isinstance(value, list):
        refs: list[str] = []
        for i, item in enumerate(value):
            ref = str(item) if isinstance(item, int) and not isinstance(item, bool) else item
            if not isinstance(ref, str) or not is_device_reference(ref):
                raise DevicePluginConfigError(
                    f"{where}[{i}]: {item!r} is not a GPU index (0), a MIG index (0:1) or a "
                    "GPU-/MIG- UUID"
                )
            refs.append(ref)
        return tuple(refs)
    raise DevicePluginConfigError(
        f"{where}: expected 'all', a count or a list of devices, got {value!r}"
    )


def _replication(
    doc: Mapping[str, Any], where: str, *, fail_default: bool
) -> tuple[tuple[Replicated, ...], bool]:
    rename_by_default = bool(_typed(doc, "renameByDefault", bool, where))
    fail = _typed(doc, "failRequestsGreaterThanOne", bool, where)
    resources = doc.get("resources") or []
    if not isinstance(resources, list):
        raise DevicePluginConfigError(f"{where}resources: expected a list")
    found = []
    for i, item in enumerate(resources):
        at = f"{where}resources[{i}]."
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise DevicePluginConfigError(f"{at}name: required")
        name = resource_name(item["name"], f"{at}name")
        replicas = item.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise DevicePluginConfigError(
                f"{at}replicas: must be an integer >= 1, got {replicas!r}"
            )
        rename = _typed(item, "rename", str, at) or None
        if rename is not None:
            rename = resource_name(rename, f"{at}rename")
        elif rename_by_default:
            rename = f"{name}.shared"
        devices = _replica_devices(item.get("devices"), f"{at}devices")
        found.append(Replicated(name, replicas, rename, devices))
    names = [r.name for r in found]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise DevicePluginConfigError(f"{where}resources: {duplicate} is listed more than once")
    return tuple(found), fail_default if fail is None else fail


def _device_list_strategy(value: Any, where: str) -> str | list[str] | None:
    if value is None:
        return None
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not listed:
        raise DevicePluginConfigError(f"{where}: expected a strategy or a list, got {value!r}")
    for item in listed:
        if item not in DEVICE_LIST_STRATEGIES:
            raise DevicePluginConfigError(
                f"{where}: {item!r} is not one of {', '.join(DEVICE_LIST_STRATEGIES)}"
            )
    return cast(str | list[str], value)


def _choice(doc: Mapping[str, Any], key: str, choices: tuple[str, ...], where: str) -> Any:
    value = doc.get(key)
    if value is not None and value not in choices:
        raise DevicePluginConfigError(f"{where}{key}: {value!r} is not one of {', '.join(choices)}")
    return value


def parse_device_plugin_config(text: str) -> DevicePluginConfig:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise DevicePluginConfigError(f"device-plugin config {yaml_problem(exc)}") from exc
    if not isinstance(doc, Mapping):
        raise DevicePluginConfigError("device-plugin config: expected a mapping")
    version = doc.get("version") or "v1"
    if version != "v1":
        raise DevicePluginConfigError(f"version: unsupported {version!r} (expected v1)")
    flags_doc = _section(doc, "flags", "")
    strategy = _choice(flags_doc, "migStrategy", MIG_STRATEGIES, "flags.")
    plugin_doc = _section(flags_doc, "plugin", "flags.")
    gfd_doc = _section(flags_doc, "gfd", "flags.")
    interval = gfd_doc.get("sleepInterval")
    at = "flags.plugin."
    flags = Flags(
        mig_strategy=cast(MigStrategy | None, strategy),
        fail_on_init_error=_typed(flags_doc, "failOnInitError", bool, "flags."),
        plugin=PluginFlags(
            pass_device_specs=_typed(plugin_doc, "passDeviceSpecs", bool, at),
            device_list_strategy=_device_list_strategy(
                plugin_doc.get("deviceListStrategy"), f"{at}deviceListStrategy"
            ),
            device_id_strategy=_choice(plugin_doc, "deviceIDStrategy", DEVICE_ID_STRATEGIES, at),
            cdi_annotation_prefix=_typed(plugin_doc, "cdiAnnotationPrefix", str, at),
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
        mps_root=_typed(flags_doc, "mpsRoot", str, "flags.") or None,
        nvidia_driver_root=_typed(flags_doc, "nvidiaDriverRoot", str, "flags.") or None,
        nvidia_dev_root=_typed(flags_doc, "nvidiaDevRoot", str, "flags.") or None,
    )
    sharing_doc = _section(doc, "sharing", "")
    time_slicing, ts_fail = _replication(
        _section(sharing_doc, "timeSlicing", "sharing."),
        "sharing.timeSlicing.",
        fail_default=False,
    )
    # NVIDIA keeps MPS's historical behaviour (one replica per container) unless relaxed.
    mps, mps_fail = _replication(
        _section(sharing_doc, "mps", "sharing."), "sharing.mps.", fail_default=True
    )
    if time_slicing and mps:
        raise DevicePluginConfigError("sharing: timeSlicing and mps cannot both list resources")
    sharing = Sharing()
    if time_slicing:
        sharing = Sharing("time-slicing", time_slicing, ts_fail)
    elif mps:
        sharing = Sharing("mps", mps, mps_fail)
    return DevicePluginConfig(version="v1", flags=flags, sharing=sharing)


def load_device_plugin_config(path: str | Path | None) -> DevicePluginConfig:
    """Read CONFIG_FILE; no path means the defaults (no sharing). FileProblem names the file
    when it cannot be used."""
    if not path:
        return DevicePluginConfig()
    return parse_file(path, parse_device_plugin_config, (DevicePluginConfigError,))
