"""Opaque device configs of NVIDIA's DRA driver (``resource.nvidia.com/v1beta1``), decoded,
normalized and validated as that driver does, for the kubelet plugin and for admission.

A claim (or its DeviceClass) carries ``config: [{requests: [...], opaque: {driver:
gpu.nvidia.com, parameters: {...}}}]``. The parameters are ``GpuConfig`` or ``MigDeviceConfig``
with a ``sharing`` section, or (PassthroughSupport) ``VfioDeviceConfig`` with an ``iommu``
section: ``TimeSlicing`` (an interval) or ``MPS`` (thread percentage and
pinned-memory limits). Decoding is strict: an unknown field, a misspelt strategy or interval,
a thread percentage outside 0-100, a limit under 1Mi, the other strategy's section beside a
strategy, or a strategy whose gate is off is an error naming the field. Precedence is NVIDIA's:
built-in defaults, then the DeviceClass's configs, then the claim's, the later winning per
device; a config naming requests must fit their devices' type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import AfterValidator, Field, StrictBool, StrictInt, ValidationError, model_validator

from gpu_operator.api.base import ApiModel
from gpu_operator.api.dragates import Gates
from gpu_operator.api.formats import quantity
from gpu_operator.api.gpucluster import DRIVER_NAME as DRIVER
from gpu_operator.api.policy import describe_validation_error

GROUP_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG, MIG_CONFIG, VFIO_CONFIG = "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"
PASSTHROUGH = "PassthroughSupport"
TIME_SLICING: Final = "TimeSlicing"
MPS: Final = "MPS"
GATE_OF = {TIME_SLICING: "TimeSlicingSettings", MPS: "MPSSupport"}
MIB = 1024 * 1024


class ConfigError(ValueError):
    """A device config that cannot be used; ``problems`` name each field and the fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def _limit(value: str | int) -> str | int:
    try:
        amount = quantity(value)
    except ValueError:
        raise ValueError("must be a Kubernetes quantity such as 512Mi or 10Gi") from None
    if amount < MIB:
        raise ValueError("must be at least 1Mi (MPS limits are whole MiB)")
    return value


Limit = Annotated[str | int, AfterValidator(_limit)]


Interval = Literal["Default", "Short", "Medium", "Long"]
INTERVALS: tuple[str, ...] = get_args(Interval)  # in NVIDIA's order: nvidia-smi's 0 to 3


class TimeSlicingConfig(ApiModel):
    interval: Interval | None = None


class MpsConfig(ApiModel):
    # Strict, as Go's JSON decoding is: "50" or "yes" is an error, not a number or true.
    default_active_thread_percentage: StrictInt | None = Field(default=None, ge=0, le=100)
    default_pinned_device_memory_limit: Limit | None = None
    # A device index into the claim's devices, or a GPU UUID -> its limit.
    default_per_device_pinned_memory_limit: dict[str, Limit] | None = None
    multi_user: StrictBool | None = None  # clients of more than one Linux user (Volta+)


class GpuSharing(ApiModel):
    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing_config: TimeSlicingConfig | None = None
    mps_config: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy(self) -> GpuSharing:
        if self.strategy == MPS and self.time_slicing_config is not None:
            raise ValueError("timeSlicingConfig cannot be set with strategy MPS: remove it")
        if self.strategy == TIME_SLICING and self.mps_config is not None:
            raise ValueError("mpsConfig cannot be set with strategy TimeSlicing: remove it")
        return self


class MigDeviceSharing(ApiModel):
    """A MIG device time-slices as its GPU does (no interval of its own) or runs MPS."""

    strategy: Literal["TimeSlicing", "MPS"]
    mps_config: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy(self) -> MigDeviceSharing:
        if self.strategy == TIME_SLICING and self.mps_config is not None:
            raise ValueError("mpsConfig cannot be set with strategy TimeSlicing: remove it")
        return self


class GpuConfig(ApiModel):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None


class MigDeviceConfig(ApiModel):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["MigDeviceConfig"]
    sharing: MigDeviceSharing | None = None


