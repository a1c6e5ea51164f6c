"""The ComputeDomain loop's imperative shell: observe, decide (:mod:`.decide`), execute, remember.

It reads its own stores (:data:`WATCHED`, kept by an informer of its own process, see
:mod:`.process`): domains, claim templates and channel claims in every namespace, and the IMEX
daemons' DaemonSets, pods and nodes. A change to any of them wakes it; it never polls, except
that a teardown waiting for claim holders looks again now and then. The one read outside the
stores is the pods a deleted domain's claims are still reserved for (a handful, fetched only
while a domain waits for them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from gpu_operator.api import computedomain as cd
from gpu_operator.controller.computedomain.decide import (
    DomainDecision,
    DomainSnapshot,
    decide_domains,
)
from gpu_operator.controller.runtime.actions import Outcome, refused
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.execute import Executor
from gpu_operator.controller.runtime.loop import Loop
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.reconciler import run_pass
from gpu_operator.controller.runtime.watch import ObjectKey, Watched
from gpu_operator.events import now_iso
from gpu_operator.kinds import KINDS
from gpu_operator.kube import Kube
from gpu_operator.labels import COMPUTE_DOMAIN
from gpu_operator.render.computedomain import DaemonSettings

log = logging.getLogger(__name__)


def whole(body: Mapping[str, Any]) -> dict[str, Any]:
    """Kept as read: domains, their DaemonSets and daemon pods are few, and read whole."""
    return dict(body.items())


def channel_claim(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim as the loop reads it: its name, the compute-domain configs that say
    which domain it joins, and whom it is reserved for. Every other claim of the cluster (a
    GPU's, a NIC's) keeps its name only, so the store stays small on a large fleet."""
    meta = body.get("metadata") or {}
    kept: dict[str, Any] = {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    }
    if cd.claim_domain_id(body) is None:
        return kept
    kept["spec"] = {"devices": {"config": cd.claim_configs(body)}}
    reserved = (body.get("status") or {}).get("reservedFor")
    if reserved:
        kept["status"] = {"reservedFor": reserved}
    return kept


WATCHED: tuple[Watched, ...] = (
    # Its CRD may come after the controller (the operator installs it with the GPUCluster).
    Watched(KINDS["ComputeDomain"], optional=True, cluster_wide=True, keep=whole),
    Watched(KINDS["DaemonSet"], COMPUTE_DOMAIN, keep=whole),
    Watched(KINDS["Pod"], COMPUTE_DOMAIN, keep=whole),
    # All of them: a template of the name a domain asks for that is not its own is a conflict.
    Watched(KINDS["ResourceClaimTemplate"], cluster_wide=True),
    Watched(KINDS["ResourceClaim"], cluster_wide=True, keep=channel_claim),
    Watched(KINDS["Node"], COMPUTE_DOMAIN),
)


class ComputeDomainController:
    """The ComputeDomain loop's :class:`~gpu_operator.controller.runtime.reconciler.Reconciler`:
    it reads the stores, decides with :func:`.decide.decide_domains` and writes the decision's
    stages in order."""

    def __init__(
        self,
        kube: Kube,
        config: OperatorConfig,
        metrics: PrometheusMetrics,
        settings: DaemonSettings,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.indexes: Mapping[str, Mapping[ObjectKey, Any]] = {}
        self.executor = Executor(kube, config.write_concurrency, metrics)
        self.loop = Loop("computedomain", partial(run_pass, self), config, metrics)

    def watching(self, stores: Mapping[str, Mapping[ObjectKey, Any]]) -> None:
        """Read from ``stores`` (filled: the loop may start, with a pass at once)."""
        self.indexes = stores
        self.loop.ready.set()
        self.loop.urgent.set()
        self.loop.wake.set()

    def notify(self, watched: Watched, key: ObjectKey) -> None:
        """A domain changed: at once; anything else after the settling."""
        if watched.kind.kind == cd.KIND:
            self.loop.urgent.set()
        self.loop.wake.set()

    def _values(self, plural: str) -> list[Any]:
        return list((self.indexes.get(plural) or {}).values())

    async def observe(self, resync: bool) -> DomainSnapshot:
        domains = tuple(self._values("computedomains"))
        claims = tuple(self._values("resourceclaims"))
        return DomainSnapshot(
            now=time.time(),
            stamp=now_iso(),
            domains=domains,
            daemonsets=tuple(self._values("daemonsets")),
            daemon_pods=tuple(self._values("pods")),
            templates=tuple(self._values("resourceclaimtemplates")),
            claims=claims,
            pods=tuple(await asyncio.to_thread(self._holders, domains, claims)),
            nodes=tuple(self._values("nodes")),
        )

    def _holders(
        self, domains: tuple[Mapping[str, Any], ...], claims: tuple[Mapping[str, Any], ...]
    ) -> list[dict[str, Any]]:
        """The pods the channel claims of deleted domains are reserved for, read now (gone
        ones are left out: they hold nothing)."""
        leaving = {
            str(d["metadata"].get("uid") or "")
            for d in domains
            if d["metadata"].get("deletionTimestamp")
        }
        pods = []
        for claim in claims:
            if cd.claim_domain_id(claim) not in leaving:
                continue
            namespace = claim["metadata"].get("namespace")
            for ref in (claim.get("status") or {}).get("reservedFor") or ():
                if ref.get("resource") == "pods" and ref.get("name"):
                    pod = self.kube.get("Pod", ref["name"], namespace)
                    if pod is not None:
                        pods.append(pod)
        return pods

    def decide(self, snapshot: DomainSnapshot) -> DomainDecision:
        return decide_domains(snapshot, self.settings)

    async def execute(self, decision: DomainDecision) -> list[Outcome]:
        return await self.executor.run(decision.stages)

    def remember(self, decision: DomainDecision, outcomes: list[Outcome]) -> None:
        not_done = refused(outcomes)
        if not_done:
            log.info("computedomain pass: %d of %d writes refused", len(not_done), len(outcomes))
