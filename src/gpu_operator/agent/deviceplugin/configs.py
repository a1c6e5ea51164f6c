"""Which named config applies, as NVIDIA's config-manager decides it.

A directory holds one file per named config (a mounted ConfigMap: ``..data`` and other
dot-dot entries are the kubelet's, not configs). The node label
``nvidia.com/device-plugin.config`` names one; without the label, DEFAULT_CONFIG applies; without
a default, the fallback strategies are tried in order: ``named`` (a config called ``default``),
``single`` (the only config there is), ``empty`` (no config file: the plugin's defaults).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agent.deviceplugin.config_file import (
    DevicePluginConfig,
    parse_device_plugin_config,
)

CONFIG_LABEL = "nvidia.com/device-plugin.config"
FALLBACKS = ("named", "single", "empty")
DEFAULT_FALLBACKS = ("named", "single")  # what the operator's DaemonSet sets


class ConfigSelectionError(ValueError):
    """No config can be chosen (the message names the label or setting to fix)."""


def available_configs(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.iterdir() if not p.name.startswith("..") and not p.is_dir()
    )


def parse_fallbacks(text: str | None) -> tuple[str, ...]:
    items = tuple(t.strip() for t in (text or "").split(",") if t.strip())
    unknown = [t for t in items if t not in FALLBACKS]
    if unknown:
        raise ConfigSelectionError(
            f"FALLBACK_STRATEGIES: {', '.join(unknown)} not one of {', '.join(FALLBACKS)}"
        )
    return items


def select_config(
    label: str | None,
    available: Collection[str],
    default: str | None = None,
    fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
    *,
    label_key: str = CONFIG_LABEL,
) -> str | None:
    """The config name to apply; ``None`` means no config file (the plugin's defaults)."""
    names = sorted(available)
    if label:
        if label not in available:
            raise ConfigSelectionError(
                f"node label {label_key}={label} names no config; available: "
                f"{', '.join(names) or 'none'}"
            )
        return label
    if default:
        if default not in available:
            raise ConfigSelectionError(
                f"default config {default!r} (DEFAULT_CONFIG, devicePlugin.config.default) "
                f"does not exist; available: {', '.join(names) or 'none'}"
            )
        return default
    for fallback in fallbacks:
        if fallback == "named" and "default" in available:
            return "default"
        if fallback == "single" and len(names) == 1:
            return names[0]
        if fallback == "empty":
            return None
    raise ConfigSelectionError(
        f"no {label_key} label, no default config and no fallback "
        f"({', '.join(fallbacks) or 'none'}) applies; available: {', '.join(names) or 'none'}"
    )


@dataclass(frozen=True)
class ConfigDir:
    """A directory of named configs (NVIDIA's config-manager inputs); the device plugin and
    feature discovery both follow the node label through it."""

    directory: Path
    default: str | None = None
    fallbacks: tuple[str, ...] = DEFAULT_FALLBACKS
    label_key: str = CONFIG_LABEL

    def choose(self, label: str | None) -> tuple[str | None, DevicePluginConfig]:
        """The selected name and its parsed config; raises ConfigSelectionError,
        DevicePluginConfigError (the message names the file) or OSError."""
        available = available_configs(self.directory)
        name = select_config(
            label, available, self.default, self.fallbacks, label_key=self.label_key
        )
        if name is None:
            return None, DevicePluginConfig()
        text = (self.directory / name).read_text()
        try:
            return name, parse_device_plugin_config(text)
        except ValueError as exc:
            raise type(exc)(f"config {name!r}: {exc}") from exc
