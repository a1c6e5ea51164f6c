"""kube.Kube asks again when the API server says "not now", and only then: against a scripted
HTTP server (the wire shapes; the API semantics are the chaos suite's, on a real API server)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_operator.kube import INTERACTIVE, Kube, Retry, worth_retrying
from tests.fakes.kube import Request, ScriptedRequests
from tests.unit.netstubs import closed_port

NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "resourceVersion": "1"}}
FAST = Retry(attempts=4, first_delay_s=0.01, max_delay_s=0.2, deadline_s=5)


class Script:
    """Answers in order (status, headers); 200 with NODE once the script runs out."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str]]] = []
        self.seen: list[str] = []


@pytest.fixture
def server() -> Iterator[tuple[Kube, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self.seen_request()
            status, headers = script.answers.pop(0) if script.answers else (200, {})
            data = json.dumps(NODE if status == 200 else {"message": "scripted"}).encode()
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def seen_request(self) -> None:
            script.seen.append(f"{self.command} {self.headers.get('Content-Type')}")

        do_GET = do_PATCH = do_POST = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=httpd.serve_forever, daemon=True).start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield Kube(client.ApiClient(config), FAST), script
    httpd.shutdown()
    httpd.server_close()


def test_overload_and_restarts_are_asked_again(server: tuple[Kube, Script]) -> None:
    kube, script = server
    script.answers = [(503, {}), (429, {"Retry-After": "0"}), (504, {})]
    assert kube.get("Node", "n1") == NODE
    assert len(script.seen) == 4


def test_a_server_side_apply_conflict_is_asked_again(server: tuple[Kube, Script]) -> None:
    kube, script = server
    script.answers = [(409, {})]
    assert kube.apply(NODE)["metadata"]["name"] == "n1"
    assert script.seen == ["PATCH application/apply-patch+yaml"] * 2


def test_a_guarded_merge_patch_conflict_goes_back_to_the_caller(
    server: tuple[Kube, Script],
) -> None:
    kube, script = server
    script.answers = [(409, {})]
    with pytest.raises(ApiException) as raised:
        kube.merge_patch("Node", "n1", {"metadata": {"resourceVersion": "1"}})
    assert raised.value.status == 409 and len(script.seen) == 1


def test_posts_are_never_repeated_after_an_answer(server: tuple[Kube, Script]) -> None:
    """An eviction's 429 is a PodDisruptionBudget saying no; a create may have happened."""
    kube, script = server
    script.answers = [(429, {"Retry-After": "0"})]
    with pytest.raises(ApiException):
        kube.evict("p", "ns")
    assert len(script.seen) == 1


def test_attempts_are_bounded(server: tuple[Kube, Script]) -> None:
    kube, script = server
    script.answers = [(503, {})] * 10
    with pytest.raises(ApiException) as raised:
        kube.get("Node", "n1")
    assert raised.value.status == 503 and len(script.seen) == FAST.attempts


def test_a_retry_after_longer_than_the_deadline_is_not_waited_for(
    server: tuple[Kube, Script],
) -> None:
    kube, script = server
    kube = kube.with_retry(Retry(attempts=5, max_delay_s=60, deadline_s=1))
    script.answers = [(429, {"Retry-After": "30"})]
    with pytest.raises(ApiException):
        kube.get("Node", "n1")
    assert len(script.seen) == 1


def test_delays() -> None:
    policy = Retry(first_delay_s=0.5, max_delay_s=4)
    assert policy.delay(1, "3") == 3.0
    assert policy.delay(1, "120") == 4.0  # capped
    assert 0.25 <= policy.delay(1) <= 0.5
    assert 2.0 <= policy.delay(6) <= 4.0
    assert 0.25 <= policy.delay(1, "Wed, 21 Oct 2026 07:28:00 GMT") <= 0.5


def test_connection_errors() -> None:
    refused = urllib3.exceptions.MaxRetryError(
        None, "/x", urllib3.exceptions.NewConnectionError(None, "refused")
    )
    reset = urllib3.exceptions.ProtocolError("reset")
    assert worth_retrying("POST", "application/json", refused)  # never reached the server
    assert not worth_retrying("POST", "application/json", reset)  # may have been created
    assert worth_retrying("GET", "application/json", reset)
    assert not worth_retrying("GET", "application/json", ValueError())


def two_pages(sent: Request) -> Any:
    """A list answered in two pages."""
    if "continue" not in (sent.query or {}):
        names, meta = ["a", "b"], {"continue": "next", "resourceVersion": "7"}
    else:
        names, meta = ["c"], {"resourceVersion": "9"}
    return {"items": [{"metadata": {"name": n}} for n in names], "metadata": meta}


def test_a_paged_list_keeps_what_keep_makes_of_each_object_and_the_last_version() -> None:
    kube = ScriptedRequests(two_pages)
    kept, version = kube.list_with_version(
        "Node", None, {"labelSelector": "x=y"}, keep=lambda o: o["metadata"]["name"]
    )
    assert (kept, version) == (["a", "b", "c"], "9")
    assert [sent.query for sent in kube.sent] == [
        {"labelSelector": "x=y", "limit": "500"},
        {"labelSelector": "x=y", "limit": "500", "continue": "next"},
    ]
    assert [o["metadata"]["name"] for o in kube.list_objects("Node")] == ["a", "b", "c"]


def test_a_refusal_names_the_request(server: tuple[Kube, Script]) -> None:
    kube, script = server
    script.answers = [(403, {})]
    with pytest.raises(ApiException) as raised:
        kube.get("Node", "n1")
    assert raised.value.request_line == "GET /api/v1/nodes/n1"  # type: ignore[attr-defined]


def test_this_is_the_only_retry_layer(caplog: pytest.LogCaptureFixture) -> None:
    """urllib3 asks nothing again under it: a refused connection costs the attempts counted
    here (urllib3's own three each, every one a warning, before), and a person waiting on
    INTERACTIVE hears within seconds."""
    with closed_port() as port:
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{port}"
        kube = Kube(client.ApiClient(config), INTERACTIVE)
        assert kube.api.rest_client.pool_manager.connection_pool_kw["retries"].total == 0
        started = time.monotonic()
        with caplog.at_level(logging.DEBUG), pytest.raises(urllib3.exceptions.MaxRetryError):
            kube.get("Node", "n1")
        assert time.monotonic() - started < INTERACTIVE.deadline_s
    said = [r.getMessage() for r in caplog.records]
    # Only this server's: another test's thread in this worker may be connecting elsewhere.
    dialled = [m for m in said if m.startswith("Starting new HTTP") and f":{port}" in m]
    assert len(dialled) == INTERACTIVE.attempts
    assert len([m for m in said if "asking again" in m]) == INTERACTIVE.attempts - 1
    assert not [m for m in said if m.startswith("Retrying")]
