"""The ClusterPolicy API (nvidia.com/v1) as pydantic models."""

from gpu_operator.api.policy import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    PolicyError,
    parse_document,
    parse_spec,
)
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import ClusterPolicyStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "ClusterPolicySpec",
    "ClusterPolicyStatus",
    "PolicyError",
    "parse_document",
    "parse_spec",
]
