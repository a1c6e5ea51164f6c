"""Which requests a fault-proxy fault hits (the pure part of testenv.faults)."""

from __future__ import annotations

from gpu_operator.testenv.faults import Fault, Request, decide, status_body

GET = Request("GET", "/api/v1/nodes", watch=False)
WATCH = Request("GET", "/api/v1/nodes", watch=True)
PATCH = Request("PATCH", "/api/v1/nodes/n1", watch=False)


def test_fraction_and_count_bound_a_fault() -> None:
    fault = Fault(429, fraction=0.1, max_count=2)
    assert decide(fault, GET, 0.05, injected=0)
    assert not decide(fault, GET, 0.5, injected=0)
    assert not decide(fault, GET, 0.05, injected=2)  # its count is spent
    assert not decide(None, GET, 0.0, injected=0)


def test_writes_only_and_watches_only() -> None:
    conflicts = Fault(409, writes_only=True)
    assert decide(conflicts, PATCH, 0.0, 0) and not decide(conflicts, GET, 0.0, 0)
    gone = Fault(410)  # only a watch can end with 410 Gone
    assert decide(gone, WATCH, 0.0, 0) and not decide(gone, GET, 0.0, 0)
    assert not decide(Fault(503, watches_only=True), GET, 0.0, 0)


def test_health_probes_are_never_hit() -> None:
    assert not decide(Fault(503), Request("GET", "/readyz", watch=False), 0.0, 0)


def test_status_bodies_are_kubernetes_statuses() -> None:
    body = status_body(410)
    assert body["kind"] == "Status" and body["code"] == 410 and body["reason"] == "Expired"
    assert status_body(429)["reason"] == "TooManyRequests"
