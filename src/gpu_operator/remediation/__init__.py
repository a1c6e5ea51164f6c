"""GPU health remediation: quarantine, drain, remediate and release nodes whose ``GPUHealthy``
condition is False, within a blast-radius limit (pure; the ClusterPolicy loop executes it)."""

from gpu_operator.remediation.model import (
    HealthNode,
    HealthPlan,
    HealthPolicy,
    HealthSummary,
    Phase,
    Quarantine,
    Release,
    SetPhase,
    Tally,
    draining_nodes,
)
from gpu_operator.remediation.planner import plan_health

__all__ = [
    "HealthNode",
    "HealthPlan",
    "HealthPolicy",
    "HealthSummary",
    "Phase",
    "Quarantine",
    "Release",
    "SetPhase",
    "Tally",
    "draining_nodes",
    "plan_health",
]
