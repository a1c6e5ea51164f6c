"""The device plugin's effective settings: the config file, overridden by flags and env.

NVIDIA's plugin lets a command-line flag or its environment variable (MIG_STRATEGY,
DEVICE_LIST_STRATEGY...) win over the file, and the operator's DaemonSet sets several of them;
the same precedence holds here so the two images are interchangeable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_operator.agent.deviceplugin.config_file import (
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    MIG_STRATEGIES,
    DevicePluginConfig,
    DevicePluginConfigError,
    MigStrategy,
)

DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_MPS_ROOT = "/run/nvidia/mps"

# Override keys: the environment variable names NVIDIA's plugin reads.
ENV_NAMES = (
    "MIG_STRATEGY",
    "FAIL_ON_INIT_ERROR",
    "PASS_DEVICE_SPECS",
    "DEVICE_LIST_STRATEGY",
    "DEVICE_ID_STRATEGY",
    "CDI_ANNOTATION_PREFIX",
    "MPS_ROOT",
    "NVIDIA_DRIVER_ROOT",
    "NVIDIA_DEV_ROOT",
)


@dataclass(frozen=True)
class PluginSettings:
    mig_strategy: MigStrategy = "none"
    fail_on_init_error: bool = True
    pass_device_specs: bool = False
    device_list_strategies: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    mps_root: str = DEFAULT_MPS_ROOT  # on the host: where the MPS control daemon keeps pipes
    driver_root: str = "/"  # on the host: the driver root (NVIDIA_DRIVER_ROOT)
    # On the host: where /dev/nvidia* live (NVIDIA_DEV_ROOT); None: wherever the driver has
    # them (its root's dev/ for a driver container's, else /dev).
    dev_root: str | None = None

    @property
    def cdi_enabled(self) -> bool:
        return any(s.startswith("cdi-") for s in self.device_list_strategies)

    @property
    def cdi_only(self) -> bool:
        return all(s.startswith("cdi-") for s in self.device_list_strategies)


def _bool(value: str, name: str) -> bool:
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise DevicePluginConfigError(f"{name}: {value!r} is not true or false")


def _strategies(value: str | list[str], name: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    found = tuple(s.strip() for s in items if s.strip())
    for item in found:
        if item not in DEVICE_LIST_STRATEGIES:
            raise DevicePluginConfigError(
                f"{name}: {item!r} is not one of {', '.join(DEVICE_LIST_STRATEGIES)}"
            )
    if not found:
        raise DevicePluginConfigError(f"{name}: no strategy given")
    return found


def plugin_settings(
    config: DevicePluginConfig, overrides: Mapping[str, str | None] | None = None
) -> PluginSettings:
    """The file's flags, then every override that is set (keys are :data:`ENV_NAMES`)."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(given) - set(ENV_NAMES))
    if unknown:
        raise ValueError(f"unknown overrides {unknown}")
    flags = config.flags
    plugin = flags.plugin
    mig = given.get("MIG_STRATEGY") or flags.mig_strategy or "none"
    if mig not in MIG_STRATEGIES:
        raise DevicePluginConfigError(f"MIG_STRATEGY: {mig!r} is not one of none, single, mixed")
    id_strategy = (
        given.get("DEVICE_ID_STRATEGY") or (plugin and plugin.device_id_strategy) or "uuid"
    )
    if id_strategy not in DEVICE_ID_STRATEGIES:
        raise DevicePluginConfigError(f"DEVICE_ID_STRATEGY: {id_strategy!r} is not uuid or index")
    list_strategy = given.get("DEVICE_LIST_STRATEGY")
    strategies = (
        _strategies(list_strategy, "DEVICE_LIST_STRATEGY")
        if list_strategy
        else _strategies(
            (plugin and plugin.device_list_strategy) or "envvar",
            "flags.plugin.deviceListStrategy",
        )
    )
    fail = given.get("FAIL_ON_INIT_ERROR")
    specs = given.get("PASS_DEVICE_SPECS")
    driver_root = given.get("NVIDIA_DRIVER_ROOT") or flags.nvidia_driver_root or "/"
    return PluginSettings(
        mig_strategy=mig,
        fail_on_init_error=(
            _bool(fail, "FAIL_ON_INIT_ERROR")
            if fail is not None
            else flags.fail_on_init_error is not False
        ),
        pass_device_specs=(
            _bool(specs, "PASS_DEVICE_SPECS")
            if specs is not None
            else bool(plugin and plugin.pass_device_specs)
        ),
        device_list_strategies=strategies,
        device_id_strategy=id_strategy,
        cdi_annotation_prefix=given.get("CDI_ANNOTATION_PREFIX")
        or (plugin and plugin.cdi_annotation_prefix)
        or DEFAULT_CDI_ANNOTATION_PREFIX,
        mps_root=given.get("MPS_ROOT") or flags.mps_root or DEFAULT_MPS_ROOT,
        driver_root=driver_root,
        dev_root=given.get("NVIDIA_DEV_ROOT") or flags.nvidia_dev_root or None,
    )
