"""Plain data for the driver-upgrade planner: the observed fleet, the resolved policy, the actions.

Everything the planner needs is read from the cluster each pass and everything it must remember
is written back to the Node (state label, entry-time and was-cordoned annotations), so a
restarted operator continues exactly where the last one stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from gpu_operator.api.spec import (
    DrainSpec,
    PodDeletionSpec,
    UpgradePolicy,
    WaitForCompletionSpec,
)
from gpu_operator.labels import (
    HEALTH_STATE,
    UPGRADE_FAILED_TEMPLATE,
    UPGRADE_REQUESTED,
    UPGRADE_SINCE,
    UPGRADE_SKIP,
    UPGRADE_STATE,
    UPGRADE_WAS_CORDONED,
    is_true,
)
from gpu_operator.nodeops.operations import Cordon, DeletePod, Event, Evict, Uncordon
from gpu_operator.nodeops.pods import Pod
from gpu_operator.selector import Selector
from gpu_operator.views import NodeView

_T = TypeVar("_T")


class State(StrEnum):
    """Values of ``UPGRADE_STATE``, spelled as NVIDIA's operator spells them."""

    UNKNOWN = ""
    DONE = "upgrade-done"
    REQUIRED = "upgrade-required"
    CORDON = "cordon-required"
    WAIT_FOR_JOBS = "wait-for-jobs-required"
    POD_DELETION = "pod-deletion-required"
    DRAIN = "drain-required"
    POD_RESTART = "pod-restart-required"
    VALIDATION = "validation-required"
    UNCORDON = "uncordon-required"
    FAILED = "upgrade-failed"


# States that hold one of the maxParallelUpgrades slots.
IN_PROGRESS = frozenset(
    {
        State.CORDON,
        State.WAIT_FOR_JOBS,
        State.POD_DELETION,
        State.DRAIN,
        State.POD_RESTART,
        State.VALIDATION,
        State.UNCORDON,
    }
)


# States in which the planner looks at the workload pods on a node. The operator does not
# watch workload namespaces, so it lists those pods only for such nodes, and looks again this
# often while they empty.
EMPTYING = frozenset({State.WAIT_FOR_JOBS, State.POD_DELETION, State.DRAIN})
EMPTYING_RECHECK_S = 3.0


def is_emptying(labels: Mapping[str, str]) -> bool:
    return labels.get(UPGRADE_STATE, "") in EMPTYING  # State is a StrEnum: equal to its value


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True

    @classmethod
    def from_k8s(cls, node: Mapping[str, Any]) -> Node:
        view = NodeView.from_k8s(node)
        return cls(view.name, view.labels, view.annotations, view.unschedulable, view.ready)

    @property
    def state_label(self) -> str:
        return self.labels.get(UPGRADE_STATE, "")

    @property
    def quarantined(self) -> bool:
        """Held by a GPU health quarantine, which owns the cordon while it lasts."""
        return bool(self.labels.get(HEALTH_STATE))

    @property
    def skipped(self) -> bool:
        return is_true(self.labels.get(UPGRADE_SKIP))

    @property
    def requested(self) -> bool:
        return is_true(self.annotations.get(UPGRADE_REQUESTED))

    @property
    def unavailable(self) -> bool:
        """Takes no new pods: cordoned by anyone, or NotReady."""
        return self.unschedulable or not self.ready

    @property
    def since(self) -> float | None:
        """When the node entered its current state, as recorded by the planner."""
        try:
            value = float(self.annotations[UPGRADE_SINCE])
        except (KeyError, ValueError):
            return None
        return value if math.isfinite(value) else None

    @property
    def failed_template(self) -> str:
        return self.annotations.get(UPGRADE_FAILED_TEMPLATE, "")

    @property
    def was_cordoned(self) -> bool | None:
        """Whether the node was cordoned before its upgrade began; None when not recorded."""
        value = (self.annotations.get(UPGRADE_WAS_CORDONED) or "").strip().lower()
        return {"true": True, "false": False}.get(value)


@dataclass(frozen=True)
class Fleet:
    """One observation of everything the upgrade depends on."""

    nodes: tuple[Node, ...]
    driver_pods: tuple[Pod, ...] = ()
    workload_pods: tuple[Pod, ...] = ()
    validator_pods: tuple[Pod, ...] = ()
    # driver DaemonSet name -> controller-revision-hash of its newest ControllerRevision
    newest_hash: Mapping[str, str] = field(default_factory=dict)
    # DaemonSets whose controller has not seen pods seen here (:func:`.fleet.unobserved`):
    # their pods are not deleted until it has.
    unobserved: frozenset[str] = frozenset()

    @classmethod
    def from_k8s(
        cls,
        nodes: Iterable[Mapping[str, Any]],
        driver_pods: Iterable[Mapping[str, Any]] = (),
        workload_pods: Iterable[Mapping[str, Any]] = (),
        validator_pods: Iterable[Mapping[str, Any]] = (),
        newest_hash: Mapping[str, str] | None = None,
    ) -> Fleet:
        return cls(
            tuple(Node.from_k8s(n) for n in nodes),
            tuple(Pod.from_k8s(p) for p in driver_pods),
            tuple(Pod.from_k8s(p) for p in workload_pods),
            tuple(Pod.from_k8s(p) for p in validator_pods),
            dict(newest_hash or {}),
        )


