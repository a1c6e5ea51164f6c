"""Starting and stopping the operator: CRD, leadership, watches and loop, all on a fake API.

The watches are replaced by a stand-in at ``runner.Informer.run`` (they would open streams);
everything else (the elector, the controller, the health server) is the real thing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_operator.controller import runner
from gpu_operator.controller.clusterpolicy import ClusterPolicyController
from gpu_operator.controller.crd_install import desired_crd
from gpu_operator.controller.informer import Informer
from gpu_operator.controller.leader import _fmt
from gpu_operator.controller.metrics import PrometheusMetrics
from gpu_operator.controller.runner import OperatorThread, RunOptions, main_run, run_operator
from tests.unit.controller.builders import CONFIG, NAMESPACE
from tests.unit.controller.fakes import FakeKube

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
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
def watch_fails(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The watches stop at once with an error (a kind that cannot be listed); their starts are
    kept."""
    calls: list[dict[str, Any]] = []

    async def run_informer(self: Informer) -> None:
        calls.append({"namespace": self.namespace})
        raise RuntimeError("watch failed")

    monkeypatch.setattr(runner.Informer, "run", run_informer)
    return calls


# -- the Lease comes first -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "status", "error"),
    [("get", 500, ApiException), ("get", 403, ApiException), ("create", 404, RuntimeError)],
)
def test_an_error_acquiring_the_lease_ends_the_run(
    kube: FakeKube,
    watch_fails: list[dict[str, Any]],
    verb: str,
    status: int,
    error: type[Exception],
) -> None:
    """Bug fixed: the error was ignored and the operator went on to act without the Lease."""
    kube.refuse(verb, "Lease", status=status)
    metrics = PrometheusMetrics()
    with pytest.raises(error):
        run(options(), metrics=metrics)
    assert watch_fails == []  # no watch was started
    assert not metrics.leading


def test_stopping_while_waiting_for_the_lease_starts_nothing(
    kube: FakeKube, watch_fails: list[dict[str, Any]]
) -> None:
    held = {"holderIdentity": "other", "renewTime": _fmt(datetime.now(UTC)),
            "leaseDurationSeconds": 3600}  # fmt: skip
    kube.add({"kind": "Lease", "metadata": {"name": LEASE, "namespace": NAMESPACE}, "spec": held})
    stop = asyncio.Event()
    stop.set()
    assert run(options(), stop=stop) is None
    assert watch_fails == []
    assert kube.writes == []


def test_a_failed_watch_ends_the_run_and_hands_the_lease_over(
    kube: FakeKube, watch_fails: list[dict[str, Any]]
) -> None:
    metrics = PrometheusMetrics()
    controller = run(options(), metrics=metrics)
    assert isinstance(controller, ClusterPolicyController)
    assert len(watch_fails) == 1 and watch_fails[0]["namespace"] == NAMESPACE
    lease = kube.obj("Lease", LEASE, NAMESPACE)
    assert lease is not None and lease["spec"].get("holderIdentity") is None  # released
    assert not metrics.leading


def test_without_leader_election_no_lease_is_touched(
    kube: FakeKube, watch_fails: list[dict[str, Any]]
) -> None:
    assert run(options(leader_election=False)) is not None
    assert kube.obj("Lease", LEASE, NAMESPACE) is None


def test_the_crd_is_installed_before_anything_else(
    kube: FakeKube, watch_fails: list[dict[str, Any]]
) -> None:
    run(options(apply_crd=True, leader_election=False))
    assert kube.writes[0] == (
        "apply",
        "CustomResourceDefinition",
        desired_crd()["metadata"]["name"],
    )


def test_a_stop_ends_a_running_operator_gracefully(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped: list[bool] = []

    async def run_informer(self: Informer) -> None:
        try:
            await asyncio.Event().wait()  # runs until cancelled
        finally:
            stopped.append(True)

    monkeypatch.setattr(runner.Informer, "run", run_informer)
    stop = asyncio.Event()

    async def main() -> ClusterPolicyController | None:
        task = asyncio.create_task(run_operator(options(), k8s.Configuration(), stop=stop))
        while kube.obj("Lease", LEASE, NAMESPACE) is None:  # until it leads
            await asyncio.sleep(0.001)
        stop.set()
        return await task

    controller = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert controller is not None
    assert stopped == [True]
    lease = kube.obj("Lease", LEASE, NAMESPACE)
    assert lease is not None and lease["spec"].get("holderIdentity") is None


def test_readiness_is_reported_once_the_watches_are_filled(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``started`` is set once every watched kind is listed, not before."""
    seen: dict[str, Any] = {}

    async def run_informer(self: Informer) -> None:
        seen["before"] = started.is_set()
        self.on_ready(self.stores)  # every kind listed
        for _ in range(100):  # a few turns of the loop for the readiness callback
            if started.is_set():
                break
            await asyncio.sleep(0)
        seen["started"] = started.is_set()

    monkeypatch.setattr(runner.Informer, "run", run_informer)
    started = threading.Event()
    run(options(leader_election=False), started=started)
    assert seen == {"before": False, "started": True}


# -- run_operator: health and metrics servers around the run ---------------------------------


def test_run_operator_serves_health_and_metrics_and_stops_them(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    health_port, metrics_port = free_port(), free_port()
    seen: dict[str, Any] = {}

    async def run_informer(self: Informer) -> None:
        def get(url: str) -> str:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return str(resp.read().decode())

        seen["health"] = await asyncio.to_thread(get, f"http://127.0.0.1:{health_port}/healthz")
        seen["metrics"] = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics_port}/metrics")

    monkeypatch.setattr(runner.Informer, "run", run_informer)
    metrics = PrometheusMetrics()
    opts = options(
        health_endpoint=f"http://127.0.0.1:{health_port}/healthz", metrics_port=metrics_port
    )
    assert run(opts, metrics=metrics) is not None
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


@pytest.mark.parametrize(("failure", "code"), [(None, 0), (RuntimeError("lost"), 1)])
def test_main_run_configures_from_flags_and_env(
    monkeypatch: pytest.MonkeyPatch, failure: Exception | None, code: int
) -> None:
    got: list[RunOptions] = []

    async def fake_run(options: RunOptions, api_config: Any, *, stop: asyncio.Event) -> None:
        got.append(options)
        if failure is not None:
            raise failure

    monkeypatch.setattr(runner, "run_operator", fake_run)
    monkeypatch.setattr(runner, "api_configuration", lambda _path: k8s.Configuration())
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
    assert (opts.lease_seconds, opts.renew_seconds) == (15, 5.0)
    assert not opts.apply_crd