BackendPolicy = Literal["LegacyOnly", "PreferIommuFD"]
LEGACY_ONLY: Final = "LegacyOnly"
PREFER_IOMMUFD: Final = "PreferIommuFD"


class IommuConfig(ApiModel):
    """How a VFIO device reaches the IOMMU: the legacy group node, or IOMMUFD's per-device
    node where the host has ``/dev/iommu``; ``enableAPIDevice`` also hands out the backend's
    API node (``/dev/iommu`` or ``/dev/vfio/vfio``). NVIDIA's field is required in the section."""

    backend_policy: BackendPolicy
    enable_api_device: StrictBool | None = Field(default=None, alias="enableAPIDevice")


class VfioDeviceConfig(ApiModel):
    api_version: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["VfioDeviceConfig"]
    iommu: IommuConfig | None = None


DeviceConfig = GpuConfig | MigDeviceConfig | VfioDeviceConfig
KINDS: Mapping[str, type[GpuConfig] | type[MigDeviceConfig] | type[VfioDeviceConfig]] = {
    GPU_CONFIG: GpuConfig,
    MIG_CONFIG: MigDeviceConfig,
    VFIO_CONFIG: VfioDeviceConfig,
}
DEVICE_TYPE = {GPU_CONFIG: "gpu", MIG_CONFIG: "mig", VFIO_CONFIG: "vfio"}
DeviceType = Literal["gpu", "mig", "vfio"]


def decode(parameters: Mapping[str, Any], gates: Gates, where: str = "parameters") -> DeviceConfig:
    """``parameters`` of an opaque config as NVIDIA's driver reads them: strict, normalized
    (TimeSlicing without its section means interval Default; MPS without its section means
    ``{}``), and refused when its strategy's gate is off. ``where`` prefixes the field names."""
    kind = parameters.get("kind")
    if parameters.get("apiVersion") != GROUP_VERSION or kind not in KINDS:
        raise ConfigError(
            [
                f"{where}: apiVersion {GROUP_VERSION} with kind {GPU_CONFIG}, {MIG_CONFIG} or "
                f"{VFIO_CONFIG} expected (got {parameters.get('apiVersion')!r}, {kind!r})"
            ]
        )
    try:
        config = KINDS[str(kind)].model_validate(dict(parameters))
    except ValidationError as exc:
        lines = describe_validation_error(exc, kind=str(kind))
        raise ConfigError([f"{where}{line.removeprefix('spec')}" for line in lines]) from None
    if isinstance(config, VfioDeviceConfig):
        return _vfio(config, gates, where)
    sharing = config.sharing
    if sharing is None:
        if gates.on(GATE_OF[TIME_SLICING]):
            config.sharing = (
                GpuSharing(strategy=TIME_SLICING, time_slicing_config=TimeSlicingConfig())
                if isinstance(config, GpuConfig)
                else MigDeviceSharing(strategy=TIME_SLICING)
            )
        sharing = config.sharing
    if sharing is None:
        return config
    gate = GATE_OF[sharing.strategy]
    if not gates.on(gate):
        raise ConfigError(
            [
                f"{where}.sharing.strategy: {sharing.strategy} needs the DRA driver's feature "
                f"gate {gate} (GPUCluster spec.draDriver.featureGates.{gate}: true)"
            ]
        )
    if isinstance(sharing, GpuSharing) and sharing.strategy == TIME_SLICING:
        sharing.time_slicing_config = sharing.time_slicing_config or TimeSlicingConfig()
        sharing.time_slicing_config.interval = sharing.time_slicing_config.interval or "Default"
    if sharing.strategy == MPS and sharing.mps_config is None:
        sharing.mps_config = MpsConfig()
    return config


