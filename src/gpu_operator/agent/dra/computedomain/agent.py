"""``gpu-operator agent compute-domain-plugin``: serve the kubelet, publish the node's pool, keep
its ``nvidia.com/gpu.clique`` label.

The pool never changes (:func:`decide.pool_devices`), so it is written at start, after each
registration by the kubelet (which deletes a driver's slices when it starts and 30 s after the
driver goes) and at every resync, when the node's labels are read again and the directories of
domains that are gone are removed. The clique is read from NVML at start (a fabric that is
there but not usable stops the plugin, as NVIDIA's does with CrashOnNVLinkFabricErrors, its
default) and again every ``clique_s``; a clique that changes is labelled at once, one that
cannot be read keeps the last, as NVIDIA's plugin does. In the DRA-only stack no feature
discovery runs, so this plugin is what labels the clique, which the controller's ComputeDomain
status and the daemons read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_operator.agent.dra import healthcheck, slices
from gpu_operator.agent.dra.agent import execute, existing_slices, node_owner
from gpu_operator.agent.dra.computedomain import decide
from gpu_operator.agent.dra.computedomain.plugin import DomainPlugin, HostFiles, Waiting
from gpu_operator.agent.dra.server import PluginPaths
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.agent.nvml import FabricError
from gpu_operator.labels import GPU_CLIQUE

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)


@dataclass
class DomainPluginOptions:
    node: str
    paths: PluginPaths
    interval_s: float = 5.0  # how soon a registration by the kubelet is answered with slices
    resync_s: float = 300.0  # slices and node labels read again this often
    clique_s: float = 600.0  # NVIDIA's clique refresh
    healthcheck_port: int = healthcheck.DEFAULT_PORT  # negative: no health service
    files: HostFiles = field(default_factory=HostFiles)
    waiting: Waiting = field(default_factory=Waiting)


def publish(
    kube: Kube, node: str, owner: Mapping[str, str] | None, existing: list[dict[str, Any]]
) -> slices.SlicePlan:
    """Write the node's pool where ``existing`` (this driver's slices of it) is not it."""
    plan = slices.plan(node, existing, decide.pool_devices(), owner, driver=decide.DRIVER)
    execute(kube, plan)
    if plan.writes:
        log.info("published %s's %s pool, generation %d", node, decide.DRIVER, plan.generation)
    return plan


def label_clique(kube: Kube, node: str, labels: dict[str, str], clique: str | None) -> None:
    """Make the node's clique label say ``clique``; ``labels`` (the node's, as last read) are
    updated to what was written."""
    patch = decide.clique_label(labels, clique)
    if patch is None:
        return
    kube.merge_patch("Node", node, patch)
    if clique is None:
        labels.pop(GPU_CLIQUE, None)
        log.info("node %s has no NVLink clique: label %s removed", node, GPU_CLIQUE)
    else:
        labels[GPU_CLIQUE] = clique
        log.info("labelled node %s %s=%s", node, GPU_CLIQUE, clique)


def start_error(exc: FabricError) -> FabricError:
    """The clique read at start failed: what the plugin stops with (one line)."""
    return FabricError(
        f"{exc}: the node's NVLink fabric is not usable, so no IMEX channel can be prepared; "
        "see nvidia-smi -q (Fabric) and the fabric manager on the node, then restart the plugin",
        exc.gpu,
    )


def run(
    kube: Kube,
    read_clique: Callable[[], str | None],
    options: DomainPluginOptions,
    stop: threading.Event,
    driver: Callable[[], HostDriver],
) -> int:
    """Serve the kubelet and keep the pool and the clique label until ``stop``."""
    try:
        clique = {"now": read_clique()}
    except FabricError as exc:
        raise start_error(exc) from None
    log.info("node %s: NVLink clique %s", options.node, clique["now"] or "none")
    plugin = DomainPlugin(
        kube,
        options.node,
        options.paths,
        lambda: clique["now"],
        driver,
        options.files,
        options.waiting,
    )
    plugin.start()
    health = None
    if options.healthcheck_port >= 0:
        health, _ = healthcheck.serve(
            options.healthcheck_port, lambda: healthcheck.plugin_answers(plugin.paths)
        )
    try:
        return _loop(kube, read_clique, options, stop, plugin, clique)
    finally:
        if health is not None:
            health.stop(grace=None).wait()
        plugin.stop()


def _loop(
    kube: Kube,
    read_clique: Callable[[], str | None],
    options: DomainPluginOptions,
    stop: threading.Event,
    plugin: DomainPlugin,
    clique: dict[str, str | None],
) -> int:
    node = options.node
    owner = node_owner(kube, node)
    labels: dict[str, str] | None = None  # the node's, as last read
    resync_at = 0.0
    clique_at = time.monotonic() + options.clique_s
    registered = 0
    while True:
        now = time.monotonic()
        accepted = sum(1 for ok, _ in plugin.registrations.statuses if ok)
        if accepted > registered:  # the kubelet may have wiped the slices: publish at once
            registered, resync_at = accepted, now
        if now >= clique_at:
            clique_at = now + options.clique_s
            try:
                found = read_clique()
            except FabricError as exc:
                log.error("reading the NVLink clique (keeping %s): %s", clique["now"], exc)
            else:
                if found is not None and found != clique["now"]:
                    log.info("NVLink clique changed from %s to %s", clique["now"], found)
                    clique["now"] = found
        try:
            if labels is None or now >= resync_at:
                publish(kube, node, owner, existing_slices(kube, node, decide.DRIVER))
                obj = kube.get("Node", node) or {}
                labels = dict((obj.get("metadata") or {}).get("labels") or {})
                live = {
                    str((d.get("metadata") or {}).get("uid"))
                    for d in kube.list_objects("ComputeDomain")
                }
                for uid in plugin.remove_stale_domain_dirs(live):
                    log.info("removed the directory of ComputeDomain %s (gone)", uid)
                resync_at = now + options.resync_s
            label_clique(kube, node, labels, clique["now"])
        except Exception:  # the API server restarts; the next pass reads again
            log.exception("publishing node %s's %s pool and labels", node, decide.DRIVER)
            labels = None
        if stop.wait(options.interval_s):
            return 0
