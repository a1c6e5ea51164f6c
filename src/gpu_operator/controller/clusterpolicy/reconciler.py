"""The ClusterPolicy loop's imperative shell: observe, decide, execute, remember.

Watch events (kopf's and the informer's alike) only mark what changed and wake the loop; each
pass (:func:`~gpu_operator.controller.runtime.reconciler.run_pass`) takes one snapshot of the
stores (plus the few reads decisions need), asks :func:`.decide.decide` for the actions,
performs them, and folds the outcomes into the memory the next pass decides with. All state
that must outlive the process is in the cluster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpu_operator.api import KIND
from gpu_operator.controller.clusterpolicy.decide import (
    APPLIED_KINDS,
    OPTIONAL_KINDS,
    Decision,
    Gauges,
)
from gpu_operator.controller.clusterpolicy.decide import decide as decide_policies
from gpu_operator.controller.clusterpolicy.memory import Memory
from gpu_operator.controller.clusterpolicy.memory import remember as remember_outcomes
from gpu_operator.controller.runtime.actions import Apply, Outcome, Prune, refused
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.execute import Executor
from gpu_operator.controller.runtime.loop import Loop
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.observe import configmap_keys, pods_on, stored
from gpu_operator.controller.runtime.reconciler import run_pass
from gpu_operator.controller.runtime.watch import ObjectKey, Watched, owned_children
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.controller.urgent import URGENT_KINDS, moves_an_upgrade
from gpu_operator.events import now_iso
from gpu_operator.kinds import KINDS
from gpu_operator.kube import Kube
from gpu_operator.remediation import draining_nodes
from gpu_operator.upgrade import emptying_nodes
from gpu_operator.workload_move import moving_nodes

log = logging.getLogger(__name__)


@dataclass
class Inbox:
    """What watch events said since the last pass."""

    look_at_all: bool = True
    changed_nodes: set[str] = field(default_factory=set)

    def take(self) -> frozenset[str] | None:
        """The changed nodes, or None when every node must be looked at; then empty."""
        changed = None if self.look_at_all else frozenset(self.changed_nodes)
        self.look_at_all = False
        self.changed_nodes = set()
        return changed


class ClusterPolicyController:
    """The ClusterPolicy loop's :class:`~gpu_operator.controller.runtime.reconciler.Reconciler`:
    it reads the shared stores, decides with :func:`.decide.decide`, and keeps what the
    outcomes teach the next pass (its :class:`Memory`, the nodes to look at again)."""

    def __init__(self, kube: Kube, config: OperatorConfig, metrics: PrometheusMetrics) -> None:
        self.kube = kube
        self.config = config
        self.metrics = metrics
        self.indexes: Mapping[str, Any] = {}
        self.inbox = Inbox()
        self._policy_marks: dict[ObjectKey, tuple[Any, ...]] = {}
        self.memory = Memory()
        self.executor = Executor(kube, config.write_concurrency, metrics)
        self.loop = Loop("clusterpolicy", partial(run_pass, self), config, metrics)
        self.dra_conflicts: frozenset[str] = frozenset()
        self.also_wake: list[Loop] = []  # other loops that decide from these indexes

    def set_dra_conflicts(self, nodes: frozenset[str]) -> None:
        """From the GPUCluster loop: nodes both stacks target (reported in status)."""
        self.dra_conflicts = nodes
        self.loop.wake.set()

    # -- fed by the watches ------------------------------------------------------------------

    def watching(self, stores: Mapping[str, Mapping[ObjectKey, Any]]) -> None:
        """Read from ``stores`` (filled: the loops may start, with a full pass at once)."""
        self.indexes = stores
        for loop in (self.loop, *self.also_wake):
            loop.ready.set()
            loop.urgent.set()
            loop.wake.set()

    def notify(self, watched: Watched, key: ObjectKey) -> None:
        """Something the operator reads changed (events that change nothing kept, such as
        heartbeats, never get here)."""
        if watched.kind.kind == "Node":
            self.inbox.changed_nodes.add(key[1])
        urgent = self._urgent(watched, key)
        for loop in (self.loop, *self.also_wake):
            if urgent:
                loop.urgent.set()
            loop.wake.set()

    def _urgent(self, watched: Watched, key: ObjectKey) -> bool:
        """Whether to act without letting a rollout settle: a node, a ConfigMap, or a policy
        whose spec, deletion or finalizers changed (not its status: the operator's own write)."""
        if watched.kind.kind != KIND:
            return watched.kind.kind in URGENT_KINDS or moves_an_upgrade(self.indexes, watched, key)
        meta = ((self.indexes.get(watched.index) or {}).get(key) or {}).get("metadata") or {}
        mark = (meta.get("generation"), meta.get("deletionTimestamp"), meta.get("finalizers"))
        if self._policy_marks.get(key) == mark:
            return False
        self._policy_marks[key] = mark
        return True

    # -- one pass ----------------------------------------------------------------------------

    async def observe(self, resync: bool) -> Snapshot:
        if resync:
            self.inbox.look_at_all = True
        nodes = tuple(self.values("nodes"))
        changed = self.inbox.take()
        emptying = sorted({*emptying_nodes(nodes), *draining_nodes(nodes), *moving_nodes(nodes)})
        workload_pods = await pods_on(self.executor, emptying)
        namespace = self.config.namespace
        return Snapshot(
            now=time.time(),
            stamp=now_iso(),
            policies=tuple(self.values("clusterpolicies")),
            nodes=nodes,
            changed_nodes=changed,
            configmap_hashes={
                cm["metadata"]["name"]: cm["hash"]
                for cm in self.values("configmaps")
                if cm["metadata"].get("namespace") == namespace
            },
            mps_configmaps=frozenset(
                cm["metadata"]["name"]
                for cm in self.values("configmaps")
                if cm["metadata"].get("namespace") == namespace and cm.get("mps")
            ),
            configmap_keys=configmap_keys(self.indexes, namespace),
            managed=tuple(
                owned_children(
                    {k: self.values(KINDS[k].plural) for k in APPLIED_KINDS | OPTIONAL_KINDS}
                )
            ),
            served_optional=frozenset(k for k in OPTIONAL_KINDS if KINDS[k].plural in self.indexes),
            daemonsets=tuple(self.values("daemonsets")),
            pods=tuple(self.values("pods")),
            revisions=tuple(self.values("controllerrevisions")),
            workload_pods=workload_pods,
            dra_conflicts=self.dra_conflicts,
        )

    def decide(self, snapshot: Snapshot) -> Decision:
        return decide_policies(snapshot, self.memory, self.config)

    async def execute(self, decision: Decision) -> list[Outcome]:
        return await self.executor.run(decision.stages)

    def remember(self, decision: Decision, outcomes: list[Outcome]) -> None:
        after = remember_outcomes(decision.memory, outcomes, reconciled=decision.reconciled)
        self.memory = after.memory
        self._set_gauges(decision.gauges)
        if after.look_again:
            self.loop.wake.set()
        if any(o.ok and isinstance(o.action, (Apply, Prune)) for o in outcomes):
            self.loop.urgent.set()  # see what the new objects do without waiting to settle
        self.inbox.changed_nodes |= after.retry_nodes  # the retry looks at them again
        _log_pass(decision, outcomes)

    # -- helpers -------------------------------------------------------------------------------

    def values(self, index: str) -> list[Any]:
        """What an index holds (for the loops that share these indexes)."""
        return stored(self.indexes, index)

    def _set_gauges(self, gauges: Gauges) -> None:
        m = self.metrics
        m.gpu_nodes.set(gauges.gpu_nodes)
        for name, ready in gauges.components_ready.items():
            m.component_ready.labels(name).set(1 if ready else 0)
        if gauges.policy_ready is not None:
            m.policy_ready.set(1 if gauges.policy_ready else 0)
        if gauges.upgrade is not None:
            s = gauges.upgrade
            for state, count in (
                ("done", s.done),
                ("in_progress", s.in_progress),
                ("failed", s.failed),
                ("pending", s.pending),
            ):
                m.upgrade_nodes.labels(state).set(count)
        if gauges.health is not None:
            h = gauges.health
            m.unhealthy_nodes.set(h.unhealthy)
            m.quarantined_nodes.set(h.quarantined)
            m.held_nodes.set(len(h.held))


def _log_pass(decision: Decision, outcomes: list[Outcome]) -> None:
    done = [o for o in outcomes if o.ok]
    if done:
        kinds: dict[str, int] = {}
        for o in done:
            name = type(o.action).__name__.lower()
            kinds[name] = kinds.get(name, 0) + 1
        log.info("pass wrote: %s", ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    not_done = refused(outcomes)
    if not_done:
        log.info("pass: %d of %d actions refused", len(not_done), len(decision.actions))
