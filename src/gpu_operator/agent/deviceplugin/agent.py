"""The device-plugin agent: the imperative shell around the pure device map and allocation.

It keeps one :class:`PluginServer` per advertised resource and three loops running:

- the kubelet watch: the kubelet deletes plugin sockets and recreates ``kubelet.sock`` when it
  restarts; when the socket's identity changes (or a plugin socket vanished) the servers are
  restarted and registered again. Polled (1 s), as the standard library has no inotify.
- the health watch: XID events from NVML become faults (see :mod:`health` for the rule) and
  ListAndWatch streams send the new health; quiet faults on GPUs that answer NVML clear.
- the Node watch (with a config directory or the health monitor, and a Node to watch): the
  node label ``nvidia.com/device-plugin.config`` picks the config, a change switches without
  a restart; the health monitor gets the Node's reset request and ``GPUHealthy`` condition.
- with a :class:`~gpu_operator.agent.gpuhealth.monitor.HealthMonitor` (GPU_HEALTH_CONDITION):
  the health watch also polls it with the same XIDs, GPUs it finds unhealthy are Unhealthy in
  ListAndWatch too, and a publish loop keeps the Node's ``GPUHealthy`` condition current.

:meth:`DevicePluginAgent.apply` is the one way the advertised set changes: it computes the
whole desired set first (any error leaves everything as it was), then stops the servers whose
resource went away or changed and starts and registers the new ones.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from gpu_operator.agent import nodeapi
from gpu_operator.agent.deviceplugin import cdi, health, mps
from gpu_operator.agent.deviceplugin.config_file import (
    DevicePluginConfig,
    load_device_plugin_config,
)
from gpu_operator.agent.deviceplugin.configs import ConfigDir
from gpu_operator.agent.deviceplugin.resources import Device, device_map
from gpu_operator.agent.deviceplugin.server import Advertised, PluginServer, ResourceState
from gpu_operator.agent.deviceplugin.settings import PluginSettings, plugin_settings
from gpu_operator.agent.deviceplugin.topology import read_locality
from gpu_operator.agent.driver_cdi import HostDriver, find_host_driver
from gpu_operator.agent.gpuhealth.monitor import HealthMonitor, KubeNode
from gpu_operator.agent.gpuhealth.settings import HealthSettings
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml, NvmlError, current_driver_root
from gpu_operator.agent.podresources import attributions_from_kubelet
from gpu_operator.stopping import wait_until
from gpu_operator.textfiles import FileProblem

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

KUBELET_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
CDI_ROOT = Path("/var/run/cdi")
EVENT_COMPONENT = "nvidia-device-plugin"


@dataclass(frozen=True)
class Paths:
    kubelet_socket: Path = KUBELET_SOCKET
    cdi_root: Path = CDI_ROOT
    sysfs: Path = Path("/sys")
    # The MPS root as mounted here: MPS replicas stay Unhealthy until the control daemon's
    # ``<resource>/.started`` is there, as NVIDIA's plugin waits for it. None: do not wait.
    mps_dir: Path | None = None
    # The kubelet's PodResources socket: who holds a GPU that turns Unhealthy is reported.
    pod_resources_socket: Path | None = None

    @property
    def socket_dir(self) -> Path:
        return self.kubelet_socket.parent


@dataclass(frozen=True)
class HealthOptions:
    policy: health.XidPolicy = field(default_factory=health.XidPolicy)
    recovery_s: float = health.DEFAULT_RECOVERY_S
    poll_s: float = 0.5  # also the longest NVML is asked to wait for an event


def server_changes(
    current: Mapping[str, Advertised], desired: Mapping[str, Advertised]
) -> tuple[list[str], list[str]]:
    """(resources to stop, resources to start): unchanged ones are left serving."""
    stop = [n for n, a in current.items() if desired.get(n) != a]
    start = [n for n, a in desired.items() if current.get(n) != a]
    return sorted(stop), sorted(start)


def _socket_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


def find_driver(settings: PluginSettings) -> HostDriver:
    """The driver this plugin hands to containers: found where this container has the driver
    root (where NVML is loaded from), named by its host paths (NVIDIA_DRIVER_ROOT)."""
    driver, missing = find_host_driver(
        current_driver_root(), settings.driver_root, settings.dev_root
    )
    if missing is not None:
        log.warning("CDI specs carry no driver files: %s", missing)
    return driver


class DevicePluginAgent:
    """The device plugin on one node: serves each advertised resource (whole GPUs, MIG
    devices, time-sliced or MPS replicas) to the kubelet, re-registers when the kubelet
    restarts, marks GPUs unhealthy on fatal XIDs or a lost GPU (and, with GPU health on,
    reports them through the GPUHealthy condition), and switches configs when the node's
    config label changes."""

    def __init__(
        self,
        nvml: Nvml,
        *,
        paths: Paths = Paths(),
        overrides: Mapping[str, str | None] | None = None,
        health_options: HealthOptions = HealthOptions(),
        kubelet_poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        find_driver: Callable[[PluginSettings], HostDriver] = find_driver,
        report: Callable[[str, str, str], None] | None = None,
        monitor: HealthMonitor | None = None,
    ) -> None:
        self.nvml = nvml
        self.monitor = monitor  # the GPUHealthy condition's, sharing the health watch's XIDs
        self.report = report  # (type, reason, message): a Node Event where there is an API
        self.paths = paths
        self.overrides = dict(overrides or {})
        self.health_options = health_options
        self.kubelet_poll_s = kubelet_poll_s
        self.clock = clock
        self._find_driver = find_driver
        self._driver: HostDriver | None = None  # as the last spec written (or Allocate) saw it
        self._settings = PluginSettings()
        self._lock = threading.RLock()
        self._servers: dict[str, PluginServer] = {}
        self._faults: dict[health.FaultKey, health.Fault] = {}
        self._node_unhealthy: frozenset[str] = frozenset()  # GPUs the monitor finds unhealthy
        self._mps_waiting: set[str] = set()
        self._inventory = Inventory(driver_version="", cuda_driver_version=0)
        self._devices: list[Device] = []
        self._kubelet = _socket_identity(paths.kubelet_socket)
        self._label: str | None = None
        self._failed: tuple[str | None] | None = None  # the label whose switch failed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- the advertised set ----------------------------------------------------------------------
    def apply(self, config: DevicePluginConfig) -> dict[str, int]:
        """Advertise what ``config`` makes of the node's GPUs; returns resource -> count.
        Raises DevicePluginConfigError or ResourceError, and then nothing changed."""
        settings = plugin_settings(config, self.overrides)
        inventory = self.nvml.inventory()
        devices = device_map(inventory, config, settings.mig_strategy)
        locality = {g.uuid: read_locality(g.pci_bus_id, self.paths.sysfs) for g in inventory.gpus}
        desired = {
            name: Advertised(name, found, settings, config.sharing, locality)
            for name, found in devices.items()
        }
        with self._lock:
            self._inventory = inventory
            self._settings = settings
            self._devices = [d for found in devices.values() for d in found]
            self._driver = None
            if settings.cdi_enabled:
                self.driver()
            else:
                cdi.remove_spec(self.paths.cdi_root)
            current = {n: s.state.advertised for n, s in self._servers.items()}
            stop, start = server_changes(current, desired)
            for name in stop:
                self._servers.pop(name).stop()
            for name in start:
                self._servers[name] = self._serve(desired[name])
        if stop or start:
            log.info(
                "advertising %s",
                ", ".join(f"{n}: {len(d)}" for n, d in devices.items()) or "nothing",
            )
        return {name: len(found) for name, found in devices.items()}

    def driver(self) -> HostDriver:
        """The driver as it is now (the servers ask at every Allocate); with CDI on, the spec
        is rewritten when it changed, so a driver upgrade's new files reach new containers."""
        with self._lock:
            driver = self._find_driver(self._settings)
            if self._settings.cdi_enabled and driver != self._driver:
                cdi.write_spec(self.paths.cdi_root, cdi.cdi_spec(self._devices, driver))
            self._driver = driver
            return driver

    def _serve(self, advertised: Advertised) -> PluginServer:
        unhealthy = self._unhealthy(advertised, self._faults)
        server = PluginServer(
            ResourceState(advertised, unhealthy), self.paths.socket_dir, self.driver
        ).start()
        self._register(server)
        return server

    def _register(self, server: PluginServer) -> None:
        if not self.paths.kubelet_socket.exists():
            return
        try:
            server.register(self.paths.kubelet_socket)
        except grpc.RpcError as exc:
            log.warning("registering %s with the kubelet failed: %s", server.resource, exc)

    def advertised(self) -> dict[str, Advertised]:
        with self._lock:
            return {n: s.state.advertised for n, s in self._servers.items()}

    # -- kubelet restarts ------------------------------------------------------------------------
    def check_kubelet(self) -> None:
        """Restart servers whose socket vanished, or all of them when the kubelet restarted,
        and register every server the kubelet does not know yet."""
        identity = _socket_identity(self.paths.kubelet_socket)
        with self._lock:
            restarted = identity is not None and identity != self._kubelet
            self._kubelet = identity
            if restarted:
                log.info(
                    "kubelet socket %s (re)created: registering again", self.paths.kubelet_socket
                )
            for name, server in list(self._servers.items()):
                if restarted or not server.serving:
                    advertised, unhealthy = server.state.advertised, server.state.unhealthy
                    server.stop()
                    server = PluginServer(
                        ResourceState(advertised, unhealthy), self.paths.socket_dir, server.driver
                    ).start()
                    self._servers[name] = server
                if identity is not None and not server.registered:
                    self._register(server)

    # -- health ----------------------------------------------------------------------------------
    def check_health(self) -> None:
        """One pass: wait briefly for XIDs, record those that count, clear recovered faults."""
        options = self.health_options
        with self._lock:
            inventory = self._inventory
        gpus = {g.index: g.uuid for g in inventory.gpus}
        events = []
        if (options.policy.watches or self.monitor is not None) and gpus:
            events = self.nvml.xid_events(sorted(gpus), int(options.poll_s * 1000))
        node_unhealthy = self._node_unhealthy
        if self.monitor is not None:
            try:  # the XIDs just read still count for the devices below
                node_unhealthy = self.monitor.poll(inventory, events)
            except Exception:
                log.exception("GPU health check failed")
        now = self.clock()
        marked: list[tuple[str, int, int]] = []
        with self._lock:
            faults = dict(self._faults)
            for event in events:
                gpu_uuid = gpus.get(event.gpu_index)
                if gpu_uuid is None:
                    continue
                if not options.policy.counts(event.xid):
                    log.info("XID %d on GPU %d ignored for health", event.xid, event.gpu_index)
                    continue
                log.warning("XID %d on GPU %d: marking it unhealthy", event.xid, event.gpu_index)
                key = health.fault_key(gpu_uuid, event.gi_id, event.ci_id)
                faults = health.record(faults, key, event.xid, now)
                marked.append((gpu_uuid, event.gpu_index, event.xid))
            for key in health.due_for_probe(faults, now, options.recovery_s):
                if self._answers(key[0], gpus):
                    log.info(
                        "GPU %s: no XID for %.0f s and NVML answers: healthy",
                        key[0],
                        options.recovery_s,
                    )
                    del faults[key]
            self._faults = faults
            self._node_unhealthy = node_unhealthy
            for server in self._servers.values():  # a no-op unless something changed
                server.state.set_unhealthy(self._unhealthy(server.state.advertised, faults))
        for gpu_uuid, index, xid in marked:
            self._report_holders(gpu_uuid, index, xid)

    def _report_holders(self, gpu_uuid: str, index: int, xid: int) -> None:
        """Name the containers that hold a GPU (or its MIG devices) just marked Unhealthy: the
        kubelet will not take the GPU from them, so someone has to look."""
        socket = self.paths.pod_resources_socket
        if socket is None:
            return
        holders = attributions_from_kubelet(str(socket))
        if not holders:
            return
        with self._lock:
            ids = {gpu_uuid} | {
                d.uuid
                for s in self._servers.values()
                for d in s.state.advertised.devices
                if d.gpu_uuid == gpu_uuid
            }
        found = sorted(
            {h for i in ids for h in holders.get(i, [])},
            key=lambda h: (h.namespace, h.pod, h.container),
        )
        if not found:
            return
        message = f"XID {xid} on GPU {index} ({gpu_uuid}): Unhealthy while in use by " + ", ".join(
            f"pod {h.namespace}/{h.pod} container {h.container}" for h in found
        )
        log.warning("%s", message)
        if self.report is not None:
            self.report("Warning", "GPUUnhealthyInUse", message)

    def _unhealthy(
        self, advertised: Advertised, faults: Mapping[health.FaultKey, health.Fault]
    ) -> frozenset[str]:
        """The ids faults cover (and every id on a GPU the health monitor finds unhealthy), or
        every id while the resource's MPS daemon is not ready."""
        ids = health.unhealthy_ids(advertised.devices, faults) | {
            d.id for d in advertised.devices if d.gpu_uuid in self._node_unhealthy
        }
        if self.paths.mps_dir is None or advertised.sharing.strategy != "mps":
            return ids
        if not any(d.replica is not None for d in advertised.devices):
            return ids
        started = mps.ResourceDirs(self.paths.mps_dir, advertised.resource).started
        if started.exists():
            self._mps_waiting.discard(advertised.resource)
            return ids
        if advertised.resource not in self._mps_waiting:
            self._mps_waiting.add(advertised.resource)
            log.warning(
                "%s: its replicas are Unhealthy until the MPS control daemon is ready (%s)",
                advertised.resource,
                started,
            )
        return frozenset(d.id for d in advertised.devices)

    def _answers(self, gpu_uuid: str, gpus: Mapping[int, str]) -> bool:
        index = next((i for i, u in gpus.items() if u == gpu_uuid), None)
        if index is None:
            return False
        try:
            return self.nvml.gpu(index).uuid == gpu_uuid
        except NvmlError:
            return False

    # -- config switching ------------------------------------------------------------------------
    def switch(
        self, label: str | None, configs: ConfigDir, *, report: Callable[[str, str, str], None]
    ) -> bool:
        """Apply the config the node label selects; a bad choice is reported and changes
        nothing. ``report(type, reason, message)`` records it (a Node Event)."""
        if label == self._label:
            self._failed = None  # back to what is applied: a later try of a bad label reports
            return False
        if self._failed == (label,):
            return False  # refused already: reported once, not on every Node update
        try:
            name, config = configs.choose(label)
            counts = self.apply(config)
        except (ValueError, OSError, NvmlError) as exc:
            log.error("device-plugin config not switched: %s", exc)
            self._failed = (label,)
            report("Warning", "DevicePluginConfigFailed", str(exc))
            return False
        self._label, self._failed = label, None
        summary = ", ".join(f"{n}: {c}" for n, c in counts.items()) or "no devices"
        report("Normal", "DevicePluginConfigApplied", f"config {name or '(empty)'}: {summary}")
        return True

    def watch_node(
        self,
        api: Kube,
        node: str,
        configs: ConfigDir | None,
        *,
        resync_s: int = 300,
        retry_s: float = 5.0,
    ) -> None:
        """Follow the Node until :meth:`stop` (runs in its own thread): its config label (with
        ``configs``), and for the health monitor its reset request and condition."""

        def report(etype: str, reason: str, message: str) -> None:
            nodeapi.record_node_event(api, node, etype, reason, message, component=EVENT_COMPONENT)

        while not self._stop.is_set():
            try:
                view, conditions = nodeapi.read_node_conditions(api, node)
            except Exception as exc:  # API hiccups: log, back off, retry
                log.warning("reading node %s failed: %s", node, exc)
                self._stop.wait(retry_s)
                continue
            if configs is not None:
                self.switch(view.labels.get(configs.label_key) or None, configs, report=report)
            if self.monitor is not None:
                self.monitor.on_node(view, conditions)
            if not nodeapi.wait_for_node_change(api, node, view.resource_version, resync_s):
                self._stop.wait(retry_s)

    def adopt_label(self, label: str | None) -> None:
        """The label the start-up config was chosen by (a switch to it is then a no-op)."""
        self._label = label

    # -- lifecycle -------------------------------------------------------------------------------
    def _loop(self, step: Callable[[], None], interval_s: float, what: str) -> None:
        while not self._stop.is_set():
            started = self.clock()
            try:
                step()
            except Exception:
                log.exception("%s failed", what)
            self._stop.wait(max(0.0, interval_s - (self.clock() - started)))

    def start(self, *, watch: Callable[[], None] | None = None) -> DevicePluginAgent:
        """Run the kubelet and health loops (the monitor's publish loop, and ``watch``, e.g. the
        Node watch) in threads."""
        loops: list[tuple[str, Callable[[], None]]] = [
            (
                "kubelet watch",
                lambda: self._loop(self.check_kubelet, self.kubelet_poll_s, "kubelet check"),
            ),
            (
                "health watch",
                lambda: self._loop(self.check_health, self.health_options.poll_s, "health check"),
            ),
        ]
        if self.monitor is not None:
            monitor = self.monitor
            loops.append(
                (
                    "health publish",
                    lambda: self._loop(monitor.publish, self.health_options.poll_s, "publish"),
                )
            )
        if watch is not None:
            loops.append(("node watch", watch))
        for name, target in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.name != "node watch":  # may sit in a watch until its timeout; daemon
                thread.join(timeout=10)
        with self._lock:
            for server in self._servers.values():
                server.stop()
            self._servers.clear()

    @property
    def stopping(self) -> threading.Event:
        return self._stop


