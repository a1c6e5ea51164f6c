"""Leader election on a Lease: who may take it, renewing, losing and handing it over; a holder
that cannot confirm a renewal stops before anyone can take over; a refused renewal (409) is
tried again at once; a renewal is one request, so a slow link does not cost the Lease."""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_operator.controller.runtime.leader import LeaderElector, _fmt, _now, _parse, lease_free
from tests.fakes.kube import Call, FakeKube
from tests.unit.controller.builders import NAMESPACE

T0 = datetime(2024, 1, 15, 8, 0, 0, tzinfo=UTC)  # long past: a Lease renewed then expired
LEASE = "gpu-operator-leader"


def lease(
    holder: str | None, renewed: datetime | None = None, duration: int = 30, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": duration, **spec}
    if renewed is not None:
        body["renewTime"] = _fmt(renewed)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": NAMESPACE},
        "spec": body,
    }


def elector(kube: FakeKube, identity: str = "me", **kw: Any) -> LeaderElector:
    return LeaderElector(kube, NAMESPACE, identity, **kw)


def spec_of(kube: FakeKube) -> dict[str, Any]:
    obj = kube.obj("Lease", LEASE, NAMESPACE)
    assert obj is not None
    spec: dict[str, Any] = obj["spec"]
    return spec


@pytest.mark.parametrize(
    ("spec", "now", "free"),
    [
        ({}, T0, True),  # nobody holds it
        ({"holderIdentity": "me", "renewTime": _fmt(T0)}, T0, True),  # I do
        ({"holderIdentity": "other", "renewTime": _fmt(T0), "leaseDurationSeconds": 30},
         T0 + timedelta(seconds=29), False),
        ({"holderIdentity": "other", "renewTime": _fmt(T0), "leaseDurationSeconds": 30},
         T0 + timedelta(seconds=31), True),  # expired
        ({"holderIdentity": "other", "acquireTime": _fmt(T0), "leaseDurationSeconds": 30},
         T0 + timedelta(seconds=10), False),  # never renewed: acquired counts
        ({"holderIdentity": "other"}, T0, True),  # no time at all: cannot be live
    ],
)  # fmt: skip
def test_lease_free(spec: dict[str, Any], now: datetime, free: bool) -> None:
    assert lease_free(spec, "me", now) is free


def test_times_round_trip() -> None:
    assert _parse(_fmt(T0)) == T0
    assert _parse(None) is None and _parse("") is None


def test_the_first_candidate_creates_the_lease() -> None:
    kube = FakeKube()
    assert elector(kube, lease_seconds=15)._try()
    spec = spec_of(kube)
    assert spec["holderIdentity"] == "me"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0


def test_a_live_lease_of_another_is_not_taken() -> None:
    kube = FakeKube().add(lease("other", datetime.now(UTC)))
    assert not elector(kube)._try()
    assert kube.writes == []


def test_an_expired_lease_is_taken_over_and_counted() -> None:
    kube = FakeKube().add(lease("other", T0, leaseTransitions=4))
    assert elector(kube)._try()
    spec = spec_of(kube)
    assert spec["holderIdentity"] == "me" and spec["leaseTransitions"] == 5


def test_renewing_keeps_the_acquire_time() -> None:
    kube = FakeKube().add(lease("me", T0, acquireTime=_fmt(T0), leaseTransitions=2))
    assert elector(kube)._try()
    spec = spec_of(kube)
    assert spec["acquireTime"] == _fmt(T0)
    assert spec["renewTime"] != _fmt(T0)
    assert spec["leaseTransitions"] == 2


@pytest.mark.parametrize(("verb", "status"), [("create", 409), ("patch", 409)])
def test_losing_a_race_is_not_an_error(verb: str, status: int) -> None:
    kube = FakeKube()
    if verb == "patch":
        kube.add(lease("other", T0))
    kube.refuse(verb, "Lease", status=status)
    assert not elector(kube)._try()


def test_a_missing_namespace_is_named_with_the_fix() -> None:
    kube = FakeKube().refuse("create", "Lease", status=404)
    with pytest.raises(RuntimeError, match="kubectl create namespace gpu-operator"):
        elector(kube)._try()


