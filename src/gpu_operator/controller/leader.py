"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

The holder renews every ``renew_seconds``; a candidate takes the Lease over only once it has
gone unrenewed for ``lease_seconds``. Updates carry the resourceVersion they read, so two
candidates racing for an expired Lease cannot both win.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.kube import Kube

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value.replace("Z", ""), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)


def lease_free(spec: dict[str, Any], identity: str, now: datetime) -> bool:
    """Whether ``identity`` may take the Lease: it holds it, nobody does, or it expired."""
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = int(spec.get("leaseDurationSeconds") or 0)
    return renewed is None or now > renewed + timedelta(seconds=duration)


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    identity: str
    name: str = "gpu-operator-leader"
    lease_seconds: int = 30
    renew_seconds: float = 10.0

    def _try(self) -> bool:
        now = _now()
        lease = self.kube.get("Lease", self.name, self.namespace)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self.kube.create(body)
                return True
            except ApiException as exc:
                if exc.status == 409:
                    return False
                if exc.status == 404:
                    raise RuntimeError(
                        f"namespace {self.namespace!r} does not exist: create it "
                        f"(kubectl create namespace {self.namespace}) or pass --namespace"
                    ) from None
                raise
        spec = lease.get("spec") or {}
        if not lease_free(spec, self.identity, now):
            return False
        same = spec.get("holderIdentity") == self.identity
        acquired = _parse(spec.get("acquireTime")) if same else now
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if same else 1)
        patch = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": self._spec(acquired or now, now, transitions),
        }
        try:
            self.kube.merge_patch("Lease", self.name, patch, self.namespace)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False  # someone else wrote it first
            raise

    def _spec(self, acquired: datetime, renewed: datetime, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "acquireTime": _fmt(acquired),
            "renewTime": _fmt(renewed),
            "leaseTransitions": transitions,
        }

    async def acquire(self) -> None:
        """Wait until this process holds the Lease."""
        logged = False
        while not await asyncio.to_thread(self._try):
            if not logged:
                log.info("waiting for leadership (Lease %s/%s)", self.namespace, self.name)
                logged = True
            await asyncio.sleep(self.renew_seconds / 2)
        log.info("leading as %s", self.identity)

    async def hold(self) -> None:
        """Renew until renewal has failed for a whole lease period; then return (lost)."""
        last_ok = _now()
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if await asyncio.to_thread(self._try):
                    last_ok = _now()
                    continue
            except Exception as exc:  # transient API trouble: keep trying until the lease ends
                log.warning("lease renewal failed: %s", exc)
            if _now() - last_ok > timedelta(seconds=self.lease_seconds):
                log.error("leadership lost")
                return

    def release(self) -> None:
        """Hand the Lease over at once on a graceful shutdown."""
        lease = self.kube.get("Lease", self.name, self.namespace)
        if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
            patch = {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
            }
            try:
                self.kube.merge_patch("Lease", self.name, patch, self.namespace)
            except ApiException as exc:
                log.warning("could not release the lease: %s", exc)
