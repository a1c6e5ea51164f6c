"""NVIDIA's GPUCluster (nvidia.com/v1alpha1): the DRA-based GPU stack, as pydantic models.

The field set follows NVIDIA's ``gpucluster_types.go`` and its published CRD, so NVIDIA's
documents load unchanged; shared sections (daemonsets, dcgm, dcgmExporter, hostPaths) reuse the
ClusterPolicy models, whose wire shape is the same. ``hostPaths.rootFS`` is not in NVIDIA's
GPUCluster CRD but is in its sample, so it is accepted here. The object is a singleton named
``gpu-cluster``, as NVIDIA's CEL rule enforces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from gpu_operator.api import dragates
from gpu_operator.api.base import ApiModel, EnvVar, ImageRef, Resources, crd_default, drop_nulls
from gpu_operator.api.policy import PolicyError, describe_validation_error
from gpu_operator.api.spec import DaemonsetsSpec, DcgmExporterSpec, DcgmSpec, HostPathsSpec
from gpu_operator.api.status import Condition

GROUP = "nvidia.com"
VERSION = "v1alpha1"
KIND = "GPUCluster"
PLURAL = "gpuclusters"
API_VERSION = f"{GROUP}/{VERSION}"
SINGLETON = "gpu-cluster"
# The DRA driver name NVIDIA's kubelet plugin publishes under (ResourceSlice spec.driver).
DRIVER_NAME = "gpu.nvidia.com"

GpuClusterState = Literal["ready", "notReady", "disabled", "ignored"]


class HealthCheck(ApiModel):
    enabled: bool | None = Field(default=None, json_schema_extra=crd_default(True))
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="gRPC health port; 51516 for the gpus container, 51515 for computeDomains.",
    )


class KubeletPluginSpec(ApiModel):
    env: list[EnvVar] | None = None
    resources: Resources | None = None
    healthcheck: HealthCheck | None = None


class ControllerSpec(ApiModel):
    env: list[EnvVar] | None = None
    resources: Resources | None = None


class GpusSpec(ApiModel):
    kubelet_plugin: KubeletPluginSpec | None = None


class ComputeDomainsSpec(ApiModel):
    """Multi-node NVLink (IMEX) domains: accepted, reported NotImplemented when enabled."""

    enabled: bool | None = Field(default=None, json_schema_extra=crd_default(True))
    controller: ControllerSpec | None = None
    kubelet_plugin: KubeletPluginSpec | None = None


class DraDriverSpec(ImageRef):
    feature_gates: dict[str, bool] | None = Field(
        default=None, description="Feature gates, rendered as FEATURE_GATES on the plugin."
    )
    gpus: GpusSpec | None = None
    compute_domains: ComputeDomainsSpec | None = None

    @field_validator("feature_gates")
    @classmethod
    def _known_gates(cls, gates: dict[str, bool] | None) -> dict[str, bool] | None:
        if gates:
            dragates.resolve(gates)  # a GateError names the gates and what to change
        return gates


class GPUClusterSpec(ApiModel):
    dra_driver: DraDriverSpec = Field(description="The NVIDIA DRA driver (kubelet plugin).")
    dcgm: DcgmSpec = Field(default_factory=DcgmSpec)
    dcgm_exporter: DcgmExporterSpec = Field(default_factory=DcgmExporterSpec)
    host_paths: HostPathsSpec = Field(default_factory=HostPathsSpec)
    daemonsets: DaemonsetsSpec = Field(default_factory=DaemonsetsSpec)

    @property
    def compute_domains_enabled(self) -> bool:
        domains = self.dra_driver.compute_domains
        return domains is None or domains.enabled is None or bool(domains.enabled)


class GPUClusterStatus(ApiModel):
    state: GpuClusterState | None = None
    namespace: str | None = None
    conditions: list[Condition] | None = None


def parse_gpucluster_spec(spec: Mapping[str, Any] | None) -> GPUClusterSpec:
    """Validate a GPUCluster ``spec``; raise ``PolicyError`` naming every bad field."""
    try:
        return GPUClusterSpec.model_validate(drop_nulls(dict(spec or {})))
    except ValidationError as exc:
        raise PolicyError(describe_validation_error(exc, kind=KIND)) from None


def parse_gpucluster(doc: Mapping[str, Any]) -> GPUClusterSpec:
    """Validate a whole GPUCluster object (apiVersion, kind, the singleton name, spec)."""
    problems = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: must be {API_VERSION} (got {doc.get('apiVersion')!r})")
    if doc.get("kind") != KIND:
        problems.append(f"kind: must be {KIND} (got {doc.get('kind')!r})")
    name = (doc.get("metadata") or {}).get("name")
    if name != SINGLETON:
        problems.append(
            f"metadata.name: GPUCluster is a singleton named {SINGLETON!r} (got {name!r})"
        )
    if problems:
        raise PolicyError(problems)
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise PolicyError(["spec: must be a mapping with spec.draDriver"])
    return parse_gpucluster_spec(spec)


def example_document() -> dict[str, Any]:
    """The smallest useful GPUCluster: the DRA driver for GPUs, exporter on, no ComputeDomains."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": SINGLETON},
        "spec": {
            "draDriver": {"gpus": {"kubeletPlugin": {}}, "computeDomains": {"enabled": False}},
            "dcgmExporter": {"enabled": True},
        },
    }
