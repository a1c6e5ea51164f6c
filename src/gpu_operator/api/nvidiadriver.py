"""The NVIDIADriver API (nvidia.com/v1alpha1): one driver configuration per node pool.

NVIDIA's schema, accepted unchanged: every field of its NVIDIADriverSpec, its defaults and its
CEL rules (``driverType`` and ``usePrecompiled`` are immutable; a ``default`` NVIDIADriver has no
nodeSelector), with the messages its API server returns. Shared building blocks (env, probes,
tolerations, the upgrade policy, the pod security context) are the ClusterPolicy's own models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError

from gpu_operator.api.base import (
    ApiModel,
    EnvVar,
    ImageName,
    ImageRef,
    ImageRepository,
    ImageVersion,
    IntOrPercent,
    NonNegativeInt,
    Probe,
    Resources,
    Toleration,
    crd_default,
    drop_nulls,
)
from gpu_operator.api.formats import DNS_LABEL_MAX
from gpu_operator.api.policy import PolicyError, describe_validation_error
from gpu_operator.api.spec import (
    CanarySpec,
    DrainSpec,
    DriverSpec,
    PodDeletionSpec,
    PodSecurityContext,
    UpgradePolicy,
    WaitForCompletionSpec,
)
from gpu_operator.api.status import Rollout
from gpu_operator.labels import DRIVER_POOL

GROUP = "nvidia.com"
VERSION = "v1alpha1"
KIND = "NVIDIADriver"
PLURAL = "nvidiadrivers"
API_VERSION = f"{GROUP}/{VERSION}"
DEFAULT_NAME = "default"  # the NVIDIADriver created when the ClusterPolicy asks for the CRD

DriverType = Literal["gpu", "vgpu", "vgpu-host-manager"]


def immutable(field: str) -> dict[str, Any]:
    """NVIDIA's CEL rule and message for a field fixed at creation."""
    return {
        "x-kubernetes-validations": [
            {
                "rule": "self == oldSelf",
                "message": f"{field} is an immutable field. Please create a new NvidiaDriver "
                "resource instead when you want to change this setting.",
            }
        ]
    }


DEFAULT_WITHOUT_SELECTOR = {
    "rule": "has(self.default) && self.default ? "
    "!has(self.nodeSelector) || size(self.nodeSelector) == 0 : true",
    "message": "default NVIDIADriver must not use nodeSelector",
}
# The name is the value of the pool label on the nodes it selects, so it must fit a label value;
# Kubernetes itself allows names of up to 253 characters.
NAME_FITS_A_LABEL = {
    "rule": f"size(self.metadata.name) <= {DNS_LABEL_MAX}",
    "message": f"metadata.name must be at most {DNS_LABEL_MAX} characters: it is the value of "
    f"the {DRIVER_POOL} label on the nodes this NVIDIADriver selects",
}


class SideContainer(ImageRef):
    """GDS (nvidia-fs) and GDRCopy: containers beside the driver, with their own image."""

    enabled: bool | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None


class DriverManagerSpec(ImageRef):
    env: list[EnvVar] | None = None


class RdmaSpec(ApiModel):
    enabled: bool | None = None
    use_host_mofed: bool | None = None


class NameRef(ApiModel):
    name: str | None = None


class LicensingSpec(ApiModel):
    name: str | None = Field(default=None, description="Deprecated: a ConfigMap; use secretName.")
    secret_name: str | None = None
    nls_enabled: bool | None = None


class NodeSelectorRequirement(ApiModel):
    key: str
    operator: str
    values: list[str] | None = None


class NodeSelectorTerm(ApiModel):
    match_expressions: list[NodeSelectorRequirement] | None = None
    match_fields: list[NodeSelectorRequirement] | None = None


class NodeSelector(ApiModel):
    node_selector_terms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(ApiModel):
    preference: NodeSelectorTerm
    weight: int


class NodeAffinity(ApiModel):
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        None
    )
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class DriverUpgradePolicy(UpgradePolicy):
    """NVIDIA's per-CR upgrade policy: the same fields, automatic upgrades on by default."""

    auto_upgrade: bool | None = Field(default=None, json_schema_extra=crd_default(True))
    max_parallel_upgrades: NonNegativeInt | None = Field(
        default=None, json_schema_extra=crd_default(1)
    )
    max_unavailable: IntOrPercent | None = Field(default=None, json_schema_extra=crd_default("25%"))
    pod_deletion: PodDeletionSpec | None = None
    wait_for_completion: WaitForCompletionSpec | None = None
    drain: DrainSpec | None = None
    canary: CanarySpec | None = None


