"""Never alive but deaf: the watchdog's judgement, and /healthz saying it."""

from __future__ import annotations

import asyncio
import inspect
import json
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

from kopf._core.reactor import orchestration

from gpu_operator.controller.runtime.health import HealthServer
from gpu_operator.controller.runtime.liveness import WATCHER_PREFIX, Verdict, Watchdog, judge

from .test_health import free_port

WATCHERS = frozenset({"watcher for nodes.v1", "watcher for pods.v1 in 'gpu-operator'"})


def test_judgement() -> None:
    def verdict(running: set[str], **times: float | None) -> Verdict:
        at = {"now": 1000.0, "pass_started": None, "failing_since": None, **times}
        return judge(WATCHERS, running, stall_s=300, **at)  # type: ignore[arg-type]

    assert verdict(set(WATCHERS)).state == "ok"
    dead = verdict({"watcher for nodes.v1"})
    assert dead.state == "deaf" and "pods.v1" in dead.reason and "1 of 2" in dead.reason
    assert not dead.alive
    stuck = verdict(set(WATCHERS), pass_started=600.0)
    assert stuck.state == "deaf" and "400s" in stuck.reason
    retrying = verdict(set(WATCHERS), failing_since=700.0, pass_started=990.0)
    assert retrying.state == "retrying" and retrying.alive and "300s" in retrying.reason


def test_a_dead_watch_thread_is_deaf_like_a_dead_kopf_watcher() -> None:
    def verdict(threads: dict[str, bool]) -> Verdict:
        return judge(
            WATCHERS, WATCHERS, now=0.0, pass_started=None, failing_since=None, stall_s=300,
            threads=threads,
        )  # fmt: skip

    assert verdict({"watch-nodes": True, "watch-pods": True}).state == "ok"
    dead = verdict({"watch-nodes": True, "watch-pods": False})
    assert dead.state == "deaf" and dead.reason == "watch-pods ended (1 of 4 watches dead)"


def test_a_probe_that_finds_the_operator_deaf_stops_it_at_once() -> None:
    """The watchdog's own looks are 10 s apart (an idle loop wakes for little else); a probe's
    look in between that finds a watch thread dead ends ``run`` then, not at the next look."""
    threads = {"watch-nodes": True}

    async def scenario() -> tuple[str, Verdict]:
        loop: Any = SimpleNamespace(ready=asyncio.Event(), pass_started=None, failing_since=None)
        loop.ready.set()
        dog = Watchdog(loop, interval_s=3600, threads=lambda: threads)
        running = asyncio.create_task(dog.run())
        await asyncio.sleep(0.05)
        assert not running.done()
        threads["watch-nodes"] = False
        probed = dog.look()  # what /healthz does
        return await asyncio.wait_for(running, timeout=10), probed

    reason, probed = asyncio.run(scenario())
    assert reason == "watch-nodes ended (1 of 1 watches dead)" and probed.state == "deaf"


def test_kopf_still_names_its_watch_tasks_as_the_watchdog_expects() -> None:
    assert f'name=f"{WATCHER_PREFIX}' in inspect.getsource(orchestration)


def test_healthz_is_503_with_the_reason_when_deaf() -> None:
    port = free_port()
    now: list[Verdict] = [Verdict("retrying", "reconcile passes failing for 80s")]

    def get() -> tuple[int, dict[str, str]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    async def scenario() -> list[tuple[int, dict[str, str]]]:
        server = HealthServer(f"http://127.0.0.1:{port}/healthz", lambda: "leader", lambda: now[0])
        await server.start()
        try:
            seen = [await asyncio.to_thread(get)]
            now[0] = Verdict("deaf", "watcher for nodes.v1 ended (1 of 13 watches dead)")
            seen.append(await asyncio.to_thread(get))
            return seen
        finally:
            await server.stop()

    retrying, deaf = asyncio.run(scenario())
    assert retrying == (
        200,
        {"status": "retrying", "role": "leader", "reason": "reconcile passes failing for 80s"},
    )
    assert deaf[0] == 503 and deaf[1]["status"] == "deaf"
    assert deaf[1]["reason"].startswith("watcher for nodes.v1 ended")


def test_why_the_operator_stops() -> None:
    """Only being asked to stop is not a failure; everything else exits non-zero, named."""
    from gpu_operator.controller.runner import _failure

    async def returns(value: object) -> object:
        return value

    async def fails() -> None:
        raise RuntimeError("boom")

    async def scenario() -> list[str]:
        tasks = {
            "stop": asyncio.create_task(returns(True), name="stop"),
            "lease": asyncio.create_task(returns(None), name="lease"),
            "liveness": asyncio.create_task(returns("watcher for nodes.v1 ended"), name="liveness"),
            "kopf": asyncio.create_task(fails(), name="kopf"),
        }
        await asyncio.wait(tasks.values())
        return [
            _failure({tasks["stop"]}),
            _failure({tasks["lease"]}),
            _failure({tasks["liveness"]}),
            _failure({tasks["kopf"], tasks["stop"]}),
        ]

    stop, lease, deaf, kopf = asyncio.run(scenario())
    assert stop == ""
    assert lease == "leadership lost"
    assert deaf == "deaf: watcher for nodes.v1 ended"
    assert kopf == "kopf ended: RuntimeError('boom')"