def _vfio(config: VfioDeviceConfig, gates: Gates, where: str) -> VfioDeviceConfig:
    """NVIDIA's normalization: no ``iommu`` means LegacyOnly without the API device; an
    unset ``enableAPIDevice`` means false. Refused while PassthroughSupport is off."""
    if not gates.on(PASSTHROUGH):
        raise ConfigError(
            [
                f"{where}.kind: {VFIO_CONFIG} needs the DRA driver's feature gate {PASSTHROUGH} "
                f"(GPUCluster spec.draDriver.featureGates.{PASSTHROUGH}: true)"
            ]
        )
    if config.iommu is None:
        config.iommu = IommuConfig.model_validate(
            {"backendPolicy": LEGACY_ONLY, "enableAPIDevice": False}
        )
    elif config.iommu.enable_api_device is None:
        config.iommu.enable_api_device = False
    return config


@dataclass(frozen=True)
class ClaimConfig:
    """One entry of a claim's (or its DeviceClass's) ``config``, this driver's only."""

    requests: tuple[str, ...]  # empty: every request
    config: DeviceConfig
    where: str  # the field it came from, for errors


def claim_configs(
    entries: Sequence[Mapping[str, Any]], gates: Gates, where: str
) -> list[ClaimConfig]:
    """``spec.devices.config`` (or a DeviceClass's ``spec.config``): the entries for this
    driver decoded in order; every bad entry is named."""
    found: list[ClaimConfig] = []
    problems: list[str] = []
    for i, entry in enumerate(entries):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRIVER:
            continue
        at = f"{where}[{i}].opaque.parameters"
        try:
            config = decode(opaque.get("parameters") or {}, gates, at)
        except ConfigError as err:
            problems += err.problems
            continue
        found.append(ClaimConfig(tuple(entry.get("requests") or ()), config, at))
    if problems:
        raise ConfigError(problems)
    return found


def defaults(gates: Gates) -> list[ClaimConfig]:
    """The driver's own configs, before any DeviceClass's or claim's."""
    base = {"apiVersion": GROUP_VERSION}
    kinds = (GPU_CONFIG, MIG_CONFIG, VFIO_CONFIG) if gates.on(PASSTHROUGH) else KINDS_BUILT
    return [ClaimConfig((), decode({**base, "kind": kind}, gates), "default") for kind in kinds]


KINDS_BUILT = (GPU_CONFIG, MIG_CONFIG)  # the defaults without PassthroughSupport


def config_for(
    configs: Sequence[ClaimConfig], request: str, device_type: DeviceType
) -> DeviceConfig:
    """The config of a device of ``device_type`` allocated for ``request``: the last of
    ``configs`` (defaults, then class, then claim) that applies. A config naming ``request``
    whose kind does not fit the device is an error; one naming no request skips it. A
    subrequest (``gpu/large`` of a ``firstAvailable``) is named by itself or its request."""
    names = {request, request.split("/", 1)[0]}
    for entry in reversed(configs):
        if entry.requests and not names & set(entry.requests):
            continue
        if DEVICE_TYPE[entry.config.kind] != device_type:
            if entry.requests:
                raise ConfigError(
                    [
                        f"{entry.where}: a {entry.config.kind} cannot configure request "
                        f"{request!r}, which was given a {device_type.upper()} device"
                    ]
                )
            continue
        return entry.config
    raise ConfigError([f"no config applies to request {request!r}"])  # defaults always do


def pinned_limits(mps: MpsConfig, uuids: Sequence[str]) -> dict[str, str]:
    """Each device's MPS pinned-memory limit, as the control daemon takes it (``<MiB>M``): the
    default for every device, then per-device entries keyed by UUID or index into ``uuids``."""
    limits: dict[str, str] = {}
    if mps.default_pinned_device_memory_limit is not None:
        limits = {u: _mib(mps.default_pinned_device_memory_limit) for u in uuids}
    for key, value in (mps.default_per_device_pinned_memory_limit or {}).items():
        if key in uuids:
            limits[key] = _mib(value)
        elif key.isdigit() and int(key) < len(uuids):
            limits[uuids[int(key)]] = _mib(value)
        else:
            raise ConfigError(
                [
                    f"mpsConfig.defaultPerDevicePinnedMemoryLimit.{key}: not a GPU UUID of the "
                    f"claim nor an index below {len(uuids)}"
                ]
            )
    return limits


def _mib(value: str | int) -> str:
    return f"{int(quantity(value)) // MIB}M"
