"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

The holder renews every ``renew_seconds``; a candidate takes the Lease over only once it has
gone unrenewed for ``lease_seconds``. Updates carry the resourceVersion they read, so two
candidates racing for an expired Lease cannot both win.

The holder gives up on its own once no renewal has been confirmed for ``renew_deadline_s``
(shorter than the Lease), counted from the renew time it last wrote: so it stops acting before
any other replica can take the Lease over, even when the API server hangs (the event loop
judges at the deadline, whatever a renewal in flight is doing) or its network is cut. Lease
requests are never retried inside the client (a stale renewal must not land late); a refused
one (409: written meanwhile) is tried again soon, re-reading the Lease.

A renewal is one request (a patch carrying the resourceVersion of the holder's own last write;
only a 409 makes it read the Lease first), and renewals are spaced from the renew time written,
not from when its answer came: on a slow link (seconds per round trip) the holder then still
renews well within its deadline.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.controller.runtime.process import named_pool
from gpu_operator.kube import NO_RETRY, Kube

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
    """One acting replica: holds the Lease while renewals succeed, and stops acting before
    the Lease can expire (the renew deadline, two thirds of it) rather than after, so two
    replicas never both write. Released at once on shutdown, so the standby takes over
    without waiting the Lease out."""

    kube: Kube
    namespace: str
    identity: str
    name: str = "gpu-operator-leader"
    lease_seconds: int = 30
    renew_seconds: float = 10.0
    renew_deadline_s: float | None = None  # default: two thirds of the Lease

    def __post_init__(self) -> None:
        self.kube = self.kube.with_retry(NO_RETRY)
        if self.renew_deadline_s is None:
            self.renew_deadline_s = self.lease_seconds * 2 / 3
        self.renewed: datetime | None = None  # the renew time last written and confirmed
        # The Lease as this process last wrote it (resourceVersion, acquireTime, transitions).
        self._written: dict[str, Any] | None = None
        # Its own thread: behind the reconcilers' blocking calls in the loop's shared executor,
        # a renewal can wait out its deadline in the queue (seen with 2 s per request: every
        # worker thread busy, the Lease lost with the API server answering).
        self._thread = named_pool("lease", max_workers=1)

    async def _call_try(self) -> datetime | None:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._try)

    def _renew_blind(self, now: datetime) -> datetime | None:
        """Renew in one request, from the Lease as last written; None when it changed since."""
        written = self._written
        assert written is not None
        spec = written.get("spec") or {}
        patch = {
            "metadata": {"resourceVersion": written["metadata"]["resourceVersion"]},
            "spec": {**spec, "renewTime": _fmt(now)},
        }
        try:
            self._written = self.kube.merge_patch("Lease", self.name, patch, self.namespace)
            return now
        except ApiException as exc:
            if exc.status == 409:
                self._written = None
                return None
            raise

    def _try(self) -> datetime | None:
        """Take or renew the Lease: the renew time written, or None when another holds it."""
        now = _now()
        if self._written is not None and self._renew_blind(now) is not None:
            return now
        lease = self.kube.get("Lease", self.name, self.namespace)
        # The time written is the time of the write, not of the read before it: on a slow link
        # the read alone is a round trip, and the renew deadline counts from the time written
        # (taken before the read, a Lease acquired over 2 s round trips had 4 of its 6 s gone
        # and was lost at its first renewal).
        now = _now()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self._written = self.kube.create(body)
                return now
            except ApiException as exc:
                if exc.status == 409:
                    return None
                if exc.status == 404:
                    raise RuntimeError(
                        f"namespace {self.namespace!r} does not exist: create it "
                        f"(kubectl create namespace {self.namespace}) or pass --namespace"
                    ) from None
                raise
        spec = lease.get("spec") or {}
        if not lease_free(spec, self.identity, now):
            return None
        same = spec.get("holderIdentity") == self.identity
        acquired = _parse(spec.get("acquireTime")) if same else now
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if same else 1)
        patch = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": self._spec(acquired or now, now, transitions),
        }
        try:
            self._written = self.kube.merge_patch("Lease", self.name, patch, self.namespace)
            return now
        except ApiException as exc:
            if exc.status == 409:
                return None  # someone else wrote it first
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
        while True:
            try:
                self.renewed = await self._call_try()
            except RuntimeError:
                raise  # a missing namespace: nothing to wait for
            except Exception as exc:  # API trouble: a candidate just keeps asking
                log.warning("cannot read the Lease: %s", exc)
            if self.renewed is not None:
                break
            if not logged:
                log.info("waiting for leadership (Lease %s/%s)", self.namespace, self.name)
                logged = True
            await asyncio.sleep(self.renew_seconds / 2)
        log.info("leading as %s", self.identity)

    def remaining(self, now: datetime) -> float:
        """Seconds left before this holder must stop acting (<= 0: stop now)."""
        assert self.renewed is not None and self.renew_deadline_s is not None
        return (self.renewed - now).total_seconds() + self.renew_deadline_s

    async def hold(self) -> None:
        """Renew; return (leadership lost) once no renewal was confirmed within the deadline.

        The renewals run in the Lease's thread; the event loop only wakes at the deadline
        (by then a renewal has moved it on, and it sleeps again): 4 wake-ups a minute instead
        of 2 a renewal. The verdict stays the loop's, so a renewal stuck in a hung request
        still ends the leadership on time."""
        if self.renewed is None:
            self.renewed = _now()
        stop = threading.Event()
        renewing = asyncio.get_running_loop().run_in_executor(self._thread, self._renew, stop)
        try:
            while (left := self.remaining(_now())) > 0 and not renewing.done():
                await asyncio.wait([renewing], timeout=left)
        finally:
            stop.set()
        if renewing.done() and renewing.exception() is not None:
            log.error("lease renewals stopped: %r", renewing.exception())
        log.error(
            "leadership lost: no renewal confirmed for %.1fs (Lease %ss)",
            self.renew_deadline_s,
            self.lease_seconds,
        )

    async def hand_over(self) -> None:
        """:meth:`release`, in the Lease's thread: after a renewal still in flight when
        :meth:`hold` ended, never beside it (that renewal landing between the release's read
        and its write would refuse the release, and the Lease would stay taken a whole term)."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self.release)

    def _renew(self, stop: threading.Event) -> None:
        """In the Lease's thread: renew a period after the renew time last written, until
        ``stop`` or the deadline passes."""
        assert self.renewed is not None
        period = timedelta(seconds=self.renew_seconds)
        due = self.renewed + period
        while not stop.wait(max(0.0, (due - _now()).total_seconds())):
            if self.remaining(_now()) <= 0:
                return
            try:
                renewed = self._try()
            except Exception as exc:  # API trouble: try again soon, until the deadline
                log.warning("lease renewal failed: %s", exc)
                renewed = None
            if renewed is not None:
                took = (_now() - renewed).total_seconds()
                assert self.renew_deadline_s is not None
                if took > self.renew_deadline_s / 2:  # what an operator wants to hear first
                    log.warning(
                        "lease renewal took %.1fs of its %.1fs deadline (a slow API server or a "
                        "starved process: leadership is lost past the deadline)",
                        took,
                        self.renew_deadline_s,
                    )
                self.renewed = renewed
                due = renewed + period
            else:
                due = _now() + period / 4  # refused or failed: re-read and try soon

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


async def acquire_unless_stopped(elector: LeaderElector, stop: asyncio.Event) -> bool:
    """Wait for the Lease or for ``stop``: whether the Lease came first. An error while
    acquiring is raised: a replica never acts without the Lease."""
    acquire = asyncio.create_task(elector.acquire())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({acquire, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not acquire.done():
        acquire.cancel()
        return False
    acquire.result()
    return True
