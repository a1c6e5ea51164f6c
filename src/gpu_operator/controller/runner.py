"""Start and stop the whole operator: CRD, leadership, the watches (kopf for the CRDs, the
informer for built-in kinds), the reconcile loops."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client as k8s
from prometheus_client import start_http_server

from gpu_operator import logsetup
from gpu_operator.controller.clusterpolicy.reconciler import ClusterPolicyController
from gpu_operator.controller.gpucluster.reconciler import GPUClusterController
from gpu_operator.controller.nvidiadriver.reconciler import NVIDIADriverController
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.crd_install import ensure_crd
from gpu_operator.controller.runtime.health import HealthServer
from gpu_operator.controller.runtime.informer import Informer
from gpu_operator.controller.runtime.leader import LeaderElector, acquire_unless_stopped
from gpu_operator.controller.runtime.liveness import OK, Verdict, Watchdog
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.process import name_os_thread, named_pool
from gpu_operator.controller.runtime.watch import (
    INFORMED,
    ObjectKey,
    Stores,
    Watched,
    build_registry,
    configure,
    connection_info,
    kopf_caught_up,
)
from gpu_operator.kube import Kube, api_configuration
from gpu_operator.stopping import wait_until

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    config: OperatorConfig = field(default_factory=OperatorConfig)
    apply_crd: bool = True
    leader_election: bool = True
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    health_endpoint: str | None = "http://0.0.0.0:8080/healthz"
    metrics_port: int | None = 8081
    lease_seconds: int = 30
    renew_seconds: float = 5.0
    stall_seconds: float = 900.0  # a pass running longer means the operator is stuck


class OperatorStopped(RuntimeError):
    """The operator stopped for another reason than being asked to (exit non-zero)."""


async def run_operator(
    options: RunOptions,
    api_config: k8s.Configuration,
    *,
    stop: asyncio.Event | None = None,
    started: threading.Event | None = None,
    metrics: PrometheusMetrics | None = None,
) -> ClusterPolicyController | None:
    """Run until ``stop`` is set (graceful), leadership is lost, or something fails."""
    stop = stop or asyncio.Event()
    metrics = metrics or PrometheusMetrics()
    kube = Kube(k8s.ApiClient(api_config))
    server = None
    if options.metrics_port is not None:
        server, _ = start_http_server(options.metrics_port, registry=metrics.registry)
    health = None
    watchdog: list[Watchdog] = []  # the leader's, once it leads

    def verdict() -> Verdict:
        return watchdog[0].look() if watchdog else OK

    try:
        if options.health_endpoint is not None:
            health = HealthServer(options.health_endpoint, lambda: metrics.role, verdict)
            await health.start()
        return await _run(options, api_config, kube, stop, started, metrics, watchdog)
    finally:
        metrics.set_leading(False)
        if health is not None:
            await health.stop()
        if server is not None:
            server.shutdown()
            server.server_close()


async def _run(
    options: RunOptions,
    api_config: k8s.Configuration,
    kube: Kube,
    stop: asyncio.Event,
    started: threading.Event | None,
    metrics: PrometheusMetrics,
    watchdog: list[Watchdog],
) -> ClusterPolicyController | None:
    config = options.config
    if options.apply_crd:
        await asyncio.to_thread(ensure_crd, kube)

    elector = None
    if options.leader_election:
        elector = LeaderElector(
            # Its own connection pool: a renewal never waits for, or opens, a connection the
            # reconcilers' calls hold (a new TLS handshake on a slow link costs round trips).
            Kube(k8s.ApiClient(api_config)),
            config.namespace,
            options.identity,
            lease_seconds=options.lease_seconds,
            renew_seconds=options.renew_seconds,
        )
        if not await acquire_unless_stopped(elector, stop):
            return None
    metrics.set_leading(True)

    controller = ClusterPolicyController(kube, config, metrics)
    gpuclusters = GPUClusterController(
        kube, config, metrics, controller.values, controller.set_dra_conflicts
    )
    controller.also_wake.append(gpuclusters.loop)
    drivers = NVIDIADriverController(kube, config, metrics)

    def notify_loops(watched: Watched, key: ObjectKey) -> None:
        if watched.index == "gpuclusters":  # only the GPUCluster loop reads them
            gpuclusters.loop.urgent.set()
            gpuclusters.loop.wake.set()
            return
        controller.notify(watched, key)
        drivers.notify(watched, key)

    stores: Stores = {}
    # Watches hold a connection each: their own client, so writes never wait for a free one.
    watch_config = copy.copy(api_config)
    watch_config.connection_pool_maxsize = len(INFORMED) + 2
    informer = Informer(
        Kube(k8s.ApiClient(watch_config)), config.namespace, INFORMED, stores, notify_loops
    )
    registry = build_registry(stores, notify_loops)
    watchdog.append(
        Watchdog(controller.loop, stall_s=options.stall_seconds, threads=informer.threads_alive)
    )

    async def filled() -> None:
        """The loops start once the informer and kopf have listed every kind."""
        await informer.ready.wait()
        await kopf_caught_up(kube, stores)
        controller.watching(stores)
        drivers.watching(stores)

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)

    @kopf.on.login(registry=registry)
    async def _login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(api_config)

    kopf_stop: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    tasks: set[asyncio.Task[Any]] = {
        asyncio.create_task(
            kopf.operator(
                registry=registry,
                namespaces=[config.namespace],
                standalone=True,
                stop_flag=kopf_stop,
            ),
            name="kopf",
        ),
        asyncio.create_task(informer.run(), name="informer"),
        asyncio.create_task(controller.loop.run(), name="reconcile"),
        asyncio.create_task(gpuclusters.loop.run(), name="gpucluster"),
        asyncio.create_task(drivers.loop.run(), name="nvidiadriver"),
        asyncio.create_task(stop.wait(), name="stop"),
    }
    tasks.add(asyncio.create_task(watchdog[0].run(), name="liveness"))
    if elector is not None:
        tasks.add(asyncio.create_task(elector.hold(), name="lease"))
    # Helpers that end with the operator: cancelled at its stop, not left to be destroyed
    # pending when the loop closes (asyncio's "Task was destroyed but it is pending!").
    helpers: list[asyncio.Task[Any]] = [asyncio.create_task(filled(), name="filling")]
    if started is not None:

        def report(task: asyncio.Task[Any]) -> None:
            if not task.cancelled():  # ready, not a stop before it
                started.set()

        helpers.append(asyncio.create_task(controller.loop.ready.wait(), name="started"))
        helpers[-1].add_done_callback(report)
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for helper in helpers:
        helper.cancel()
    # Asked to stop (SIGTERM), kopf may stop its watchers before our stop task runs: that is
    # a graceful stop, not a deaf operator.
    failure = "" if stop.is_set() else _failure(done)
    if failure:
        kube.fence.set()  # not one more write: another replica may lead soon
        log.error("stopping: %s", failure)
    if not kopf_stop.done():
        kopf_stop.set_result(None)
    for task in pending:
        if task.get_name() != "kopf":
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(
            asyncio.gather(*pending, *helpers, return_exceptions=True), timeout=10
        )
    kube.fence.set()
    if elector is not None and not any(t.get_name() == "lease" for t in done):
        await elector.hand_over()
    if failure:
        raise OperatorStopped(failure)
    return controller


def _failure(done: set[asyncio.Task[Any]]) -> str:
    """Why the operator must stop, unless it was asked to ("" then)."""
    reasons = []
    for task in done:
        name = task.get_name()
        if name == "stop":
            continue
        error = None if task.cancelled() else task.exception()
        if name == "lease" and error is None:
            reasons.append("leadership lost")
        elif name == "liveness" and error is None:
            reasons.append(f"deaf: {task.result()}")
        else:
            reasons.append(f"{name} ended: {error!r}")
    return "; ".join(sorted(reasons))


RESTART_DELAY_S = 1.0  # OperatorThread(restart=True): between a stop on its own and the next run


class OperatorThread:
    """The operator in a background thread with its own event loop (tests, demo, benchmarks).

    With ``restart``, an operator that stops on its own after it led (leadership lost, deaf:
    :class:`OperatorStopped`) runs again, as the kubelet restarts its Deployment's container;
    without it, it stays stopped with ``error`` set. Each stop on its own is in ``restarts``.
    """

    def __init__(
        self, options: RunOptions, api_config: k8s.Configuration, *, restart: bool = False
    ) -> None:
        self.options = options
        self.api_config = api_config
        self.restart = restart
        self.restarts: list[str] = []
        self.metrics = PrometheusMetrics()
        self.started = threading.Event()
        self.controller: ClusterPolicyController | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="gpu-operator", daemon=True)
        self._stop_asked = threading.Event()  # also wakes the wait between two runs
        self.ended = threading.Event()  # set once the thread has nothing left to run
        self.error: BaseException | None = None

    def _main(self) -> None:
        name_os_thread("gpu-operator")
        try:
            self._run_all()
        finally:
            self.ended.set()

    def _run_all(self) -> None:
        while self._run_once() and self.restart and not self._stop_asked.is_set():
            self.restarts.append(str(self.error))
            log.warning(
                "the operator stopped on its own (%s); running it again in %.0fs, as the kubelet "
                "would restart its container (restart %d)",
                self.error,
                RESTART_DELAY_S,
                len(self.restarts),
            )
            self.error = None
            if self._stop_asked.wait(RESTART_DELAY_S):
                break

    def _run_once(self) -> bool:
        """One run of the operator; whether it stopped on its own after it had led."""
        loop = self._loop = asyncio.new_event_loop()
        # asyncio's own pool, its threads named in the kernel: the requests' CPU apart from
        # the event loop's in ``top -H`` (and in benchmarks/bench_operator.py).
        loop.set_default_executor(named_pool("requests"))
        stop = self._stop = asyncio.Event()
        if self._stop_asked.is_set():  # asked before this loop existed (a SIGTERM at start-up)
            stop.set()
        led = self.started.is_set()
        try:
            self.controller = loop.run_until_complete(
                run_operator(
                    self.options,
                    self.api_config,
                    stop=stop,
                    started=self.started,
                    metrics=self.metrics,
                )
            )
        except BaseException as exc:  # surfaced to the test that started it
            self.error = exc
            led = led or self.started.is_set()
            self.started.set()
            return led and isinstance(exc, OperatorStopped)
        finally:
            # Join the worker threads of asyncio.to_thread, so none outlives the operator.
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
        return False

    def start(self, timeout: float = 60.0, *, wait: bool = True) -> OperatorThread:
        """Start; with ``wait`` block until it leads and its caches are filled."""
        self._thread.start()
        if not wait:
            return self
        if not self.started.wait(timeout):
            raise TimeoutError("operator did not start")
        if self.error is not None:
            raise RuntimeError("operator failed to start") from self.error
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask for a graceful stop (hand the Lease over); wait up to ``timeout`` for it."""
        self._stop_asked.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            # It may close between the check and the call: then it has stopped already.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def join(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` (None: until it ends) for the operator to end; whether it
        still runs."""
        self._thread.join(timeout)
        return self._thread.is_alive()


IMAGE_ENV_NAMES = (
    "DRIVER_IMAGE",
    "DRIVER_MANAGER_IMAGE",
    "CONTAINER_TOOLKIT_IMAGE",
    "DEVICE_PLUGIN_IMAGE",
    "GFD_IMAGE",
    "MIG_MANAGER_IMAGE",
    "DCGM_EXPORTER_IMAGE",
    "DCGM_IMAGE",
    "VALIDATOR_IMAGE",
)


def main_run(
    *,
    kubeconfig: str | None,
    namespace: str | None,
    apply_crd: bool,
    leader_election: bool,
    health_port: int,
    metrics_port: int,
    lease_seconds: int = 30,
    context: str | None = None,
    log_format: str | None = None,
) -> int:
    """``gpu-operator run``: until SIGTERM/SIGINT, then hand leadership over and exit.
    A bad LOG_LEVEL or LOG_FORMAT, or no credentials, fail it before anything starts."""
    import signal

    logsetup.configure(fmt=log_format)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    config = OperatorConfig(
        namespace=namespace or os.environ.get("OPERATOR_NAMESPACE", "gpu-operator"),
        operator_image=os.environ.get("OPERATOR_IMAGE", OperatorConfig().operator_image),
        image_env={k: os.environ[k] for k in IMAGE_ENV_NAMES if os.environ.get(k)},
        simulate_gpus=os.environ.get("GPU_OPERATOR_SIMULATE") or None,
    )
    options = RunOptions(
        config=config,
        apply_crd=apply_crd,
        leader_election=leader_election,
        health_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
        metrics_port=metrics_port or None,
        lease_seconds=lease_seconds,
        # Every sixth of the Lease: a renewal may then take up to half the Lease (the renew
        # deadline, two thirds, minus the period) before the holder gives up.
        renew_seconds=max(1.0, lease_seconds / 6),
    )
    api_config = api_configuration(kubeconfig, context)

    # In the main thread kopf takes SIGTERM itself and stops its watchers before the operator
    # hears of it, so a pod's graceful stop looked like a deaf operator (exit 1, writes fenced).
    # The operator runs in a thread of its own, as in the tests, and this thread takes the
    # signals: SIGTERM asks for the graceful stop, which hands the Lease over.
    operator = OperatorThread(options, api_config)

    def graceful(signum: int, _frame: object) -> None:
        log.info("%s: stopping, handing leadership over", signal.Signals(signum).name)
        operator.stop(timeout=0)

    before = {sig: signal.signal(sig, graceful) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        operator.start(wait=False)
        # Waking every second: the kernel may hand SIGTERM to any of the process's threads,
        # and then the handler runs only once the main thread wakes.
        wait_until(operator.ended)
        operator.join(None)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if operator.error is not None:
        log.error("%s", operator.error)
        return 1
    return 0