def scaled_max_unavailable(value: int | str, managed: int) -> int:
    """A count, or a percent of the managed nodes rounded up (as Kubernetes scales maxUnavailable
    for a DaemonSet), so "25%" of 3 nodes still lets one node upgrade."""
    if isinstance(value, int):
        return max(0, value)
    text = value.strip()
    if text.endswith("%"):
        return math.ceil(int(text[:-1]) * managed / 100)
    return max(0, int(text))


@dataclass(frozen=True)
class Policy:
    """``upgradePolicy`` with every default applied; timeouts of 0 mean wait forever."""

    auto_upgrade: bool = False
    max_parallel_upgrades: int = 1  # 0: no limit
    max_unavailable: int | str = "25%"
    pod_deletion_force: bool = False
    pod_deletion_timeout_s: int = 300
    pod_deletion_delete_empty_dir: bool = False
    wait_selector: Selector | None = None  # None: do not wait for jobs
    wait_timeout_s: int = 0
    drain_enable: bool = False
    drain_force: bool = False
    drain_selector: Selector | None = None  # None: every pod
    drain_timeout_s: int = 300
    drain_delete_empty_dir: bool = False
    # Not in the CRD: the planner's own limits. NVIDIA has no restart timeout, which is how one
    # unschedulable driver pod stalls a whole fleet; 1800 s outlasts the default driver startup
    # probe (60 s + 120 x 10 s) plus an image pull.
    restart_timeout_s: int = 1800
    validation_timeout_s: int = 600
    max_driver_restarts: int = 10

    @classmethod
    def from_spec(cls, spec: UpgradePolicy | None) -> Policy:
        """Resolve the CRD defaults; ValueError when a pod selector cannot be parsed."""
        spec = spec or UpgradePolicy()
        deletion = spec.pod_deletion or PodDeletionSpec()
        wait = spec.wait_for_completion or WaitForCompletionSpec()
        drain = spec.drain or DrainSpec()

        def selector(text: str | None) -> Selector | None:
            return Selector.parse(text) if text and text.strip() else None

        def pick(value: _T | None, default: _T) -> _T:
            return default if value is None else value

        return cls(
            auto_upgrade=pick(spec.auto_upgrade, False),
            max_parallel_upgrades=pick(spec.max_parallel_upgrades, 1),
            max_unavailable="25%" if spec.max_unavailable is None else spec.max_unavailable,
            pod_deletion_force=pick(deletion.force, False),
            pod_deletion_timeout_s=pick(deletion.timeout_seconds, 300),
            pod_deletion_delete_empty_dir=pick(deletion.delete_empty_dir, False),
            wait_selector=selector(wait.pod_selector),
            wait_timeout_s=pick(wait.timeout_seconds, 0),
            drain_enable=pick(drain.enable, False),
            drain_force=pick(drain.force, False),
            drain_selector=selector(drain.pod_selector),
            drain_timeout_s=pick(drain.timeout_seconds, 300),
            drain_delete_empty_dir=pick(drain.delete_empty_dir, False),
        )


# ---- actions: a closed set; the executor applies them in order and reports nothing back ----
#
# Actions for one node are contiguous and ordered. When a node patch (SetState, Cordon,
# Uncordon, Fail) fails, the executor skips that node's remaining actions this pass; a failed
# Evict or DeletePod skips nothing (a PodDisruptionBudget refusal is just a pod still there).
# SetState and Fail are the upgrade's own; the rest are the shared node and pod operations
# (:mod:`gpu_operator.nodeops.operations`).


@dataclass(frozen=True)
class SetState:
    """Move a node to ``state``, recording when, in one patch (timeouts survive restarts)."""

    node: str
    state: State
    since: int
    reason: str = ""

    def patch(self) -> dict[str, Any]:
        annotations: dict[str, str | None] = {UPGRADE_SINCE: str(self.since)}
        if self.state is State.REQUIRED:
            annotations[UPGRADE_REQUESTED] = None  # consumed: asking again means a new run
            annotations[UPGRADE_FAILED_TEMPLATE] = None
        if self.state is State.DONE:
            annotations[UPGRADE_WAS_CORDONED] = None
        return {
            "metadata": {"labels": {UPGRADE_STATE: self.state.value}, "annotations": annotations}
        }


@dataclass(frozen=True)
class Fail:
    """``SetState(upgrade-failed)`` plus a Warning Event carrying ``reason``."""

    node: str
    reason: str
    since: int
    template: str = ""  # the driver template (revision hash) the node failed to reach

    def patch(self) -> dict[str, Any]:
        patch = SetState(self.node, State.FAILED, self.since, self.reason).patch()
        patch["metadata"]["annotations"][UPGRADE_FAILED_TEMPLATE] = self.template or None
        return patch


Action = SetState | Cordon | Uncordon | Evict | DeletePod | Fail | Event


@dataclass(frozen=True)
class Summary:
    total: int = 0  # managed nodes
    done: int = 0
    in_progress: int = 0
    failed: int = 0
    pending: int = 0  # need an upgrade that has not started
    unavailable: int = 0  # cordoned, NotReady or in progress, before this pass's actions
    budget_slots: int = 0  # new upgrades this pass may start (nodes already cordoned cost none)
    max_unavailable: int = 0  # maxUnavailable scaled to the managed nodes


@dataclass(frozen=True)
class UpgradePlan:
    actions: tuple[Action, ...]
    summary: Summary
    notes: tuple[str, ...] = ()
    line: str = ""  # one human line for status and the CLI
    # When to pass again even if nothing changes: the earliest timeout of a waiting node, or
    # soon while nodes empty (their pods are not watched); None when nothing is pending.
    next_deadline: float | None = None
