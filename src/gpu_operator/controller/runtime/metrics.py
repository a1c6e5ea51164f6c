"""The operator's Prometheus metrics, on a registry of its own (several operators may share a
process in tests)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpu_operator.controller.runtime.actions import Outcome


@dataclass
class PrometheusMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter("gpu_operator_reconcile", "Reconcile passes run.", registry=r)
        self.reconcile_errors = Counter(
            "gpu_operator_reconcile_errors", "Reconcile passes that failed.", registry=r
        )
        self.reconcile_seconds = Histogram(
            "gpu_operator_reconcile_duration_seconds", "Time of one reconcile pass.", registry=r
        )
        self.writes = Counter(
            "gpu_operator_api_writes",
            "Write requests sent to the API server.",
            ["verb", "kind"],
            registry=r,
        )
        self.gpu_nodes = Gauge("gpu_operator_gpu_nodes", "Nodes with NVIDIA GPUs.", registry=r)
        self.component_ready = Gauge(
            "gpu_operator_component_ready",
            "1 when the component is ready everywhere.",
            ["component"],
            registry=r,
        )
        self.policy_ready = Gauge(
            "gpu_operator_clusterpolicy_ready",
            "1 when the active ClusterPolicy is ready.",
            registry=r,
        )
        self.upgrade_nodes = Gauge(
            "gpu_operator_driver_upgrade_nodes",
            "GPU nodes by driver upgrade progress.",
            ["state"],
            registry=r,
        )
        self.unhealthy_nodes = Gauge(
            "gpu_operator_unhealthy_nodes",
            "GPU nodes whose GPUHealthy condition is False.",
            registry=r,
        )
        self.quarantined_nodes = Gauge(
            "gpu_operator_quarantined_nodes",
            "GPU nodes the health remediation holds (tainted, cordoned).",
            registry=r,
        )
        self.held_nodes = Gauge(
            "gpu_operator_health_held_nodes",
            "Unhealthy GPU nodes left in service because maxUnavailable is reached.",
            registry=r,
        )
        self.remediations = Counter(
            "gpu_operator_remediations",
            "Health remediation steps taken, by action and outcome.",
            ["action", "outcome"],
            registry=r,
        )
        self.rollout_failures = Counter(
            "gpu_operator_driver_rollout_failures",
            "Driver rollouts stopped and rolled back by a failed canary gate, by gate.",
            ["gate"],
            registry=r,
        )
        self.leader = Gauge(
            "gpu_operator_leader",
            "1 while this replica holds the leader Lease and acts; 0 on a standby.",
            registry=r,
        )
        self.leading = False

    def set_leading(self, leading: bool) -> None:
        self.leading = leading
        self.leader.set(1 if leading else 0)

    @property
    def role(self) -> str:
        return "leader" if self.leading else "standby"


def count_tallies(metrics: PrometheusMetrics, outcomes: Iterable[Outcome]) -> None:
    """Count what the pass's successful writes tally (``(counter attribute, labels...)``)."""
    for outcome in outcomes:
        tally = getattr(outcome.action, "tally", None)
        if tally is not None and outcome.ok:
            getattr(metrics, tally[0]).labels(*tally[1:]).inc()
