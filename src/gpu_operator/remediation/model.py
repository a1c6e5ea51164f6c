"""Plain data for the health-remediation planner: the resolved policy, a node as the planner
sees it, and the node writes it asks for.

What the planner must remember lives on the Node (state label, entry time, whether the node was
cordoned and whether the taint is ours), so a restarted operator resumes where the last stopped
and never undoes what a person did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpu_operator.api.base import duration_s
from gpu_operator.api.spec import DrainSpec, HealthRemediationSpec, RemediationSpec
from gpu_operator.jsonpatch import map_ops, taint_ops
from gpu_operator.labels import (
    HEALTH_ACTION,
    HEALTH_EXTERNAL_LABEL,
    HEALTH_REASON,
    HEALTH_RESET_REQUESTED,
    HEALTH_SINCE,
    HEALTH_STATE,
    HEALTH_TAINTED,
    HEALTH_WAS_CORDONED,
    UNHEALTHY_TAINT,
    UPGRADE_WAS_CORDONED,
    is_true,
)
from gpu_operator.nodeops.operations import DeletePod, Event, Evict
from gpu_operator.nodeops.pods import Pod
from gpu_operator.selector import Selector
from gpu_operator.views import GpuHealth, NodeView

TAINT_VALUE = "quarantined"
REASON_MAX = 200  # of the condition message kept in the reason annotation


class Phase(StrEnum):
    """Values of ``HEALTH_STATE``: where a quarantined node is."""

    DRAINING = "draining"
    REMEDIATING = "remediating"
    QUARANTINED = "quarantined"  # emptied (or given up emptying); waits for GPUHealthy


@dataclass(frozen=True)
class HealthPolicy:
    """``healthRemediation`` with every default applied."""

    enabled: bool = False
    max_unavailable: int | str = "10%"
    recovery_delay_s: float = 300.0
    taint_effect: str = "NoSchedule"
    drain_enable: bool = False
    drain_force: bool = False
    drain_selector: Selector | None = None
    drain_timeout_s: int = 300
    drain_delete_empty_dir: bool = False
    actions: tuple[str, ...] = ()
    action_timeout_s: float = 600.0
    external_label: str = HEALTH_EXTERNAL_LABEL

    @classmethod
    def from_spec(cls, spec: HealthRemediationSpec | None) -> HealthPolicy:
        """Resolve the defaults; ValueError when the drain's pod selector cannot be parsed."""
        spec = spec or HealthRemediationSpec()
        drain = spec.drain or DrainSpec()
        remedy = spec.remediation or RemediationSpec()
        selector = drain.pod_selector
        return cls(
            enabled=spec.enabled,
            max_unavailable="10%" if spec.max_unavailable is None else spec.max_unavailable,
            recovery_delay_s=duration_s(spec.recovery_delay or "5m"),
            taint_effect=spec.taint_effect or "NoSchedule",
            drain_enable=bool(drain.enable),
            drain_force=bool(drain.force),
            drain_selector=Selector.parse(selector) if selector and selector.strip() else None,
            drain_timeout_s=300 if drain.timeout_seconds is None else drain.timeout_seconds,
            drain_delete_empty_dir=bool(drain.delete_empty_dir),
            actions=tuple(remedy.actions or ()),
            action_timeout_s=duration_s(remedy.timeout or "10m"),
            external_label=remedy.external_label or HEALTH_EXTERNAL_LABEL,
        )


@dataclass(frozen=True)
class HealthNode:
    """A GPU node with what the planner reads of it: its condition, its bookkeeping, its pods."""

    view: NodeView
    gpu_pods: tuple[Pod, ...] = ()  # running GPU pods (listed only for draining nodes)
    pods: tuple[Pod, ...] = ()  # every pod on it (the same)
    drivers: tuple[Pod, ...] = ()  # its driver pods
    upgrading: bool = False  # a driver upgrade holds the node cordoned right now
    # Its driver is being replaced: GPUs vanish and return with the driver, and the upgrade's
    # own validation judges the new one, so the node is not quarantined until that is over.
    mid_upgrade: bool = False
    # Written by the operator, and the watch has not shown the write yet: the node is left as
    # it is, and no new node is quarantined until it shows (the count could be stale).
    pending: bool = False

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def health(self) -> GpuHealth | None:
        return self.view.gpu_health

    @property
    def phase(self) -> Phase | None:
        value = self.view.labels.get(HEALTH_STATE)
        try:
            return Phase(value) if value else None
        except ValueError:
            return Phase.QUARANTINED  # an unknown value: hold the node, never release blind

    @property
    def since(self) -> float | None:
        try:
            value = float(self.view.annotations[HEALTH_SINCE])
        except (KeyError, ValueError):
            return None
        return value if math.isfinite(value) else None

    @property
    def action_index(self) -> int:
        try:
            return max(0, int(self.view.annotations.get(HEALTH_ACTION, "0")))
        except ValueError:
            return 0

    @property
    def was_cordoned(self) -> bool:
        """Unknown counts as cordoned: the quarantine never uncordons what it cannot prove it
        cordoned."""
        return (self.view.annotations.get(HEALTH_WAS_CORDONED) or "").strip().lower() != "false"

    @property
    def taint_is_ours(self) -> bool:
        return is_true(self.view.annotations.get(HEALTH_TAINTED))

    def our_taint(self) -> Mapping[str, Any] | None:
        return next(
            (t for t in self.view.taints if t.get("key") == UNHEALTHY_TAINT),
            None,
        )