@pytest.mark.parametrize("verb", ["create", "patch", "get"])
def test_other_api_errors_surface(verb: str) -> None:
    kube = FakeKube()
    if verb == "patch":
        kube.add(lease("other", T0))
    kube.refuse(verb, "Lease", status=403)
    with pytest.raises(ApiException):
        elector(kube)._try()


def test_acquire_waits_until_the_holder_lets_go(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube().add(lease("other", datetime.now(UTC)))
    candidate = elector(kube, renew_seconds=0.01)

    async def scenario() -> None:
        waiting = asyncio.create_task(candidate.acquire())
        while not any("waiting for leadership" in r.message for r in caplog.records):
            await asyncio.sleep(0.001)  # until the candidate has tried once
        elector(kube, "other").release()
        await asyncio.wait_for(waiting, timeout=30)

    with caplog.at_level(logging.INFO, "gpu_operator.controller.runtime.leader"):
        asyncio.run(scenario())
    assert spec_of(kube)["holderIdentity"] == "me"


def test_hold_returns_once_renewal_failed_for_a_whole_lease() -> None:
    kube = FakeKube().refuse("get", "Lease", status=500)
    leader = elector(kube, lease_seconds=0, renew_seconds=0)
    asyncio.run(asyncio.wait_for(leader.hold(), timeout=30))


def test_hold_keeps_leading_through_refused_renewals_within_the_lease() -> None:
    kube = FakeKube()
    leader = elector(kube, lease_seconds=3600, renew_seconds=0)
    assert leader._try()
    kube.refuse("patch", "Lease", status=500, times=2)

    async def scenario() -> bool:
        holding = asyncio.create_task(leader.hold())
        while sum(1 for w in kube.writes if w[0] == "patch") < 2:  # renewed twice since
            assert not holding.done()
            await asyncio.sleep(0.001)
        lost = holding.done()
        holding.cancel()
        return lost

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=30)) is False
    assert not kube.refusals  # both refusals were met and outlived


def test_renewals_do_not_queue_behind_the_reconcilers_blocking_calls() -> None:
    """Every worker of the loop's shared executor busy with a slow API call (a slow link, seen
    in a chaos run: the Lease lost while the API server answered): renewals still go out."""
    kube = FakeKube()
    leader = elector(kube, lease_seconds=3, renew_seconds=0.1)  # deadline 2 s
    assert leader._try()
    release = threading.Event()

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        busy = [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]
        holding = asyncio.create_task(leader.hold())
        before = sum(1 for w in kube.writes if w[0] == "patch")
        await asyncio.sleep(3)  # past the deadline: only renewals keep it
        lost = holding.done()
        holding.cancel()
        release.set()
        await asyncio.gather(*busy)
        assert not lost, "leadership lost with the executor busy"
        return sum(1 for w in kube.writes if w[0] == "patch") - before

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=30)) >= 10


def test_renewals_go_on_while_the_event_loop_is_busy() -> None:
    """The Lease's thread renews on its own: a pass that holds the event loop (a full pass at
    5,000 nodes takes 0.5 s) does not delay a renewal, and the loop is not woken for each."""
    kube = FakeKube()
    leader = elector(kube, lease_seconds=30, renew_seconds=0.05)
    assert leader._try()

    def patches() -> int:
        return sum(1 for w in kube.writes if w[0] == "patch")

    async def scenario() -> int:
        holding = asyncio.create_task(leader.hold())
        await asyncio.sleep(0.01)  # hold has started the thread
        before = patches()
        time.sleep(1.0)  # the loop blocked, as by a long synchronous pass
        during = patches() - before
        holding.cancel()
        return during

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=30)) >= 10


