"""The NVIDIADriver loop's imperative shell: observe, decide (:mod:`.decide`), execute, remember.

It runs beside the ClusterPolicy loop on the same stores (kopf's and the informer's): any
change wakes both, and each decides only about what it owns. Everything it must remember is in
the cluster (node pool labels, upgrade state labels, status), so a restarted operator carries
on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from gpu_operator.api import nvidiadriver as api
from gpu_operator.controller.nvidiadriver.decide import (
    DRIVER_KINDS,
    DriverDecision,
    DriverSnapshot,
    decide_drivers,
)
from gpu_operator.controller.pools import with_written, written_pool
from gpu_operator.controller.runtime.actions import Outcome, Patch, refused
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
from gpu_operator.render.driver import POOL_LABEL
from gpu_operator.upgrade import emptying_nodes
from gpu_operator.views import NodeView

log = logging.getLogger(__name__)

WRITE_SEEN_WITHIN_S = 30.0


class NVIDIADriverController:
    """The NVIDIADriver loop's :class:`~gpu_operator.controller.runtime.reconciler.Reconciler`:
    it reads the shared stores (with its own pool label writes the node watch does not show
    yet), decides with :func:`.decide.decide_drivers`, and keeps the pool labels written."""

    def __init__(self, kube: Kube, config: OperatorConfig, metrics: PrometheusMetrics) -> None:
        self.kube = kube
        self.config = config
        self.indexes: Mapping[str, Mapping[ObjectKey, Any]] = {}
        self.metrics = metrics
        self.executor = Executor(kube, config.write_concurrency, metrics)
        self.loop = Loop("nvidiadriver", partial(run_pass, self), config, metrics)
        # Pool labels written and not yet shown by the node watch: node -> (value, when).
        self.written: dict[str, tuple[str | None, float]] = {}

    def watching(self, stores: Mapping[str, Mapping[ObjectKey, Any]]) -> None:
        """Read from ``stores`` (filled: the loop may start, with a pass at once)."""
        self.indexes = stores
        self.loop.ready.set()
        self.loop.urgent.set()
        self.loop.wake.set()

    def notify(self, watched: Watched, key: ObjectKey) -> None:
        """Something the operator reads changed (never a mere heartbeat)."""
        if watched.kind.kind in URGENT_KINDS or moves_an_upgrade(self.indexes, watched, key):
            self.loop.urgent.set()
        self.loop.wake.set()

    # -- one pass ----------------------------------------------------------------------------

    async def observe(self, resync: bool) -> DriverSnapshot:
        nodes = tuple(self._read_own_writes(self._values("nodes")))
        drivers = tuple(self._values("nvidiadrivers"))
        pooled = [n for n in nodes if n.labels.get("nvidia.com/gpu.driver-pool")]
        workload_pods = await pods_on(self.executor, emptying_nodes(pooled))
        base = Snapshot(
            now=time.time(),
            stamp=now_iso(),
            policies=tuple(self._values("clusterpolicies")),
            nodes=nodes,
            daemonsets=tuple(self._values("daemonsets")),
            pods=tuple(self._values("pods")),
            revisions=tuple(self._values("controllerrevisions")),
            workload_pods=workload_pods,
        )
        managed = owned_children(
            {k: self._values(KINDS[k].plural) for k in DRIVER_KINDS},
            (api.API_VERSION, api.KIND),
        )
        keys = configmap_keys(self.indexes, self.config.namespace)
        return DriverSnapshot(base, drivers, tuple(managed), keys)

    def decide(self, snapshot: DriverSnapshot) -> DriverDecision:
        return decide_drivers(snapshot, self.config)

    async def execute(self, decision: DriverDecision) -> list[Outcome]:
        return await self.executor.run(decision.stages)

    def remember(self, decision: DriverDecision, outcomes: list[Outcome]) -> None:
        now = time.monotonic()
        for outcome in outcomes:
            action = outcome.action
            if (
                outcome.ok
                and isinstance(action, Patch)
                and action.kind == "Node"
                and isinstance(action.body, Mapping)
            ):
                writes, value = written_pool(action.body)
                if writes:
                    self.written[action.name] = (value, now)
        not_done = refused(outcomes)
        if not_done:
            log.info("nvidiadriver pass: %d of %d actions refused", len(not_done), len(outcomes))
        elif outcomes:
            log.info("nvidiadriver pass wrote %d objects", len(outcomes))

    # -- helpers -------------------------------------------------------------------------------

    def _read_own_writes(self, nodes: list[NodeView]) -> list[NodeView]:
        """The nodes with this loop's pool label writes that their watch does not show yet
        (forgotten once it does, or after ``WRITE_SEEN_WITHIN_S``: a watch that far behind
        is being re-listed)."""
        if not self.written:  # the steady state: no pass over the fleet for it
            return nodes
        now = time.monotonic()
        shown = {n.name: n.labels.get(POOL_LABEL) for n in nodes}
        self.written = {
            name: (value, at)
            for name, (value, at) in self.written.items()
            if name in shown and shown[name] != value and now - at < WRITE_SEEN_WITHIN_S
        }
        return with_written(nodes, {name: value for name, (value, _) in self.written.items()})

    def _values(self, index: str) -> list[Any]:
        return stored(self.indexes, index)
