"""The DRA driver's feature gates, with NVIDIA's DRA driver's names, defaults and rules.

``spec.draDriver.featureGates`` is rendered as the plugin's ``FEATURE_GATES``
(``Name=true,Other=false``, as NVIDIA's driver reads it). A gate NVIDIA's driver does not know,
a value that is not a boolean, or a pair it refuses together is an error naming the gates: the
GPUCluster is then reported InvalidSpec and nothing is rendered, so no plugin starts
half-configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# NVIDIA's gates and their defaults (kubernetes-sigs/dra-driver-nvidia-gpu, pkg/featuregates).
DEFAULTS: Mapping[str, bool] = {
    "TimeSlicingSettings": False,
    "MPSSupport": False,
    "IMEXDaemonsWithDNSNames": True,
    "PassthroughSupport": False,
    "NVMLDeviceHealthCheck": False,
    "DynamicMIG": False,
    "ComputeDomainCliques": True,
    "CrashOnNVLinkFabricErrors": True,
    "DeviceMetadata": False,
    "FabricManagerPartitioning": False,
    "HostManagedIMEXDaemon": False,
    "NodeLocalFabricIPC": False,
    "DRAListTypeAttributes": False,
    "ConsumableShares": False,
}
# Pairs NVIDIA's driver refuses on together, and gates that need another one on.
EXCLUSIVE = (
    ("DynamicMIG", "PassthroughSupport"),
    ("DynamicMIG", "MPSSupport"),
    ("PassthroughSupport", "NVMLDeviceHealthCheck"),
)
REQUIRES = (
    ("ComputeDomainCliques", "IMEXDaemonsWithDNSNames"),
    ("DeviceMetadata", "PassthroughSupport"),
)
_TRUE = {"true": True, "false": False}


class GateError(ValueError):
    """``FEATURE_GATES`` (or ``spec.draDriver.featureGates``) cannot be used as given."""


@dataclass(frozen=True)
class Gates:
    """Every known gate's value: the defaults with what was set on top."""

    values: Mapping[str, bool]

    def on(self, name: str) -> bool:
        if name not in DEFAULTS:
            raise KeyError(f"unknown feature gate {name}")
        return self.values[name]

    @classmethod
    def defaults(cls) -> Gates:
        return cls(dict(DEFAULTS))


def parse(text: str) -> dict[str, bool]:
    """``Name=true,Other=false`` as a mapping; a malformed item or value is an error."""
    found: dict[str, bool] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or not name:
            raise GateError(f"feature gate {item!r}: write it as Name=true or Name=false")
        if value not in _TRUE:
            raise GateError(f"feature gate {name}={value}: the value must be true or false")
        found[name] = _TRUE[value]
    return found


def resolve(given: Mapping[str, bool]) -> Gates:
    """The gates ``given`` sets over the defaults, checked as NVIDIA's driver checks them."""
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise GateError(
            f"unknown feature gate(s) {', '.join(unknown)}: known are {', '.join(DEFAULTS)}"
        )
    values = {**DEFAULTS, **given}
    problems = [f"{a} and {b} cannot both be on" for a, b in EXCLUSIVE if values[a] and values[b]]
    problems += [f"{a} needs {b} on" for a, b in REQUIRES if values[a] and not values[b]]
    if problems:
        raise GateError(f"feature gates: {'; '.join(problems)}")
    return Gates(values)


def from_env(text: str | None) -> Gates:
    """The plugin's gates from its ``FEATURE_GATES`` (unset or empty: the defaults)."""
    return resolve(parse(text or ""))
