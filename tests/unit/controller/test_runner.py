"""Starting and stopping the operator: CRD, leadership, watches and loop, all on a fake API.

kopf itself is replaced by a stand-in at ``runner.kopf.operator`` and the informer's watch
threads by one at ``runner.Informer.run`` (they would open watches); everything else (the
elector, the controller, the health server, the watchdog) is the real thing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from kubernetes import client as k8s

from gpu_operator.controller import runner
from gpu_operator.controller.clusterpolicy.reconciler import ClusterPolicyController
from gpu_operator.controller.runner import (
    OperatorStopped,
    OperatorThread,
    RunOptions,
    main_run,
    run_operator,
)
from gpu_operator.controller.runtime.crd_install import desired_crd
from gpu_operator.controller.runtime.informer import Informer
from gpu_operator.controller.runtime.leader import _fmt
from gpu_operator.controller.runtime.liveness import WATCHER_PREFIX
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.watch import KOPF_WATCHED
from gpu_operator.testenv.processes import free_ports
from tests.fakes.kube import FakeKube
from tests.unit.controller.builders import CONFIG, NAMESPACE, policy

LEASE = "gpu-operator-leader"
KopfOperator = Callable[..., Awaitable[None]]


def options(**kw: Any) -> RunOptions:
    base: dict[str, Any] = {
        "config": CONFIG,
        "apply_crd": False,
        "identity": "me",
        "health_endpoint": None,
        "metrics_port": None,
        "renew_seconds": 0.01,
    }
    return RunOptions(**(base | kw))


def free_port() -> int:
    return free_ports(1)[0]


@pytest.fixture(autouse=True)
def informer(monkeypatch: pytest.MonkeyPatch) -> list[Informer]:
    """The informer lists every kind at once (nothing there) and then hears nothing."""
    started: list[Informer] = []

    async def run_informer(self: Informer) -> None:
        started.append(self)
        self.ready.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(runner.Informer, "run", run_informer)
    return started


async def kopf_watching(stop_flag: asyncio.Future[Any]) -> None:
    """kopf's watcher tasks, named as kopf names them, until kopf is told to stop."""
    watchers = [
        asyncio.create_task(asyncio.Event().wait(), name=f"{WATCHER_PREFIX}{w.index}")
        for w in KOPF_WATCHED
    ]
    try:
        await stop_flag
    finally:
        for task in watchers:
            task.cancel()


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    """The fake API the operator talks to (in place of the client ``run_operator`` makes)."""
    fake = FakeKube()
    monkeypatch.setattr(runner, "Kube", lambda _api: fake)
    return fake


def run(
    opts: RunOptions,
    *,
    stop: asyncio.Event | None = None,
    started: threading.Event | None = None,
    metrics: PrometheusMetrics | None = None,
    api_config: k8s.Configuration | None = None,
) -> ClusterPolicyController | None:
    """``run_operator`` to its end, on the fake API."""
    main = run_operator(
        opts, api_config or k8s.Configuration(), stop=stop, started=started, metrics=metrics
    )
    return asyncio.run(asyncio.wait_for(main, timeout=60))


