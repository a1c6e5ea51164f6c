"""The ComputeDomain controller's process (``gpu-operator compute-domain-controller``): the
Deployment the GPUCluster renders when ``draDriver.computeDomains`` is enabled, as NVIDIA's DRA
driver runs its controller.

One replica acts, holding its own Lease; its informer fills the loop's stores (every kind
listed before the first pass, so a first pass never prunes what it has not seen yet), and the
loop runs until SIGTERM, which hands the Lease over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from gpu_operator import logsetup
from gpu_operator.controller.computedomain.reconciler import WATCHED, ComputeDomainController
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.health import HealthServer
from gpu_operator.controller.runtime.informer import Informer
from gpu_operator.controller.runtime.leader import LeaderElector, acquire_unless_stopped
from gpu_operator.controller.runtime.liveness import OK
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.watch import Stores
from gpu_operator.kube import Kube, api_configuration
from gpu_operator.render.computedomain import DaemonSettings

log = logging.getLogger(__name__)

LEASE = "compute-domain-controller"


@dataclass(frozen=True)
class ControllerOptions:
    """How one controller process runs: where, as whom, with which daemons."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    settings: DaemonSettings = field(default_factory=DaemonSettings)
    leader_election: bool = True
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_seconds: int = 30
    health_endpoint: str | None = None


async def run_controller(
    options: ControllerOptions, api_config: k8s.Configuration, stop: asyncio.Event
) -> None:
    """Run the ComputeDomain loop until ``stop`` is set or leadership is lost (raised)."""
    kube = Kube(k8s.ApiClient(api_config))
    metrics = PrometheusMetrics()
    health = None
    if options.health_endpoint:
        health = HealthServer(options.health_endpoint, lambda: metrics.role, lambda: OK)
        await health.start()
    elector = None
    try:
        if options.leader_election:
            elector = LeaderElector(
                Kube(k8s.ApiClient(api_config)),
                options.config.namespace,
                options.identity,
                name=LEASE,
                lease_seconds=options.lease_seconds,
                renew_seconds=max(1.0, options.lease_seconds / 6),
            )
            if not await acquire_unless_stopped(elector, stop):
                return
        metrics.set_leading(True)
        await _lead(options, kube, metrics, stop, elector)
    finally:
        metrics.set_leading(False)
        if health is not None:
            await health.stop()


async def _lead(
    options: ControllerOptions,
    kube: Kube,
    metrics: PrometheusMetrics,
    stop: asyncio.Event,
    elector: LeaderElector | None,
) -> None:
    controller = ComputeDomainController(kube, options.config, metrics, options.settings)

    stores: Stores = {}
    informer = Informer(kube, options.config.namespace, WATCHED, stores, controller.notify)

    async def filled() -> None:
        await informer.ready.wait()
        controller.watching(stores)

    tasks = {
        asyncio.create_task(informer.run(), name="informer"),
        asyncio.create_task(controller.loop.run(), name="computedomain"),
        asyncio.create_task(stop.wait(), name="stop"),
    }
    if elector is not None:
        tasks.add(asyncio.create_task(elector.hold(), name="lease"))
    filling = asyncio.create_task(filled(), name="filling")
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    filling.cancel()
    kube.fence.set()  # not one more write, whatever ended the run
    for task in pending:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(asyncio.gather(*pending, filling, return_exceptions=True), 10)
    if elector is not None and not any(t.get_name() == "lease" for t in done):
        await elector.hand_over()
    ended = [t for t in done if t.get_name() != "stop"]
    if ended and not stop.is_set():
        task = ended[0]
        error = None if task.cancelled() else task.exception()
        raise RuntimeError(f"{task.get_name()} ended: {error or 'leadership lost'}")


def settings_from_env(namespace: str, image: str) -> DaemonSettings:
    """The daemons' settings from the Deployment's environment: NVIDIA's variable names
    (LOG_VERBOSITY_CD_DAEMON, CD_DAEMON_IMAGE_PULL_SECRET_NAMES, CD_DAEMON_PRIORITY_CLASS_NAME)
    and IMEX_DAEMON_IMAGE, which, when set, runs NVIDIA's daemon from that image instead of
    the stand-in from this project's. A bad number raises ValueError naming the variable."""
    env = os.environ
    overrides: dict[str, Any] = {
        "image_pull_policy": env.get("IMAGE_PULL_POLICY") or "IfNotPresent",
        "image_pull_secrets": tuple(
            s for s in (env.get("CD_DAEMON_IMAGE_PULL_SECRET_NAMES") or "").split(",") if s
        ),
        "priority_class_name": env.get("CD_DAEMON_PRIORITY_CLASS_NAME") or None,
    }
    for name, key in (
        ("LOG_VERBOSITY_CD_DAEMON", "log_verbosity"),
        ("MAX_NODES_PER_IMEX_DOMAIN", "max_nodes_per_imex_domain"),
    ):
        text = env.get(name)
        if text:
            try:
                overrides[key] = int(text)
            except ValueError:
                raise ValueError(f"{name}={text!r}: must be a whole number") from None
    nvidia_image = env.get("IMEX_DAEMON_IMAGE")
    if nvidia_image:
        return DaemonSettings.nvidia(namespace, nvidia_image, **overrides)
    return DaemonSettings(namespace=namespace, image=image, **overrides)


def main(
    *,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
    leader_election: bool,
    health_port: int,
    log_format: str | None = None,
) -> int:
    """``gpu-operator compute-domain-controller``: until SIGTERM/SIGINT, then hand the Lease
    over and exit 0; 1 when it stopped for another reason (the kubelet restarts it)."""
    logsetup.configure(fmt=log_format)
    ns = namespace or os.environ.get("NAMESPACE") or os.environ.get("OPERATOR_NAMESPACE")
    ns = ns or "gpu-operator"
    image = os.environ.get("IMAGE_NAME") or OperatorConfig().operator_image
    options = ControllerOptions(
        config=OperatorConfig(namespace=ns, operator_image=image),
        settings=settings_from_env(ns, image),
        leader_election=leader_election,
        health_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
    )
    api_config = api_configuration(kubeconfig, context)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_controller(options, api_config, stop)

    try:
        asyncio.run(run())
    except RuntimeError as exc:
        log.error("stopping: %s", exc)
        return 1
    return 0
