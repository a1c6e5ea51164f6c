"""Shared building blocks of the ClusterPolicy API models.

Every model speaks the camelCase wire format, refuses unknown keys (a misspelt key is an error,
not a silently ignored setting) and treats ``null`` as absent, as the apiserver does for
custom resources.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpu_operator.api import formats


def drop_nulls(value: Any) -> Any:
    """Remove ``None`` map values recursively, mirroring the apiserver's null pruning."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


class ApiModel(BaseModel):
    """Base for every spec/status model: camelCase aliases, strict keys, nulls ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=False,
        frozen=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _ignore_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def to_wire(self) -> dict[str, Any]:
        """The object as the API stores it: camelCase keys, only what was set."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


class OpenSection(ApiModel):
    """A section this project accepts and preserves but does not act on (yet)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )

    enabled: bool = False


def crd_default(value: Any) -> dict[str, Any]:
    """Marks a field whose default the CRD schema publishes (the apiserver then fills it in)."""
    return {"x-crd-default": value}


NonNegativeInt = Annotated[int, Field(ge=0)]


def _resource_quantity(value: int | str) -> int | str:
    formats.resource_quantity(value)
    return value


# A resource request or limit, kept as written; the CRD refuses a negative one (its pattern
# for text, its minimum for a number), so `kubectl apply` names the field.
Quantity = Annotated[
    int | str,
    AfterValidator(_resource_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": formats.NON_NEGATIVE_QUANTITY,
            "minimum": 0,
        }
    ),
]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]

# A count or a percent, e.g. 1, "1" or "25%", kept exactly as the user wrote it.
IntOrPercent = Annotated[
    int | str,
    AfterValidator(formats.int_or_percent),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": formats.INT_OR_PERCENT}),
]
# The same, where NVIDIA's schema has a string (a DaemonSet's rollingUpdate.maxUnavailable).
PercentText = Annotated[
    str,
    AfterValidator(formats.int_or_percent),
    WithJsonSchema({"type": "string", "pattern": formats.INT_OR_PERCENT}),
]


def _duration(value: str) -> str:
    formats.duration_seconds(value)
    return value


# A Go-style duration of hours, minutes and seconds ("90s", "5m", "1h30m"), kept as written.
Duration = Annotated[
    str, AfterValidator(_duration), WithJsonSchema({"type": "string", "pattern": formats.DURATION})
]


def duration_s(value: str) -> float:
    """Seconds in a :data:`Duration` (validated before it gets here)."""
    return formats.duration_seconds(value)


# The three parts of an image reference, each checked against the grammar the kubelet parses.
ImageRepository = Annotated[str, AfterValidator(formats.image_repository)]
ImageName = Annotated[str, AfterValidator(formats.image_name)]
ImageVersion = Annotated[str, AfterValidator(formats.image_version)]


class EnvVar(ApiModel):
    name: Annotated[str, StringConstraints(min_length=1)]
    value: str | None = None


class Resources(ApiModel):
    """A container's requests and limits; no request may be above its limit."""

    # (The docstring is the CRD's description. The API server refuses such a pod, so the
    # policy is refused instead; a limit alone also sets the request, which is then equal.)

    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for name, request in (self.requests or {}).items():
            limit = (self.limits or {}).get(name)
            if limit is None:
                continue
            if formats.quantity(request) > formats.quantity(limit):
                raise ValueError(
                    f"requests.{name} ({request}) is above limits.{name} ({limit}): lower the "
                    "request or raise the limit"
                )
        return self


class ImageRef(ApiModel):
    """Where an image comes from; missing parts are completed from the component's default."""

    repository: ImageRepository | None = Field(
        default=None, description="Registry and path, e.g. nvcr.io/nvidia."
    )
    image: ImageName | None = Field(default=None, description="Image name, or a full reference.")
    version: ImageVersion | None = Field(default=None, description="Tag, or a sha256:... digest.")
    image_pull_policy: PullPolicy | None = None
    image_pull_secrets: list[str] | None = None


class Component(ImageRef):
    """Fields every operand section shares."""

    enabled: bool = True
    resources: Resources | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    host_network: bool | None = None


class EnvOnly(ApiModel):
    env: list[EnvVar] | None = None


class ConfigRef(ApiModel):
    name: str | None = Field(
        default=None, description="Name of a ConfigMap in the operator namespace."
    )


class NamedConfig(ApiModel):
    """A ConfigMap of named configurations plus the one nodes use when they ask for none."""

    name: str | None = Field(
        default=None, description="Name of a ConfigMap in the operator namespace."
    )
    default: str | None = Field(
        default=None, description="Config used by nodes without a selection label."
    )


class Toleration(ApiModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = None
    toleration_seconds: int | None = None


class RelabelConfig(ApiModel):
    action: (
        Literal[
            "replace",
            "Replace",
            "keep",
            "Keep",
            "drop",
            "Drop",
            "hashmod",
            "HashMod",
            "labelmap",
            "LabelMap",
            "labeldrop",
            "LabelDrop",
            "labelkeep",
            "LabelKeep",
            "lowercase",
            "Lowercase",
            "uppercase",
            "Uppercase",
            "keepequal",
            "KeepEqual",
            "dropequal",
            "DropEqual",
        ]
        | None
    ) = Field(default=None, json_schema_extra=crd_default("replace"))
    modulus: int | None = None
    regex: str | None = None
    replacement: str | None = None
    separator: str | None = None
    source_labels: list[str] | None = None
    target_label: str | None = None


class ServiceMonitor(ApiModel):
    enabled: bool | None = None
    interval: str | None = None
    scrape_timeout: str | None = None
    honor_labels: bool | None = None
    additional_labels: dict[str, str] | None = None
    relabelings: list[RelabelConfig] | None = None


class Probe(ApiModel):
    initial_delay_seconds: NonNegativeInt | None = None
    timeout_seconds: NonNegativeInt | None = None
    period_seconds: NonNegativeInt | None = None
    success_threshold: NonNegativeInt | None = None
    failure_threshold: NonNegativeInt | None = None
