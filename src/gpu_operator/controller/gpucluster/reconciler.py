"""The GPUCluster loop's imperative shell: observe, decide (:mod:`.decide`), execute, remember.

It runs on the generic :class:`~gpu_operator.controller.runtime.loop.Loop` over the shared
indexes: GPUClusters (watched as an optional kind, so the operator also runs where only the
ClusterPolicy CRD is installed or granted), Nodes, ClusterPolicies and DaemonSets. It passes when
one of them changes, and polls only while a deleted GPUCluster waits for ComputeDomains (read,
not watched). It performs its decisions itself, in order in a worker thread, rather than as the
executor's stages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.api.gpucluster import KIND
from gpu_operator.controller.gpucluster.decide import (
    DRA_API,
    GpuClusterDecision,
    GpuClusterSnapshot,
    decide_gpucluster,
)
from gpu_operator.controller.runtime.actions import Apply, Outcome, refused
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.execute import api_reason
from gpu_operator.controller.runtime.loop import Loop
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.reconciler import run_pass
from gpu_operator.events import now_iso
from gpu_operator.kube import Kube

log = logging.getLogger(__name__)


class GPUClusterController:
    """The GPUCluster loop's :class:`~gpu_operator.controller.runtime.reconciler.Reconciler`:
    it reads GPUClusters and the rest from the shared indexes (``values``), decides with
    :func:`.decide.decide_gpucluster`, writes the decision, and tells the ClusterPolicy loop
    (``on_conflicts``) which nodes both stacks target."""

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
        self.loop = Loop("gpucluster", partial(run_pass, self), config, metrics)
        self.dra: tuple[bool, str] | None = None  # DRA's API served, the server's version

    async def observe(self, resync: bool) -> GpuClusterSnapshot:
        clusters = tuple(self.values("gpuclusters"))
        deleting = any(c["metadata"].get("deletionTimestamp") for c in clusters)
        if clusters and (self.dra is None or (resync and not self.dra[0])):
            self.dra = await asyncio.to_thread(self._dra_api)
        served, version = self.dra or (True, "")
        return GpuClusterSnapshot(
            stamp=now_iso(),
            clusters=clusters,
            policies=tuple(self.values("clusterpolicies")),
            nodes=tuple(self.values("nodes")),
            daemonsets=tuple(self.values("daemonsets")),
            domains=await asyncio.to_thread(self._domains) if deleting else (),
            now=time.time(),
            dra_served=served,
            server_version=version,
        )

    def _dra_api(self) -> tuple[bool, str]:
        """Whether the API server serves DRA's GA API, and its version: asked at the first
        pass with a GPUCluster, and while it is not served, again at each resync (a cluster
        upgraded under the operator); two reads, never per pass."""
        return self.kube.serves(DRA_API), self.kube.release()

    def _domains(self) -> tuple[str, ...]:
        """Every ComputeDomain, read while the GPUCluster is deleted (its teardown waits for
        them; nothing watches them here); none where their CRD is not served."""
        try:
            found = self.kube.list_objects("ComputeDomain")
        except ApiException as exc:
            if exc.status in (403, 404):
                return ()
            raise
        return tuple(
            sorted(f"{d['metadata'].get('namespace')}/{d['metadata']['name']}" for d in found)
        )

    def decide(self, snapshot: GpuClusterSnapshot) -> GpuClusterDecision:
        namespace, image = self.config.namespace, self.config.operator_image
        return decide_gpucluster(snapshot, namespace, image, self.reported)

    async def execute(self, decision: GpuClusterDecision) -> list[Outcome]:
        return await asyncio.to_thread(self._write, decision)

    def remember(self, decision: GpuClusterDecision, outcomes: list[Outcome]) -> None:
        self.reported = self.reported | {e["involvedObject"]["name"] for e in decision.events}
        if decision.conflicts != self.conflicts:
            self.conflicts = decision.conflicts
            self.on_conflicts(decision.conflicts)

    def _write(self, decision: GpuClusterDecision) -> list[Outcome]:
        """The decision's writes, in order, the finalizer first; an outcome per apply (a refused
        one is logged, and the loop retries it). A finalizer patch refused because the object
        is gone or changed waits for the next pass; any other refusal raises, and the loop
        retries the pass."""
        outcomes: list[Outcome] = []
        # The finalizer before anything it guards: a GPUCluster deleted while its stack was
        # being applied is still taken down in order.
        for name, patch in decision.finalizers.items():
            try:
                self.kube.merge_patch(KIND, name, patch)
            except ApiException as exc:  # 409: changed since read; the next pass reads again
                if exc.status not in (404, 409):
                    raise
        if decision.applies and decision.applied_hash != self.applied_hash:
            for obj in sorted(decision.applies, key=lambda o: o["kind"] == "DaemonSet"):
                try:
                    self.kube.apply(obj)
                except ApiException as exc:  # logged; the retry tries again
                    outcomes.append(Outcome(Apply(obj), exc.status or 0, api_reason(exc)))
                    log.warning(
                        "apply %s %s: %s", obj["kind"], obj["metadata"]["name"], api_reason(exc)
                    )
                else:
                    outcomes.append(Outcome(Apply(obj)))
            for kind, namespace, name in decision.removes:
                self.kube.delete(kind, name, namespace or None)  # False: already gone
            if not refused(outcomes):
                self.applied_hash = decision.applied_hash
        for name in decision.deletes:
            self.kube.delete("DaemonSet", name, self.config.namespace, propagation="Foreground")
        for node, labels in decision.labels.items():
            self.kube.merge_patch("Node", node, {"metadata": {"labels": dict(labels)}})
        for name, body in decision.status_patches.items():
            self.kube.merge_patch(KIND, name, body, subresource="status")
        for event in decision.events:
            try:
                self.kube.create(event)
            except ApiException as exc:
                log.warning("could not record a conflict Event: %s", exc)
        return outcomes
