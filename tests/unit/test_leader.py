"""Leader election: a holder that cannot confirm a renewal stops before anyone can take over;
a refused renewal (409) is tried again at once; a renewal is one request, so a slow link does
not cost the Lease. Against an in-memory Lease store."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.controller.leader import LeaderElector, _parse, lease_free


class Leases:
    """get/create/merge_patch of one Lease with resourceVersion checks; faults on demand."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.hang = threading.Event()  # set: requests block until released
        self.released = threading.Event()
        self.conflicts = 0  # answer the next N patches 409
        self.writes = 0
        self.requests = 0
        self.latency = 0.0  # seconds each request takes (a slow link)

    def with_retry(self, _: Any) -> Leases:
        return self

    def _wait(self) -> None:
        self.requests += 1
        if self.latency:
            time.sleep(self.latency)
        if self.hang.is_set():
            self.released.wait(30)

    def get(self, kind: str, name: str, namespace: str | None = None) -> Any:
        self._wait()
        return copy.deepcopy(self.obj)

    def create(self, body: dict[str, Any]) -> Any:
        self._wait()
        if self.obj is not None:
            raise ApiException(status=409)
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = "1"
        self.writes += 1
        return copy.deepcopy(self.obj)

    def merge_patch(self, kind: str, name: str, patch: Any, namespace: Any = None) -> Any:
        self._wait()
        assert self.obj is not None
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409)
        if patch["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        self.obj["spec"].update(patch["spec"])
        self.obj["metadata"]["resourceVersion"] = str(int(patch["metadata"]["resourceVersion"]) + 1)
        self.writes += 1
        return copy.deepcopy(self.obj)


LEASE = 4


def elector(store: Leases, identity: str) -> LeaderElector:
    return LeaderElector(
        store,  # type: ignore[arg-type]
        "ns",
        identity,
        lease_seconds=LEASE,
        renew_seconds=0.3,
        renew_deadline_s=2.0,
    )


def test_a_hung_api_server_makes_the_holder_stop_before_the_lease_can_move() -> None:
    store = Leases()
    a = elector(store, "a")

    async def scenario() -> tuple[datetime, dict[str, Any]]:
        await a.acquire()
        await asyncio.sleep(0.5)  # a renewal or two go through
        store.hang.set()
        await asyncio.wait_for(a.hold(), timeout=10)
        stopped = datetime.now(UTC)
        # The Lease as another candidate would read it when the holder stopped: the hung
        # request, once released, still lands and moves renewTime on (CI saw the test read
        # renewTime before that write and the expiry after it).
        assert store.obj is not None
        seen = copy.deepcopy(store.obj["spec"])
        store.released.set()  # let the hung request end (its answer comes too late)
        return stopped, seen

    stopped, spec = asyncio.run(scenario())
    renewed = _parse(spec["renewTime"])
    assert renewed is not None
    # The holder stopped while no other candidate could have taken the Lease yet.
    assert not lease_free(spec, "b", stopped)
    assert lease_free(spec, "b", renewed + timedelta(seconds=LEASE + 0.1))


def test_a_refused_renewal_is_tried_again_at_once() -> None:
    store = Leases()
    a = elector(store, "a")

    async def scenario() -> None:
        await a.acquire()
        store.conflicts = 3  # three renewals in a row answered 409
        hold = asyncio.create_task(a.hold())
        await asyncio.sleep(2.5)  # longer than the renew deadline
        assert not hold.done(), "leadership given up over refusals that were retried"
        hold.cancel()

    asyncio.run(scenario())
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "a"
    assert store.conflicts == 0


def test_a_standby_waits_and_takes_over_once_the_lease_expired() -> None:
    store = Leases()
    a, b = elector(store, "a"), elector(store, "b")

    async def scenario() -> None:
        await a.acquire()
        assert a._try() is not None and b._try() is None  # a renews; b cannot take it
        await asyncio.wait_for(b.acquire(), timeout=10)  # a stopped renewing: b after expiry

    asyncio.run(scenario())
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "b"
    assert store.obj["spec"]["leaseTransitions"] == 1


def test_a_renewal_is_one_request_and_a_slow_link_keeps_the_lease() -> None:
    """Round trips of 0.8 s against a 2 s renew deadline: reading before writing (two trips)
    would leave too little margin; one trip, spaced from the renew time written, holds."""
    store = Leases()
    a = elector(store, "a")

    async def scenario() -> None:
        await a.acquire()
        before = store.requests
        assert a._try() is not None
        assert store.requests - before == 1, "a renewal read the Lease first"
        store.latency = 0.8
        hold = asyncio.create_task(a.hold())
        await asyncio.sleep(5.0)  # two and a half renew deadlines
        assert not hold.done(), "leadership lost on a slow but working link"
        hold.cancel()

    asyncio.run(scenario())
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "a"


def test_a_holder_whose_lease_was_written_by_another_reads_it_and_stops_renewing() -> None:
    store = Leases()
    a, b = elector(store, "a"), elector(store, "b")

    async def scenario() -> None:
        await a.acquire()
        assert store.obj is not None
        # Someone else took the Lease (it expired while a was cut off, say).
        store.obj["spec"]["holderIdentity"] = "b"
        store.obj["metadata"]["resourceVersion"] = "99"
        assert a._try() is None, "a blind renewal overwrote another holder"
        assert b._try() is not None

    asyncio.run(scenario())
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "b"