# ---- node writes: each one JSON patch checked against the read it was planned from ----------


@dataclass(frozen=True)
class Quarantine:
    """Taint (unless a taint of that key is there already), cordon, and record it all."""

    node: NodeView
    effect: str
    reason: str
    since: int

    def patch(self) -> list[dict[str, Any]]:
        add_taint = not any(t.get("key") == UNHEALTHY_TAINT for t in self.node.taints)
        taints = list(self.node.taints)
        if add_taint:
            taints.append({"key": UNHEALTHY_TAINT, "value": TAINT_VALUE, "effect": self.effect})
        labels = {HEALTH_STATE: Phase.DRAINING.value}
        annotations: dict[str, str | None] = {
            HEALTH_SINCE: str(self.since),
            HEALTH_WAS_CORDONED: "true" if self.node.unschedulable else "false",
            HEALTH_TAINTED: "true" if add_taint else None,
            HEALTH_REASON: self.reason[:REASON_MAX],
            HEALTH_ACTION: None,
        }
        ops = [
            *map_ops("/metadata/labels", labels, self.node.labels),
            *map_ops("/metadata/annotations", annotations, self.node.annotations),
            *taint_ops(self.node.taints, taints),
        ]
        if not self.node.unschedulable:
            ops.append({"op": "add", "path": "/spec/unschedulable", "value": True})
        return ops


@dataclass(frozen=True)
class SetPhase:
    """Move to ``phase`` (recording when), with what starting the next action needs."""

    node: NodeView
    phase: Phase
    since: int
    action: int | None = None  # the remediation action index, when remediating
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)

    def patch(self) -> list[dict[str, Any]]:
        labels = {HEALTH_STATE: self.phase.value, **self.labels}
        annotations = {
            HEALTH_SINCE: str(self.since),
            HEALTH_ACTION: None if self.action is None else str(self.action),
            **self.annotations,
        }
        return [
            *map_ops("/metadata/labels", labels, self.node.labels),
            *map_ops("/metadata/annotations", annotations, self.node.annotations),
        ]


@dataclass(frozen=True)
class Release:
    """Lift the quarantine: only the taint the quarantine added, the cordon only if the node was
    not cordoned before (handed to a driver upgrade that holds the node now), and the
    bookkeeping."""

    node: NodeView
    external_label: str
    uncordon: bool
    hand_over_cordon: bool  # a driver upgrade now holds the cordon: it uncordons at its end

    def patch(self) -> list[dict[str, Any]]:
        ours = HealthNode(self.node)
        taints = [
            t
            for t in self.node.taints
            if not (ours.taint_is_ours and t.get("key") == UNHEALTHY_TAINT)
        ]
        labels: dict[str, str | None] = {HEALTH_STATE: None, self.external_label: None}
        annotations: dict[str, str | None] = {
            k: None
            for k in (
                HEALTH_SINCE,
                HEALTH_WAS_CORDONED,
                HEALTH_TAINTED,
                HEALTH_REASON,
                HEALTH_ACTION,
                HEALTH_RESET_REQUESTED,
            )
        }
        if self.hand_over_cordon:
            annotations[UPGRADE_WAS_CORDONED] = "false"
        ops = [
            *map_ops("/metadata/labels", labels, self.node.labels),
            *map_ops("/metadata/annotations", annotations, self.node.annotations),
            *taint_ops(self.node.taints, taints),
        ]
        if self.uncordon and self.node.unschedulable:
            ops.append({"op": "remove", "path": "/spec/unschedulable"})
        return ops


NodeWrite = Quarantine | SetPhase | Release
Action = NodeWrite | Evict | DeletePod | Event


@dataclass(frozen=True)
class Tally:
    """One count for ``gpu_operator_remediations_total``, made when ``write`` succeeds."""

    action: str  # quarantine, drain, restartDriver, resetGPU, external, recover
    outcome: str  # started, succeeded, failed, held


@dataclass(frozen=True)
class HealthSummary:
    enabled: bool = False
    unhealthy: int = 0  # GPU nodes whose GPUHealthy is False
    quarantined: int = 0  # nodes the remediation holds (before this pass's actions)
    limit: int = 0  # maxUnavailable scaled to the GPU nodes
    held: tuple[str, ...] = ()  # unhealthy nodes left in service by the limit
    line: str = ""


@dataclass(frozen=True)
class HealthPlan:
    actions: tuple[Action, ...]
    summary: HealthSummary
    tallies: Mapping[int, Tally] = field(default_factory=dict)  # action index -> its count
    next_deadline: float | None = None


def draining_nodes(nodes: Sequence[NodeView]) -> list[str]:
    """Nodes whose pods the planner needs to see this pass (it does not watch workloads)."""
    return [n.name for n in nodes if n.labels.get(HEALTH_STATE) == Phase.DRAINING.value]