@pytest.fixture
def kopf_fails(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """kopf stops at once with an error (a watch that cannot start); its calls are kept."""
    calls: list[dict[str, Any]] = []

    async def operator(**kwargs: Any) -> None:
        calls.append(kwargs)
        raise RuntimeError("watch failed")

    monkeypatch.setattr(runner.kopf, "operator", operator)
    return calls


# -- the Lease comes first -------------------------------------------------------------------


def test_an_error_creating_the_lease_ends_the_run(
    kube: FakeKube, kopf_fails: list[dict[str, Any]]
) -> None:
    """Bug fixed: the error was ignored and the operator went on to act without the Lease."""
    kube.refuse("create", "Lease", status=404)  # the namespace is missing
    metrics = PrometheusMetrics()
    with pytest.raises(RuntimeError):
        run(options(), metrics=metrics)
    assert kopf_fails == []  # no watch was started
    assert not metrics.leading


@pytest.mark.parametrize("status", [500, 403])
def test_a_refused_lease_read_is_asked_again_and_nothing_acts_before_it_is_held(
    kube: FakeKube, kopf_fails: list[dict[str, Any]], status: int
) -> None:
    kube.refuse("get", "Lease", status=status, times=3)
    with pytest.raises(runner.OperatorStopped):  # the stand-in kopf fails once it is started
        run(options())
    assert ("get", "Lease", "*") not in kube.refusals  # every refusal was met first
    assert len(kopf_fails) == 1  # then the operator led, and only then watched


def test_stopping_while_waiting_for_the_lease_starts_nothing(
    kube: FakeKube, kopf_fails: list[dict[str, Any]]
) -> None:
    held = {"holderIdentity": "other", "renewTime": _fmt(datetime.now(UTC)),
            "leaseDurationSeconds": 3600}  # fmt: skip
    kube.add({"kind": "Lease", "metadata": {"name": LEASE, "namespace": NAMESPACE}, "spec": held})
    stop = asyncio.Event()
    stop.set()
    assert run(options(), stop=stop) is None
    assert kopf_fails == []
    assert kube.writes == []


def test_a_failed_watch_ends_the_run_and_hands_the_lease_over(
    kube: FakeKube, kopf_fails: list[dict[str, Any]]
) -> None:
    metrics = PrometheusMetrics()
    with pytest.raises(runner.OperatorStopped, match="kopf ended"):  # never alive but deaf
        run(options(), metrics=metrics)
    assert len(kopf_fails) == 1 and kopf_fails[0]["namespaces"] == [NAMESPACE]
    lease = kube.obj("Lease", LEASE, NAMESPACE)
    assert lease is not None and lease["spec"].get("holderIdentity") is None  # released
    assert not metrics.leading


def test_a_run_that_ends_before_it_is_ready_leaves_no_task_behind(
    kube: FakeKube, kopf_fails: list[dict[str, Any]]
) -> None:
    """Bug fixed: the task that reports readiness was left pending; an operator thread's loop
    closed over it ("Task was destroyed but it is pending!", in every e2e run's log)."""
    started = threading.Event()

    async def main() -> list[asyncio.Task[Any]]:
        with pytest.raises(runner.OperatorStopped):
            await run_operator(options(), k8s.Configuration(), started=started)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(main()) == []
    assert not started.is_set()  # it never was ready


def test_without_leader_election_no_lease_is_touched(
    kube: FakeKube, kopf_fails: list[dict[str, Any]]
) -> None:
    with pytest.raises(runner.OperatorStopped):
        run(options(leader_election=False))
    assert kube.obj("Lease", LEASE, NAMESPACE) is None


def test_the_crd_is_installed_before_anything_else(
    kube: FakeKube, kopf_fails: list[dict[str, Any]]
) -> None:
    with pytest.raises(runner.OperatorStopped):
        run(options(apply_crd=True, leader_election=False))
    assert kube.writes[0] == (
        "apply",
        "CustomResourceDefinition",
        desired_crd()["metadata"]["name"],
    )


def test_a_stop_ends_a_running_operator_gracefully(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped_kopf: list[bool] = []

    async def operator(stop_flag: asyncio.Future[Any], registry: Any, **_: Any) -> None:
        await stop_flag  # runs until told to stop
        stopped_kopf.append(True)

    monkeypatch.setattr(runner.kopf, "operator", operator)
    stop = asyncio.Event()

    async def main() -> ClusterPolicyController | None:
        task = asyncio.create_task(run_operator(options(), k8s.Configuration(), stop=stop))
        while kube.obj("Lease", LEASE, NAMESPACE) is None:  # until it leads
            await asyncio.sleep(0.001)
        stop.set()
        return await task

    controller = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert controller is not None
    assert stopped_kopf == [True]
    lease = kube.obj("Lease", LEASE, NAMESPACE)
    assert lease is not None and lease["spec"].get("holderIdentity") is None


def test_kopf_is_configured_and_readiness_reported(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kopf gets the quiet settings and the client's credentials; ``started`` is set once the
    informer has listed and kopf holds every ClusterPolicy a list returns, not before."""
    seen: dict[str, Any] = {}
    cp = policy()
    kube.add(cp)

    async def operator(registry: Any, stop_flag: asyncio.Future[Any], **_: Any) -> None:
        for handler in registry._activities.get_all_handlers():
            seen[handler.id] = await handler.fn(settings=kopf.OperatorSettings(), logger=None)
        watching = asyncio.create_task(kopf_watching(stop_flag))
        await asyncio.sleep(0.5)  # the informer has listed, kopf's watchers run
        seen["before"] = started.is_set()  # but kopf has not stored the policy yet
        store = next(h for h in registry._watching.get_all_handlers() if "clusterpolicies" in h.id)
        meta = cp["metadata"]
        await store.fn(event={"type": None}, body=cp, name=meta["name"], namespace=None)
        for _ in range(100):  # a few polls of kopf_caught_up
            if started.is_set():
                break
            await asyncio.sleep(0.05)
        seen["started"] = started.is_set()
        stop.set()  # kopf ending by itself would be a failure: ask the operator to stop
        await watching

    monkeypatch.setattr(runner.kopf, "operator", operator)
    started = threading.Event()
    stop = asyncio.Event()
    api_config = k8s.Configuration(host="https://api:6443", api_key={"authorization": "Bearer t"})

    run(options(leader_election=False), started=started, api_config=api_config, stop=stop)
    login = next(v for k, v in seen.items() if k.endswith("_login"))
    assert (login.server, login.token) == ("https://api:6443", "t")
    assert (seen["before"], seen["started"]) == (False, True)


def test_a_dead_watch_thread_is_deaf_and_stops_the_run(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never alive but deaf: a watch thread of the informer that ended stops the operator
    (non-zero exit) and fences its writes."""

    async def run_informer(self: Informer) -> None:
        dead = threading.Thread(target=lambda: None, name="watch-nodes")
        dead.start()
        dead.join()
        self.threads = (dead,)
        self.ready.set()
        await asyncio.Event().wait()

    async def operator(stop_flag: asyncio.Future[Any], **_: Any) -> None:
        await kopf_watching(stop_flag)

    monkeypatch.setattr(runner.Informer, "run", run_informer)
    monkeypatch.setattr(runner.kopf, "operator", operator)
    with pytest.raises(runner.OperatorStopped, match="deaf: watch-nodes ended"):
        run(options(leader_election=False))
    assert kube.fence.is_set()


# -- run_operator: health and metrics servers around the run ---------------------------------


def test_run_operator_serves_health_and_metrics_and_stops_them(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    health_port, metrics_port = free_port(), free_port()
    seen: dict[str, Any] = {}

    async def operator(stop_flag: asyncio.Future[Any], **_: Any) -> None:
        def get(url: str) -> str:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return str(resp.read().decode())

        seen["health"] = await asyncio.to_thread(get, f"http://127.0.0.1:{health_port}/healthz")
        seen["metrics"] = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics_port}/metrics")
        stop.set()
        await stop_flag

    monkeypatch.setattr(runner.kopf, "operator", operator)
    stop = asyncio.Event()
    metrics = PrometheusMetrics()
    opts = options(
        health_endpoint=f"http://127.0.0.1:{health_port}/healthz", metrics_port=metrics_port
    )
    assert run(opts, metrics=metrics, stop=stop) is not None
    assert '"role": "leader"' in seen["health"]
    assert "gpu_operator_leader 1.0" in seen["metrics"]
    assert not metrics.leading  # a stopped operator is no longer the leader
    for port in (health_port, metrics_port):  # both servers are gone
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


# -- OperatorThread and main_run -----------------------------------------------------------


def test_operator_thread_starts_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run(
        options: RunOptions, api_config: Any, *, stop: asyncio.Event, started: Any, metrics: Any
    ) -> None:
        started.set()
        await stop.wait()

    monkeypatch.setattr(runner, "run_operator", fake_run)
    thread = OperatorThread(options(), k8s.Configuration()).start(timeout=30)
    assert thread.error is None
    thread.stop()
    assert not thread._thread.is_alive()


def test_operator_thread_reports_a_failed_start(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run(*_: Any, **__: Any) -> None:
        raise ValueError("no cluster")

    monkeypatch.setattr(runner, "run_operator", fake_run)
    thread = OperatorThread(options(), k8s.Configuration())
    with pytest.raises(RuntimeError, match="failed to start") as err:
        thread.start(timeout=30)
    assert isinstance(err.value.__cause__, ValueError)
    thread.stop()


def test_operator_thread_that_never_leads_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run(*_: Any, stop: asyncio.Event, **__: Any) -> None:
        await stop.wait()  # waiting for a Lease someone else holds

    monkeypatch.setattr(runner, "run_operator", fake_run)
    thread = OperatorThread(options(), k8s.Configuration())
    with pytest.raises(TimeoutError, match="did not start"):
        thread.start(timeout=0.01)
    thread.stop()
    assert not thread._thread.is_alive()


def test_operator_thread_can_start_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run(*_: Any, stop: asyncio.Event, **__: Any) -> None:
        await stop.wait()

    monkeypatch.setattr(runner, "run_operator", fake_run)
    thread = OperatorThread(options(), k8s.Configuration()).start(wait=False)
    while thread._stop is None or thread._loop is None or not thread._loop.is_running():
        thread._thread.join(0.001)  # until its loop runs
    thread.stop()
    assert not thread._thread.is_alive()


def test_a_stop_asked_before_the_thread_runs_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM may come before the operator's loop exists: the loop then starts stopped."""

    async def fake_run(*_: Any, stop: asyncio.Event, **__: Any) -> None:
        await stop.wait()

    monkeypatch.setattr(runner, "run_operator", fake_run)
    thread = OperatorThread(options(), k8s.Configuration())
    thread.stop(timeout=0)
    thread.start(wait=False)
    assert not thread.join(10)


@pytest.mark.parametrize("restart", [True, False])
def test_an_operator_that_stops_on_its_own_runs_again_only_when_restarted(
    monkeypatch: pytest.MonkeyPatch, restart: bool
) -> None:
    """Leadership lost under load: with ``restart`` (the e2e harness, like a Deployment) it runs
    again until asked to stop; without, it stays stopped with the reason."""
    runs: list[int] = []

    async def fake_run(*_: Any, stop: asyncio.Event, started: threading.Event, **__: Any) -> None:
        runs.append(1)
        started.set()
        if len(runs) <= 2:
            raise OperatorStopped("leadership lost")
        await stop.wait()

    monkeypatch.setattr(runner, "run_operator", fake_run)
    monkeypatch.setattr(runner, "RESTART_DELAY_S", 0.01)
    thread = OperatorThread(options(), k8s.Configuration(), restart=restart).start(wait=False)
    if restart:
        for _ in range(1000):  # until the third run waits to be stopped (10 s at most)
            if len(runs) >= 3:
                break
            thread._thread.join(0.01)
        assert thread.restarts == ["leadership lost", "leadership lost"]
        assert thread.error is None
        assert thread.join(0.05), "a restarted operator ended without being asked"
        thread.stop()
    else:
        assert not thread.join(10)
        assert isinstance(thread.error, OperatorStopped) and thread.restarts == []
    assert not thread._thread.is_alive()
    assert len(runs) == (3 if restart else 1)


def test_a_failed_start_is_not_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an operator that led is restarted: one that cannot start says so to its caller."""
    runs: list[int] = []

    async def fake_run(*_: Any, **__: Any) -> None:
        runs.append(1)
        raise OperatorStopped("deaf")

    monkeypatch.setattr(runner, "run_operator", fake_run)
    thread = OperatorThread(options(), k8s.Configuration(), restart=True)
    with pytest.raises(RuntimeError, match="failed to start"):
        thread.start(timeout=30)
    assert not thread.join(10) and runs == [1]


@pytest.mark.parametrize(("failure", "code"), [(None, 0), (RuntimeError("lost"), 1)])
def test_main_run_configures_from_flags_and_env(
    monkeypatch: pytest.MonkeyPatch, failure: Exception | None, code: int
) -> None:
    got: list[RunOptions] = []

    async def fake_run(
        options: RunOptions, api_config: Any, *, stop: asyncio.Event, **_: Any
    ) -> None:
        got.append(options)
        if failure is not None:
            raise failure

    monkeypatch.setattr(runner, "run_operator", fake_run)
    monkeypatch.setattr(runner, "api_configuration", lambda *_: k8s.Configuration())
    monkeypatch.setenv("OPERATOR_IMAGE", "example.com/op:1")
    monkeypatch.setenv("DRIVER_IMAGE", "example.com/driver:2")
    monkeypatch.delenv("DEVICE_PLUGIN_IMAGE", raising=False)
    result = main_run(
        kubeconfig=None, namespace="gpus", apply_crd=False, leader_election=True,
        health_port=0, metrics_port=9999, lease_seconds=15,
    )  # fmt: skip
    assert result == code
    (opts,) = got
    assert opts.config.namespace == "gpus"
    assert opts.config.operator_image == "example.com/op:1"
    assert opts.config.image_env == {"DRIVER_IMAGE": "example.com/driver:2"}
    assert opts.health_endpoint is None and opts.metrics_port == 9999
    assert (opts.lease_seconds, opts.renew_seconds) == (15, 2.5)
    assert not opts.apply_crd


@pytest.mark.timeout(30)
@pytest.mark.parametrize("to_another_thread", [False, True], ids=["to-process", "to-a-thread"])
def test_main_run_stops_gracefully_on_sigterm(
    monkeypatch: pytest.MonkeyPatch, to_another_thread: bool
) -> None:
    """A SIGTERM reaches the handler, which asks the operator to stop, and the run ends with
    0, whichever thread the kernel hands it to: one taken by a thread other than the main
    one once left ``gpu-operator run`` waiting for the kubelet's SIGKILL."""
    stopping = threading.Event()

    async def fake_run(*_: Any, stop: asyncio.Event, **__: Any) -> None:
        await stop.wait()
        stopping.set()

    monkeypatch.setattr(runner, "run_operator", fake_run)
    monkeypatch.setattr(runner, "api_configuration", lambda *_: k8s.Configuration())
    previous = signal.getsignal(signal.SIGTERM)

    def terminate_once_waiting() -> None:
        while signal.getsignal(signal.SIGTERM) is previous:  # main_run installs its handler
            time.sleep(0.01)
        if to_another_thread:
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=terminate_once_waiting, daemon=True)
    sender.start()
    result = main_run(
        kubeconfig=None, namespace="gpus", apply_crd=False, leader_election=False,
        health_port=0, metrics_port=0,
    )  # fmt: skip
    assert result == 0 and stopping.is_set()
    assert signal.getsignal(signal.SIGTERM) is previous
