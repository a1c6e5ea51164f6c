"""ClusterPolicy ``status``: NVIDIA's fields plus per-component and upgrade summaries."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gpu_operator.api.base import ApiModel

State = Literal["ready", "notReady", "ignored"]

# Condition types and reasons, spelled as NVIDIA's operator spells them.
READY = "Ready"
ERROR = "Error"
NOT_IMPLEMENTED = "NotImplemented"


class Condition(ApiModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", min_length=1, max_length=1024
    )
    message: str = Field(default="", max_length=32768)
    last_transition_time: str
    observed_generation: int | None = Field(default=None, ge=0)


class ComponentStatus(ApiModel):
    """One operand as observed: how many of its pods are where they should be."""

    name: str
    ready: bool
    desired: int = 0
    available: int = 0
    updated: int = 0
    message: str | None = None


class RolloutFailure(ApiModel):
    node: str
    gate: str  # driver, validation, GPUHealthy, timeout
    reason: str


class Rollout(ApiModel):
    """A canary-gated driver rollout (gpu-operator addition), kept here so that a restarted
    operator resumes it: what is rolled out, the settings it falls back to, where it is."""

    phase: Literal["canary", "soaking", "fleet", "rollingBack", "held", "done"]
    target: str  # digest of the driver settings being rolled out
    stable: str = ""  # digest of the last settings every node ran
    stable_spec: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    nodes: list[str] | None = None  # the canary
    since: str | None = None  # when the phase began (RFC 3339)
    failure: RolloutFailure | None = None


class UpgradeSummary(ApiModel):
    """Driver upgrade progress across the GPU nodes the upgrade manages."""

    total: int = 0
    done: int = 0
    in_progress: int = 0
    failed: int = 0
    pending: int = 0
    message: str | None = None
    rollout: Rollout | None = None


class HealthRemediationSummary(ApiModel):
    """GPU health remediation across the GPU nodes (gpu-operator addition)."""

    enabled: bool = False
    unhealthy: int = 0
    quarantined: int = 0
    limit: int = 0
    held: list[str] | None = None
    message: str | None = None


class ClusterPolicyStatus(ApiModel):
    state: State | None = None
    namespace: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] | None = None
    components: list[ComponentStatus] | None = None
    upgrade: UpgradeSummary | None = None
    health_remediation: HealthRemediationSummary | None = None
