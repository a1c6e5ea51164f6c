"""Bad GPU claim configs, each with what the plugin's decoder says (at Prepare) and what the
API server's admission policy says (at ``kubectl apply``): one table, so the two agree on what
is refused and name the same field."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.draconfig import GROUP_VERSION
from gpu_operator.api.dragates import Gates, resolve

ALL = resolve({"TimeSlicingSettings": True, "MPSSupport": True})
NONE = Gates.defaults()


def gpu(sharing: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": GROUP_VERSION, "kind": "GpuConfig", **extra}
    if sharing is not None:
        doc["sharing"] = sharing
    return doc


def mig(sharing: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": GROUP_VERSION, "kind": "MigDeviceConfig"}
    if sharing is not None:
        doc["sharing"] = sharing
    return doc


def _mps(**config: Any) -> dict[str, Any]:
    return gpu({"strategy": "MPS", "mpsConfig": config})


# (parameters, gates, what decoding says, what admission says)
BAD: list[tuple[dict[str, Any], Gates, str, str]] = [
    (gpu(sharng={}), ALL, "parameters.sharng: unknown field", "parameters.sharng: unknown field"),
    (_mps(threads=5), ALL, "mpsConfig.threads", "mpsConfig.threads: unknown field"),
    (gpu({"strategy": "Sometimes"}), ALL, "parameters.sharing.strategy", "sharing.strategy"),
    (
        gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Sometimes"}}),
        ALL,
        "parameters.sharing.timeSlicingConfig.interval",
        "parameters.sharing.timeSlicingConfig.interval: must be one of",
    ),
    (
        _mps(defaultActiveThreadPercentage=150),
        ALL,
        "defaultActiveThreadPercentage: Input should be less than or equal to 100",
        "defaultActiveThreadPercentage: must be a whole number from 0 to 100",
    ),
    (
        _mps(defaultActiveThreadPercentage=-1),
        ALL,
        "greater than or equal to 0",
        "defaultActiveThreadPercentage: must be a whole number",
    ),
    (
        _mps(defaultActiveThreadPercentage="50"),  # Go's decoder takes no string for a number
        ALL,
        "defaultActiveThreadPercentage: Input should be a valid integer",
        "defaultActiveThreadPercentage: must be a whole number",
    ),
    (
        _mps(defaultPinnedDeviceMemoryLimit="512Ki"),
        ALL,
        "defaultPinnedDeviceMemoryLimit: must be at least 1Mi",
        "defaultPinnedDeviceMemoryLimit: must be a quantity of at least 1Mi",
    ),
    (
        _mps(defaultPinnedDeviceMemoryLimit="-5Gi"),
        ALL,
        "must be at least 1Mi",
        "defaultPinnedDeviceMemoryLimit: must be a quantity of at least 1Mi",
    ),
    (
        _mps(defaultPinnedDeviceMemoryLimit="10GB!"),
        ALL,
        "must be a Kubernetes quantity",
        "defaultPinnedDeviceMemoryLimit: must be a quantity",
    ),
    (
        _mps(defaultPerDevicePinnedMemoryLimit={"0": "0"}),
        ALL,
        "defaultPerDevicePinnedMemoryLimit['0']: must be at least 1Mi",
        "defaultPerDevicePinnedMemoryLimit: each limit must be a quantity of at least 1Mi",
    ),
    (
        _mps(multiUser="yes"),
        ALL,
        "multiUser: Input should be a valid boolean",
        "multiUser: must be true or false",
    ),
    (
        gpu({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}),
        ALL,
        "timeSlicingConfig cannot be set with strategy MPS",
        "timeSlicingConfig cannot be set with strategy MPS",
    ),
    (
        gpu({"strategy": "TimeSlicing", "mpsConfig": {}}),
        ALL,
        "mpsConfig cannot be set with strategy TimeSlicing",
        "mpsConfig cannot be set with strategy TimeSlicing",
    ),
    (
        mig({"strategy": "TimeSlicing", "timeSlicingConfig": {}}),
        ALL,
        "timeSlicingConfig: unknown field",
        "sharing.timeSlicingConfig: unknown field",
    ),
    (
        gpu({"strategy": "MPS"}),
        NONE,
        "needs the DRA driver's feature gate MPSSupport",
        "needs the DRA driver's feature gate MPSSupport",
    ),
    (
        gpu({"strategy": "TimeSlicing"}),
        NONE,
        "feature gate TimeSlicingSettings",
        "feature gate TimeSlicingSettings",
    ),
    (
        {"apiVersion": "v1", "kind": "GpuConfig"},
        ALL,
        "apiVersion resource.nvidia.com/v1beta1",
        "apiVersion resource.nvidia.com/v1beta1 with kind GpuConfig or MigDeviceConfig",
    ),
    (
        {"apiVersion": GROUP_VERSION, "kind": "VfioDeviceConfig"},
        ALL,  # PassthroughSupport off: admission knows only the other two kinds
        "VfioDeviceConfig needs the DRA driver's feature gate PassthroughSupport",
        "kind GpuConfig or MigDeviceConfig expected",
    ),
]

# Accepted by both with every gate on (and the decoder's normal forms of them).
GOOD: list[dict[str, Any]] = [
    gpu(),
    gpu({"strategy": "TimeSlicing"}),
    gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    _mps(),
    _mps(
        defaultActiveThreadPercentage=50,
        defaultPinnedDeviceMemoryLimit="10Gi",
        defaultPerDevicePinnedMemoryLimit={"0": "5Gi"},
        multiUser=True,
    ),
    mig({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}),
    mig({"strategy": "TimeSlicing"}),
]
