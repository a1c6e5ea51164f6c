"""The GPUCluster loop's imperative shell: observe, decide (:mod:`.decide`), execute.

It runs on the generic :class:`~gpu_operator.controller.runtime.loop.Loop` over the shared
indexes: GPUClusters (watched as an optional kind, so the operator also runs where only the
ClusterPolicy CRD is installed or granted), Nodes, ClusterPolicies and DaemonSets. It passes when
one of them changes, and never polls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.api.gpucluster import KIND
from gpu_operator.controller.gpucluster.decide import (
    GpuClusterDecision,
    GpuClusterSnapshot,
    decide_gpucluster,
)
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.execute import api_reason
from gpu_operator.controller.runtime.loop import Loop
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.events import now_iso
from gpu_operator.jsonpatch import merge_patch_to
from gpu_operator.kube import Kube

log = logging.getLogger(__name__)


class GPUClusterController:
    """The shell: observe (read GPUClusters; the rest from ``indexes``), decide, execute."""

    def __init__(
        self,
        kube: Kube,
        config: OperatorConfig,
        metrics: PrometheusMetrics,
        values: Callable[[str], list[Any]],
        on_conflicts: Callable[[frozenset[str]], None],
    ) -> None:
        self.kube = kube
        self.config = config
        self.values = values
        self.on_conflicts = on_conflicts
        self.applied_hash: str | None = None
        self.reported: frozenset[str] = frozenset()
        self.conflicts: frozenset[str] = frozenset()
        self.loop = Loop("gpucluster", self.run_pass, config, metrics)

    async def run_pass(self, resync: bool) -> float | None:
        snap = GpuClusterSnapshot(
            stamp=now_iso(),
            clusters=tuple(self.values("gpuclusters")),
            policies=tuple(self.values("clusterpolicies")),
            nodes=tuple(self.values("nodes")),
            daemonsets=tuple(self.values("daemonsets")),
        )
        decision = decide_gpucluster(
            snap, self.config.namespace, self.config.operator_image, self.reported
        )
        refused = await asyncio.to_thread(self.execute, snap, decision)
        if decision.conflicts != self.conflicts:
            self.conflicts = decision.conflicts
            self.on_conflicts(decision.conflicts)
        return self.loop.refusals.retry_at(refused, time.time())  # else woken by the watches

    def execute(self, snap: GpuClusterSnapshot, decision: GpuClusterDecision) -> bool:
        """Whether an apply was refused (the rest raise, and the loop retries the pass)."""
        failed = 0
        if decision.applies and decision.applied_hash != self.applied_hash:
            for obj in sorted(decision.applies, key=lambda o: o["kind"] == "DaemonSet"):
                try:
                    self.kube.apply(obj)
                except ApiException as exc:  # logged; the retry tries again
                    failed += 1
                    log.warning(
                        "apply %s %s: %s", obj["kind"], obj["metadata"]["name"], api_reason(exc)
                    )
            if not failed:
                self.applied_hash = decision.applied_hash
        for name in decision.deletes:
            self.kube.delete("DaemonSet", name, self.config.namespace, propagation="Foreground")
        for node, labels in decision.labels.items():
            self.kube.merge_patch("Node", node, {"metadata": {"labels": dict(labels)}})
        for name, patch in decision.finalizers.items():
            try:
                self.kube.merge_patch(KIND, name, patch)
            except ApiException as exc:  # 409: changed since read; the next pass reads again
                if exc.status not in (404, 409):
                    raise
        by_name = {c["metadata"]["name"]: c for c in snap.clusters}
        for name, status in decision.statuses.items():
            current = (by_name.get(name) or {}).get("status") or {}
            if current != status:
                body = {"status": merge_patch_to(current, status)}
                self.kube.merge_patch(KIND, name, body, subresource="status")
        for event in decision.events:
            try:
                self.kube.create(event)
            except ApiException as exc:
                log.warning("could not record a conflict Event: %s", exc)
        self.reported = self.reported | {e["involvedObject"]["name"] for e in decision.events}
        return failed > 0