def run_device_plugin(
    *,
    stop: threading.Event,
    paths: Paths = Paths(),
    overrides: Mapping[str, str | None] | None = None,
    health_options: HealthOptions = HealthOptions(),
    config_file: str | None = None,
    configs: ConfigDir | None = None,
    node: str | None = None,
    api: Kube | None = None,
    gpu_health: HealthSettings | None = None,
) -> int:
    """The agent's life: pick the config, open NVML, advertise, follow the kubelet, health and
    the Node (config label; with ``gpu_health`` the GPUHealthy condition and reset requests)
    until ``stop`` is set. Returns the process exit code; what it cannot start with (no
    device-plugin directory, the Node unreadable, a bad config, NVML failing with
    failOnInitError) it raises, for the command line to explain in one line."""
    if not paths.socket_dir.is_dir():
        raise FileProblem(
            paths.socket_dir,
            "does not exist",
            "mount the kubelet's device-plugin directory there (or point --kubelet-socket at "
            "the kubelet's socket)",
        )
    label: str | None = None
    if configs is not None and api is not None and node:
        label = nodeapi.read_node(api, node).labels.get(configs.label_key) or None
    if configs is not None:
        name, config = configs.choose(label)
        log.info("device-plugin config %s", name or "(empty: defaults)")
    else:
        config = load_device_plugin_config(config_file)
    settings = plugin_settings(config, overrides)
    nvml = Nvml()
    try:
        nvml.open()
    except NvmlError as exc:
        if settings.fail_on_init_error:
            raise  # failOnInitError is true: no driver, no plugin (exit 4, no usable driver)
        log.warning("%s; advertising no devices (failOnInitError is false)", exc)
        wait_until(stop)
        return 0
    report = None
    if api is not None and node:
        event_api, event_node = api, node

        def report(etype: str, reason: str, message: str) -> None:
            nodeapi.record_node_event(
                event_api, event_node, etype, reason, message, component=EVENT_COMPONENT
            )

    monitor = _monitor(nvml, gpu_health, api, node)
    agent = DevicePluginAgent(
        nvml,
        paths=paths,
        overrides=overrides,
        health_options=health_options,
        report=report,
        monitor=monitor,
    )
    try:
        try:
            agent.apply(config)
        except ValueError as exc:
            log.error("%s", exc)
            return 1
        agent.adopt_label(label)
        if monitor is not None:
            monitor.prime(nvml.inventory())
        watch = None
        if (configs is not None or monitor is not None) and api is not None and node:
            watch_api, watch_node, watch_configs = api, node, configs

            def watch() -> None:
                agent.watch_node(watch_api, watch_node, watch_configs)

        agent.start(watch=watch)
        wait_until(stop)
        return 0
    finally:
        agent.stop()
        nvml.close()


def _monitor(
    nvml: Nvml, settings: HealthSettings | None, api: Kube | None, node: str | None
) -> HealthMonitor | None:
    """The GPUHealthy monitor, where asked for and possible. Its writes are not asked again
    by the client: the monitor retries on a later pass, and NVML's loop never waits on them."""
    if settings is None:
        return None
    if api is None or not node:
        log.error("GPU_HEALTH_CONDITION needs the node's name (NODE_NAME) and the API server")
        return None
    from gpu_operator.kube import NO_RETRY

    return HealthMonitor(nvml, KubeNode(api.with_retry(NO_RETRY), node, EVENT_COMPONENT), settings)
