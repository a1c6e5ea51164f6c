"""ClusterPolicy status from what was observed: state, conditions, per-component summary.

Pure: the same observations give the same status, and conditions keep their
``lastTransitionTime`` unless their status flips, so an unchanged world writes no status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.status import ERROR, NOT_IMPLEMENTED, READY
from gpu_operator.controller.conditions import UPGRADE_FAILED, condition, upgrade_failed
from gpu_operator.controller.readiness import DaemonSetReadiness


@dataclass(frozen=True)
class Observation:
    """Everything status depends on, gathered by the controller."""

    namespace: str
    generation: int
    gpu_nodes: int
    nfd_present: bool
    components: Mapping[str, Sequence[DaemonSetReadiness]] = field(default_factory=dict)
    problems: Sequence[str] = ()  # why the spec cannot be used; nothing was applied
    apply_error: str | None = None  # an API failure while applying
    unimplemented: Sequence[str] = ()
    ignored_because: str | None = None  # name of the active policy when this one is not
    upgrade: Mapping[str, Any] | None = None  # the driver upgrade summary
    health: Mapping[str, Any] | None = None  # the GPU health remediation summary
    dra_conflicts: Sequence[str] = ()  # nodes a GPUCluster's DRA stack also targets
    # Desired objects of an optional kind the cluster does not serve (no Prometheus operator).
    not_served: Sequence[str] = ()
    # GPU nodes whose nvidia.com/gpu.workload.config names no workload config: (node, why)
    workload_problems: Sequence[tuple[str, str]] = ()
    workload_moves: Sequence[tuple[str, str]] = ()  # (node, where its move is)


def compute_status(obs: Observation, previous: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The ClusterPolicy's status from one pass's observation, pure: state, per-component
    readiness, the upgrade's and health's summaries, and Ready/Error conditions whose
    transition times move only when their status does (so an unchanged status is an
    unchanged object, and no write)."""
    prev_conditions = previous.get("conditions") or []

    def cond(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return condition(prev_conditions, ctype, status, reason, message, now, obs.generation)

    if obs.ignored_because is not None:
        msg = f"ClusterPolicy {obs.ignored_because} is the active one; this one is ignored"
        return {
            "state": "ignored",
            "namespace": obs.namespace,
            "message": msg,
            "observedGeneration": obs.generation,
            "conditions": [
                cond(READY, "False", "Ignored", msg),
                cond(ERROR, "False", "Ignored", ""),
            ],
        }

    components = [
        {
            "name": name,
            "ready": all(d.ready for d in sets),
            "desired": sum(d.desired for d in sets),
            "available": sum(d.available for d in sets),
            "updated": sum(d.updated for d in sets),
            **(
                {"message": "; ".join(f"{d.name}: {d.message}" for d in sets if d.message)}
                if any(d.message for d in sets)
                else {}
            ),
        }
        for name, sets in obs.components.items()
    ]
    not_ready = [name for name, sets in obs.components.items() if not all(d.ready for d in sets)]

    if obs.problems:
        msg = "invalid spec, nothing applied: " + "; ".join(obs.problems)
        ready = cond(READY, "False", "ReconcileFailed", msg)
        error = cond(ERROR, "True", "ReconcileFailed", msg)
    elif obs.apply_error:
        ready = cond(READY, "False", "ReconcileFailed", obs.apply_error)
        error = cond(ERROR, "True", "ReconcileFailed", obs.apply_error)
    elif obs.gpu_nodes == 0:
        reason = "NoGPUNodes" if obs.nfd_present else "NFDLabelsMissing"
        msg = (
            "no node with an NVIDIA GPU was found"
            if obs.nfd_present
            else "no node carries Node Feature Discovery labels; deploy NFD or label GPU nodes "
            "nvidia.com/gpu.present=true"
        )
        ready = cond(READY, "False", reason, msg)
        error = cond(ERROR, "False", reason, "")
    elif not_ready:
        msg = "not ready: " + ", ".join(not_ready)
        ready = cond(READY, "False", "OperandNotReady", msg)
        error = cond(ERROR, "False", "OperandNotReady", "")
    else:
        ready = cond(
            READY, "True", "Reconciled", f"all components ready on {obs.gpu_nodes} GPU nodes"
        )
        error = cond(ERROR, "False", "Reconciled", "")

    conditions = [ready, error]
    if obs.unimplemented:
        conditions.append(
            cond(
                NOT_IMPLEMENTED,
                "True",
                "SectionsNotImplemented",
                "accepted but not acted on by this operator: " + ", ".join(obs.unimplemented),
            )
        )
    if obs.dra_conflicts:
        conditions.append(
            cond(
                "DRAConflict",
                "True",
                "DevicePluginAndDRA",
                "a GPUCluster also targets " + ", ".join(obs.dra_conflicts) + "; the device "
                "plugin keeps these nodes and DRA is not deployed there",
            )
        )
    if obs.not_served:
        conditions.append(
            cond(
                NOT_SERVED,
                "True",
                "PrometheusOperatorMissing",
                "dcgmExporter.serviceMonitor.enabled asks for "
                + ", ".join(obs.not_served)
                + ", but this cluster does not serve monitoring.coreos.com/v1 ServiceMonitor: "
                "install the Prometheus operator (its CRDs), or set "
                "dcgmExporter.serviceMonitor.enabled to false; the rest of the stack is applied",
            )
        )
    if obs.workload_problems:
        conditions.append(
            cond(
                WORKLOAD_CONFIG_INVALID,
                "True",
                "InvalidWorkloadConfig",
                workload_problems_message(obs.workload_problems),
            )
        )
    if obs.workload_moves:
        conditions.append(
            cond(
                WORKLOAD_MOVING,
                "True",
                "NodesMoving",
                "; ".join(f"node {node}: {where}" for node, where in sorted(obs.workload_moves)),
            )
        )
    failed = upgrade_failed(obs.upgrade)
    if failed is not None:
        conditions.append(cond(UPGRADE_FAILED, "True", "CanaryFailed", failed))
    status: dict[str, Any] = {
        "state": "ready" if ready["status"] == "True" else "notReady",
        "namespace": obs.namespace,
        "observedGeneration": obs.generation,
        "conditions": conditions,
        "components": components,
    }
    if obs.upgrade is not None:
        status["upgrade"] = dict(obs.upgrade)
    if obs.health is not None:
        status["healthRemediation"] = dict(obs.health)
    return status


NOT_SERVED = "ServiceMonitorNotServed"
WORKLOAD_CONFIG_INVALID = "WorkloadConfigInvalid"
WORKLOAD_MOVING = "WorkloadMoving"  # nodes cordoned while they change workload stacks


def workload_problems_message(problems: Sequence[tuple[str, str]]) -> str:
    """One line per node, in node order, as the WorkloadConfigInvalid condition says it."""
    return "; ".join(f"node {node}: {why}" for node, why in sorted(problems))