def test_the_renew_time_written_is_taken_after_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A take-over reads the Lease, then writes it: on a slow link the read is a round trip,
    which must not come off the renew deadline (a chaos run lost a Lease just acquired)."""
    clock = {"now": T0 + timedelta(days=1)}
    monkeypatch.setattr("gpu_operator.controller.runtime.leader._now", lambda: clock["now"])
    kube = FakeKube()
    kube.create(lease("other", T0))  # expired long ago
    reading = kube.get

    def slow_get(*args: Any, **kw: Any) -> Any:
        clock["now"] += timedelta(seconds=2)  # the read's round trip
        return reading(*args, **kw)

    kube.get = slow_get  # type: ignore[method-assign]
    leader = elector(kube, lease_seconds=9)
    start = clock["now"]
    leader.renewed = leader._try()
    assert leader.renewed == start + timedelta(seconds=2)
    assert _parse(spec_of(kube)["renewTime"]) == start + timedelta(seconds=2)
    assert leader.remaining(clock["now"]) == pytest.approx(6.0)  # the whole deadline left


def test_release_hands_the_lease_over() -> None:
    kube = FakeKube()
    leader = elector(kube)
    assert leader._try()
    leader.release()
    spec = spec_of(kube)
    assert spec.get("holderIdentity") is None
    assert spec["leaseDurationSeconds"] == 1
    assert elector(kube, "next")._try()


def test_release_leaves_another_holders_lease_alone() -> None:
    kube = FakeKube().add(lease("other", T0))
    elector(kube).release()
    assert kube.writes == []
    elector(FakeKube()).release()  # no Lease at all: nothing to do


def test_a_failed_release_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    leader = elector(kube)
    assert leader._try()
    kube.refuse("patch", "Lease", status=500)
    with caplog.at_level(logging.WARNING, "gpu_operator.controller.runtime.leader"):
        leader.release()
    assert "could not release the lease" in caplog.text


@pytest.mark.skipif(not Path("/proc/thread-self/comm").exists(), reason="not Linux")
def test_the_lease_is_taken_and_renewed_in_a_thread_named_lease_in_the_kernel() -> None:
    """So ``top -H`` (and bench_operator's CPU by thread) shows what leading costs."""
    kube = FakeKube()
    threads: list[str] = []
    get, merge_patch = kube.get, kube.merge_patch

    def where(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            threads.append(Path("/proc/thread-self/comm").read_text().strip())
            return fn(*args, **kwargs)

        return call

    kube.get, kube.merge_patch = where(get), where(merge_patch)  # type: ignore[method-assign]
    e = elector(kube)

    async def take_renew_and_hand_over() -> None:
        await e.acquire()
        await e._call_try()
        await e.hand_over()  # after any renewal in flight: the same single thread

    asyncio.run(take_renew_and_hand_over())
    assert threads and set(threads) == {"lease"}
    assert spec_of(kube).get("holderIdentity") is None


def test_a_renewal_that_took_most_of_its_deadline_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A renewal confirmed with less than half its deadline to spare is what comes before a
    lost Lease on a slow link or a starved node: said while the holder still leads."""
    leader = elector(FakeKube(), lease_seconds=9, renew_seconds=0)  # deadline 6 s
    stop = threading.Event()
    took = iter([timedelta(seconds=1), timedelta(seconds=4)])

    def renew() -> datetime:
        lag = next(took)
        if lag.total_seconds() > 3:
            stop.set()
        return _now() - lag  # written that long before it was confirmed

    leader._try = renew  # type: ignore[method-assign]
    leader.renewed = _now()
    with caplog.at_level(logging.WARNING, logger="gpu_operator.controller.runtime.leader"):
        leader._renew(stop)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("lease renewal took 4.0s of its 6.0s deadline"), warning


# -- a short Lease on a link that can be slow or hang ------------------------------------------
SHORT_LEASE_S = 4


class Link:
    """The network between the electors and the API server, as the fake's ``on_request`` hook:
    each request takes ``latency`` seconds (a slow link), or, while ``hang`` is set, blocks
    until ``released`` (a hung server)."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.released = threading.Event()
        self.latency = 0.0

    def __call__(self, call: Call) -> None:
        if self.latency:
            time.sleep(self.latency)
        if self.hang.is_set():
            self.released.wait(30)


def on_link() -> tuple[FakeKube, Link]:
    kube, link = FakeKube(), Link()
    kube.on_request = link
    return kube, link


def short_elector(kube: FakeKube, identity: str) -> LeaderElector:
    return elector(
        kube, identity, lease_seconds=SHORT_LEASE_S, renew_seconds=0.3, renew_deadline_s=2.0
    )


def test_a_hung_api_server_makes_the_holder_stop_before_the_lease_can_move() -> None:
    kube, link = on_link()
    a = short_elector(kube, "a")

    async def scenario() -> tuple[datetime, dict[str, Any]]:
        await a.acquire()
        await asyncio.sleep(0.5)  # a renewal or two go through
        link.hang.set()
        await asyncio.wait_for(a.hold(), timeout=10)
        stopped = datetime.now(UTC)
        # The Lease as another candidate would read it when the holder stopped: the hung
        # request, once released, still lands and moves renewTime on (CI saw the test read
        # renewTime before that write and the expiry after it).
        seen = copy.deepcopy(spec_of(kube))
        link.released.set()  # let the hung request end (its answer comes too late)
        return stopped, seen

    stopped, spec = asyncio.run(scenario())
    renewed = _parse(spec["renewTime"])
    assert renewed is not None
    # The holder stopped while no other candidate could have taken the Lease yet.
    assert not lease_free(spec, "b", stopped)
    assert lease_free(spec, "b", renewed + timedelta(seconds=SHORT_LEASE_S + 0.1))


def test_a_refused_renewal_is_tried_again_at_once() -> None:
    kube = FakeKube()
    a = short_elector(kube, "a")

    async def scenario() -> None:
        await a.acquire()
        kube.refuse("patch", "Lease", status=409, times=3)  # three renewals in a row refused
        hold = asyncio.create_task(a.hold())
        await asyncio.sleep(2.5)  # longer than the renew deadline
        assert not hold.done(), "leadership given up over refusals that were retried"
        hold.cancel()

    asyncio.run(scenario())
    assert spec_of(kube)["holderIdentity"] == "a"
    assert not kube.refusals  # all three were met


def test_a_standby_waits_and_takes_over_once_the_lease_expired() -> None:
    kube = FakeKube()
    a, b = short_elector(kube, "a"), short_elector(kube, "b")

    async def scenario() -> None:
        await a.acquire()
        assert a._try() is not None and b._try() is None  # a renews; b cannot take it
        await asyncio.wait_for(b.acquire(), timeout=10)  # a stopped renewing: b after expiry

    asyncio.run(scenario())
    assert spec_of(kube)["holderIdentity"] == "b"
    assert spec_of(kube)["leaseTransitions"] == 1


def test_a_renewal_is_one_request_and_a_slow_link_keeps_the_lease() -> None:
    """Round trips of 0.8 s against a 2 s renew deadline: reading before writing (two trips)
    would leave too little margin; one trip, spaced from the renew time written, holds."""
    kube, link = on_link()
    a = short_elector(kube, "a")

    async def scenario() -> None:
        await a.acquire()
        before = len(kube.calls)
        assert a._try() is not None
        assert len(kube.calls) - before == 1, "a renewal read the Lease first"
        link.latency = 0.8
        hold = asyncio.create_task(a.hold())
        await asyncio.sleep(5.0)  # two and a half renew deadlines
        assert not hold.done(), "leadership lost on a slow but working link"
        hold.cancel()

    asyncio.run(scenario())
    assert spec_of(kube)["holderIdentity"] == "a"


def test_a_holder_whose_lease_was_written_by_another_reads_it_and_stops_renewing() -> None:
    kube = FakeKube()
    a, b = short_elector(kube, "a"), short_elector(kube, "b")

    async def scenario() -> None:
        await a.acquire()
        stored = kube.obj("Lease", LEASE, NAMESPACE)
        assert stored is not None
        # Someone else took the Lease (it expired while a was cut off, say).
        stored["spec"]["holderIdentity"] = "b"
        stored["metadata"]["resourceVersion"] = "99"
        assert a._try() is None, "a blind renewal overwrote another holder"
        assert b._try() is not None

    asyncio.run(scenario())
    assert spec_of(kube)["holderIdentity"] == "b"
