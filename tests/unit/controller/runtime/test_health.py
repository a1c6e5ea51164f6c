"""The /healthz server every replica runs, leader or standby."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request

import pytest

from gpu_operator.controller.runtime.health import HealthServer, parse_endpoint
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.testenv.processes import free_ports


def free_port() -> int:
    return free_ports(1)[0]


def test_parse_endpoint() -> None:
    assert parse_endpoint("http://0.0.0.0:8080/healthz") == ("0.0.0.0", 8080, "/healthz")
    assert parse_endpoint("http://127.0.0.1:9/") == ("127.0.0.1", 9, "/")
    for bad in ("0.0.0.0:8080", "https://h:1/x", "http://host/healthz"):
        with pytest.raises(ValueError, match="http://HOST:PORT/PATH"):
            parse_endpoint(bad)


def test_answers_with_the_current_role() -> None:
    metrics = PrometheusMetrics()
    port = free_port()

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""

    async def scenario() -> list[tuple[int, str]]:
        server = HealthServer(f"http://127.0.0.1:{port}/healthz", lambda: metrics.role)
        await server.start()
        try:
            seen = [await asyncio.to_thread(get, "/healthz")]
            metrics.set_leading(True)
            seen.append(await asyncio.to_thread(get, "/healthz"))
            seen.append(await asyncio.to_thread(get, "/other"))
            return seen
        finally:
            await server.stop()

    standby, leader, other = asyncio.run(scenario())
    assert standby[0] == 200 and json.loads(standby[1]) == {"status": "ok", "role": "standby"}
    assert leader[0] == 200 and json.loads(leader[1])["role"] == "leader"
    assert other[0] == 404
    # stopped: nothing listens any more (SO_REUSEADDR: closed connections may linger)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
