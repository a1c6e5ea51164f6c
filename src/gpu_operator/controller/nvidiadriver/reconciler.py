"""The NVIDIADriver loop's imperative shell: observe, decide (:mod:`.decide`), execute.

It runs beside the ClusterPolicy loop on the same stores (kopf's and the informer's): any
change wakes both, and each decides only about what it owns. Everything it must remember is in
the cluster (node pool labels, upgrade state labels, status), so a restarted operator carries
on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from gpu_operator.api import nvidiadriver as api
from gpu_operator.controller.nvidiadriver.decide import DRIVER_KINDS, DriverSnapshot, decide_drivers
from gpu_operator.controller.pools import with_written, written_pool
from gpu_operator.controller.runtime.actions import Patch, refused
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.execute import Executor
from gpu_operator.controller.runtime.loop import Loop, earliest
from gpu_operator.controller.runtime.metrics import PrometheusMetrics, count_tallies
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
    def __init__(self, kube: Kube, config: OperatorConfig, metrics: PrometheusMetrics) -> None:
        self.kube = kube
        self.config = config
        self.indexes: Mapping[str, Mapping[ObjectKey, Any]] = {}
        self.metrics = metrics
        self.executor = Executor(kube, config.write_concurrency, metrics)
        self.loop = Loop("nvidiadriver", self.run_pass, config, metrics)
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

    async def run_pass(self, resync: bool) -> float | None:
        snapshot = await self.observe()
        decision = decide_drivers(snapshot, self.config)
        outcomes = await self.executor.run(decision.stages)
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
        count_tallies(self.metrics, outcomes)
        not_done = refused(outcomes)
        if not_done:
            log.info("nvidiadriver pass: %d of %d actions refused", len(not_done), len(outcomes))
        elif outcomes:
            log.info("nvidiadriver pass wrote %d objects", len(outcomes))
        retry = self.loop.refusals.retry_at(bool(not_done), time.time())
        return earliest(decision.requeue_at, retry)

    async def observe(self) -> DriverSnapshot:
        nodes = tuple(self._read_own_writes(self._values("nodes")))
        drivers = tuple(self._values("nvidiadrivers"))
        pooled = [n for n in nodes if n.labels.get("nvidia.com/gpu.driver-pool")]
        listed = await asyncio.gather(
            *(
                self.executor.call(
                    self.kube.list_objects, "Pod", field_selector=f"spec.nodeName={name}"
                )
                for name in emptying_nodes(pooled)
            )
        )
        base = Snapshot(
            now=time.time(),
            stamp=now_iso(),
            policies=tuple(self._values("clusterpolicies")),
            nodes=nodes,
            daemonsets=tuple(self._values("daemonsets")),
            pods=tuple(self._values("pods")),
            revisions=tuple(self._values("controllerrevisions")),
            workload_pods=tuple(p for pods in listed for p in pods),
        )
        managed = owned_children(
            {k: self._values(KINDS[k].plural) for k in DRIVER_KINDS},
            (api.API_VERSION, api.KIND),
        )
        return DriverSnapshot(base, drivers, tuple(managed), self._configmap_keys())

    def _configmap_keys(self) -> dict[str, tuple[str, ...]]:
        """The keys of the operator namespace's ConfigMaps (repo, certs, kernel modules are
        mounted one file per key)."""
        return {
            cm["metadata"]["name"]: tuple(cm.get("keys") or ())
            for cm in self._values("configmaps")
            if cm["metadata"].get("namespace") == self.config.namespace
        }

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
        return list((self.indexes.get(index) or {}).values())
