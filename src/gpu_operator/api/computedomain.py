"""NVIDIA's ComputeDomain (``resource.nvidia.com/v1beta1``): a multi-node NVLink (IMEX) domain.

The field set, defaults and rules are those of the DRA driver's ``computedomain.go`` and its
published CRD, so NVIDIA's documents load unchanged: a namespaced object whose ``spec`` is fixed
at creation (NVIDIA's CEL rule and message), ``spec.channel`` required, ``numNodes`` deprecated.

One addition, in ``status``: ``conditions``. NVIDIA's ``status.nodes[].status`` is an enum
(Ready/NotReady) and cannot say *why* an IMEX daemon did not start, which users asked for (its
start-up failures were invisible). A ``Ready`` condition carries that: its message names each
node whose daemon is not ready and the reason its container gives. A condition list rather
than a per-node field because it leaves NVIDIA's ``nodes[]`` items exactly as NVIDIA's daemons
and tools read and compare them, and it is what ``kubectl wait --for=condition=Ready`` and
``kubectl describe`` already understand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictInt, ValidationError

from gpu_operator.api.base import ApiModel, crd_default, drop_nulls
from gpu_operator.api.formats import dns_name
from gpu_operator.api.policy import PolicyError, describe_validation_error
from gpu_operator.api.status import Condition

GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
KIND = "ComputeDomain"
PLURAL = "computedomains"
API_VERSION = f"{GROUP}/{VERSION}"

# The DRA driver that prepares a domain's channels and daemons (ResourceSlice spec.driver),
# its opaque config kinds and the DeviceClasses its claim templates ask for.
DRIVER_NAME = "compute-domain.nvidia.com"
CHANNEL_CONFIG = "ComputeDomainChannelConfig"
DAEMON_CONFIG = "ComputeDomainDaemonConfig"
DAEMON_DEVICE_CLASS = "compute-domain-daemon.nvidia.com"
CHANNEL_DEVICE_CLASS = "compute-domain-default-channel.nvidia.com"

READY = "Ready"
NOT_READY = "NotReady"
SINGLE = "Single"
ALL = "All"

DomainState = Literal["Ready", "NotReady"]
AllocationMode = Literal["All", "Single"]

IMMUTABLE_SPEC = {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}


class ResourceClaimTemplateRef(ApiModel):
    name: str = Field(
        description="The ResourceClaimTemplate the operator creates in the domain's namespace; "
        "workload pods name it in spec.resourceClaims."
    )


class ChannelSpec(ApiModel):
    """The IMEX channel workloads of this domain claim."""

    resource_claim_template: ResourceClaimTemplateRef
    allocation_mode: AllocationMode = Field(
        default="Single",
        description="Single: one IMEX channel per claim; All: every channel of the IMEX domain.",
        json_schema_extra=crd_default("Single"),
    )


class ComputeDomainSpec(ApiModel):
    num_nodes: StrictInt = Field(
        default=0,
        ge=0,
        description="Deprecated. When above zero, the domain is Ready only once this many IMEX "
        "daemons are; it never holds a daemon or a workload back.",
        json_schema_extra=crd_default(0),
    )
    channel: ChannelSpec


class ComputeDomainNode(ApiModel):
    """One node's IMEX daemon, as NVIDIA's status lists it."""

    name: str
    ip_address: str
    clique_id: str = Field(alias="cliqueID")
    index: int | None = Field(
        default=None,
        description="The daemon's place in its clique (its DNS name there); -1 without a clique.",
    )
    status: DomainState | None = Field(default=None, json_schema_extra=crd_default("NotReady"))


class ComputeDomainStatus(ApiModel):
    status: DomainState = Field(
        default="NotReady",
        description="Ready once every listed daemon is (and, with numNodes, that many are).",
        json_schema_extra=crd_default("NotReady"),
    )
    nodes: list[ComputeDomainNode] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="gpu-operator addition: Ready, with the nodes whose daemon is not ready "
        "and why.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


@dataclass(frozen=True)
class ComputeDomain:
    """A whole ComputeDomain as the controller acts on it: where it lives and what it asks."""

    name: str
    namespace: str
    uid: str
    spec: ComputeDomainSpec
    deleting: bool = False

    @property
    def template_name(self) -> str:
        return self.spec.channel.resource_claim_template.name


def parse_computedomain_spec(spec: Mapping[str, Any] | None) -> ComputeDomainSpec:
    """Validate a ComputeDomain ``spec``; ``PolicyError`` names every bad field. The template
    name must be one the API server accepts for an object, since the operator creates it."""
    try:
        parsed = ComputeDomainSpec.model_validate(drop_nulls(dict(spec or {})))
    except ValidationError as exc:
        raise PolicyError(describe_validation_error(exc, kind=KIND)) from None
    name = parsed.channel.resource_claim_template.name
    try:
        dns_name(name)
    except ValueError as exc:
        field = "spec.channel.resourceClaimTemplate.name"
        raise PolicyError([f"{field}: {exc} (got {name!r})"]) from None
    return parsed


def parse_computedomain(doc: Mapping[str, Any]) -> ComputeDomain:
    """Validate a whole ComputeDomain object (apiVersion, kind, metadata, spec)."""
    problems = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: must be {API_VERSION} (got {doc.get('apiVersion')!r})")
    if doc.get("kind") != KIND:
        problems.append(f"kind: must be {KIND} (got {doc.get('kind')!r})")
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        problems.append("metadata.name: a ComputeDomain needs a name")
        meta = {}
    if problems:
        raise PolicyError(problems)
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise PolicyError(["spec: must be a mapping with spec.channel"])
    return ComputeDomain(
        name=str(meta["name"]),
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid") or ""),
        spec=parse_computedomain_spec(spec),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def channel_config(domain_id: str, allocation_mode: str) -> dict[str, Any]:
    """The opaque parameters of a domain's workload claims, exactly NVIDIA's: its plugin
    decodes them strictly, so nothing is added (the domain's namespace is not needed there:
    the uid names one domain, whose namespace the API server keeps, see :func:`claim_allowed`)."""
    return {
        "apiVersion": API_VERSION,
        "kind": CHANNEL_CONFIG,
        "domainID": domain_id,
        "allocationMode": allocation_mode,
    }


def daemon_config(domain_id: str) -> dict[str, Any]:
    """The opaque parameters of a domain's IMEX daemon claims, exactly NVIDIA's."""
    return {"apiVersion": API_VERSION, "kind": DAEMON_CONFIG, "domainID": domain_id}


def claim_configs(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A ResourceClaim's device configs for the compute-domain driver, as written in its spec
    and in its allocation."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    configs = [
        *(((claim.get("spec") or {}).get("devices") or {}).get("config") or ()),
        *((allocation.get("devices") or {}).get("config") or ()),
    ]
    return [c for c in configs if ((c or {}).get("opaque") or {}).get("driver") == DRIVER_NAME]


def claim_domain_id(claim: Mapping[str, Any], kind: str = CHANNEL_CONFIG) -> str | None:
    """The uid of the domain a ResourceClaim's ``kind`` config (a channel's, by default) names
    for the compute-domain driver, as written in its spec or its allocation; None if none."""
    for config in claim_configs(claim):
        params = config["opaque"].get("parameters") or {}
        if params.get("kind") == kind:
            domain = params.get("domainID")
            if isinstance(domain, str) and domain:
                return domain
    return None


def claim_allowed(domain: ComputeDomain | None, claim_namespace: str) -> str | None:
    """Why a channel claim in ``claim_namespace`` may not join ``domain`` (the domain its
    config's ``domainID`` names, None when no domain has that uid), or None when it may.

    A claim's config can be copied anywhere, so the uid alone proves nothing: a workload gets
    a domain's IMEX channel only from the domain's own namespace, as the template there gives
    it, and never from a domain on its way out (its daemons are about to go).
    """
    if domain is None:
        return (
            "no ComputeDomain has the claim's domainID: it was deleted, or the config was "
            "copied from another claim"
        )
    if claim_namespace != domain.namespace:
        return (
            f"ComputeDomain {domain.namespace}/{domain.name} serves claims in namespace "
            f"{domain.namespace} only; this claim is in {claim_namespace}"
        )
    if domain.deleting:
        return f"ComputeDomain {domain.namespace}/{domain.name} is being deleted"
    return None