class NVIDIADriverSpec(ApiModel):
    default: bool = Field(
        default=False,
        description="The fallback driver for GPU nodes no other NVIDIADriver selects.",
        json_schema_extra=crd_default(False),
    )
    driver_type: DriverType = Field(
        default="gpu", json_schema_extra={**crd_default("gpu"), **immutable("driverType")}
    )
    use_precompiled: bool | None = Field(
        default=None, json_schema_extra=immutable("usePrecompiled")
    )
    use_open_kernel_modules: bool | None = Field(
        default=None, description="Deprecated: use kernelModuleType."
    )
    kernel_module_type: Literal["auto", "open", "proprietary"] | None = Field(
        default=None, json_schema_extra=crd_default("auto")
    )
    repository: ImageRepository | None = None
    image: ImageName = Field(
        default="nvcr.io/nvidia/driver", json_schema_extra=crd_default("nvcr.io/nvidia/driver")
    )
    version: ImageVersion | None = Field(
        default=None, description="Driver version, or only the branch for precompiled drivers."
    )
    image_pull_policy: str | None = None
    image_pull_secrets: list[str] | None = None
    manager: DriverManagerSpec | None = None
    startup_probe: Probe | None = None
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    rdma: RdmaSpec | None = None
    gds: SideContainer | None = None
    gdrcopy: SideContainer | None = None
    resources: Resources | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    host_network: bool | None = None
    repo_config: NameRef | None = None
    cert_config: NameRef | None = None
    licensing_config: LicensingSpec | None = None
    virtual_topology_config: NameRef | None = None
    kernel_module_config: NameRef | None = None
    secret_env: str | None = None
    node_selector: dict[str, str] | None = None
    node_affinity: NodeAffinity | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None
    priority_class_name: str | None = None
    pod_security_context: PodSecurityContext | None = None
    upgrade_policy: DriverUpgradePolicy | None = None


class Condition(ApiModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int | None = None


class NVIDIADriverStatus(ApiModel):
    state: Literal["ignored", "ready", "notReady", "disabled"]
    namespace: str | None = None
    conditions: list[Condition] | None = None
    rollout: Rollout | None = None


def parse_driver_spec(spec: Mapping[str, Any] | None) -> NVIDIADriverSpec:
    """Validate an NVIDIADriver ``spec``; ``PolicyError`` names every bad field."""
    try:
        return NVIDIADriverSpec.model_validate(drop_nulls(dict(spec or {})))
    except ValidationError as exc:
        raise PolicyError(describe_validation_error(exc, kind=KIND)) from None


# ClusterPolicy driver fields that an NVIDIADriver spells the same way.
_SAME_FIELDS = (
    "repository", "image", "version", "imagePullPolicy", "imagePullSecrets", "resources", "args",
    "env", "usePrecompiled", "kernelModuleType", "startupProbe", "livenessProbe",
    "readinessProbe", "manager", "rdma", "secretEnv", "upgradePolicy",
)  # fmt: skip


def spec_from_clusterpolicy(driver: DriverSpec) -> dict[str, Any]:
    """The ClusterPolicy's ``driver`` section as an NVIDIADriver spec (wire form): the fields
    spelt alike, and the few NVIDIA renamed (repoConfig.configMapName -> repoConfig.name, ...).
    The ClusterPolicy's own driver and the ``default`` NVIDIADriver are rendered from it."""
    wire = driver.to_wire()
    spec: dict[str, Any] = {"driverType": "gpu"}
    spec.update({key: wire[key] for key in _SAME_FIELDS if key in wire})
    renamed = {"repoConfig": "configMapName", "certConfig": "name", "kernelModuleConfig": "name"}
    for key, field_name in renamed.items():
        value = (wire.get(key) or {}).get(field_name)
        if value:
            spec[key] = {"name": value}
    licensing = wire.get("licensingConfig") or {}
    moved = {
        "name": licensing.get("configMapName"),
        "secretName": licensing.get("secretName"),
        "nlsEnabled": licensing.get("nlsEnabled"),
    }
    if any(v is not None for v in moved.values()):
        spec["licensingConfig"] = {k: v for k, v in moved.items() if v is not None}
    topology = (wire.get("virtualTopology") or {}).get("config")
    if topology:
        spec["virtualTopologyConfig"] = {"name": topology}
    if "image" not in spec:
        spec["repository"], spec["image"] = spec.get("repository") or "nvcr.io/nvidia", "driver"
    return spec
