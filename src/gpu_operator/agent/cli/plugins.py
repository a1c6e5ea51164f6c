"""``agent device-plugin`` (with ``--kwok-capacity`` for simulated kwok nodes), the SIMULATED
``agent mps-control-daemon``, ``agent dra-plugin`` and its ``agent mps-claim-daemon``, and
``agent compute-domain-plugin``: what hands GPUs and IMEX channels to pods."""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_operator.agent import nodeapi
from gpu_operator.agent.cli.common import (
    add_common,
    add_config_args,
    add_driver_root,
    add_node_name,
    config_dir,
    node_name,
    setup,
)
from gpu_operator.agent.deviceplugin.config_file import load_device_plugin_config
from gpu_operator.agent.deviceplugin.settings import ENV_NAMES as PLUGIN_ENV
from gpu_operator.agent.nvml import Nvml, NvmlError, simulated
from gpu_operator.cluster_args import add_cluster_options, credentials
from gpu_operator.stopping import stop_on_signals, wait_until
from gpu_operator.usage import UsageProblem

if TYPE_CHECKING:
    from gpu_operator.agent.gpuhealth import HealthSettings
    from gpu_operator.agent.gpuhealth.monitor import HealthMonitor
    from gpu_operator.agent.inventory import Inventory, XidEvent
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

CDI_ROOT_HELP = "where CDI specs are written for the container runtime (env CDI_ROOT)"
DEFAULT_PROC_DEVICES = "/proc/devices"


# -- device-plugin ------------------------------------------------------------------------------
def cmd_device_plugin(args: argparse.Namespace) -> int:
    from gpu_operator.agent.deviceplugin import agent as plugin
    from gpu_operator.agent.deviceplugin.health import xid_policy
    from gpu_operator.agent.gpuhealth import health_settings

    setup(args)
    node = node_name(args)
    configs = config_dir(args)
    gpu_health = health_settings(os.environ)
    stop = stop_on_signals()
    if args.kwok_capacity:
        return _kwok_capacity(args, node, configs, stop, gpu_health)
    return plugin.run_device_plugin(
        stop=stop,
        paths=plugin.Paths(
            kubelet_socket=Path(args.kubelet_socket),
            cdi_root=Path(args.cdi_root),
            sysfs=Path(args.sysfs_root),
            mps_dir=Path(args.mps_dir) if args.mps_dir else None,
            pod_resources_socket=(
                Path(args.pod_resources_socket) if args.pod_resources_socket else None
            ),
        ),
        overrides={env: getattr(args, env.lower()) for env in PLUGIN_ENV},
        health_options=plugin.HealthOptions(
            policy=xid_policy(
                os.environ.get("DP_DISABLE_HEALTHCHECKS"), os.environ.get("DP_ENABLE_HEALTHCHECKS")
            ),
            recovery_s=args.xid_recovery_seconds,
            poll_s=args.health_poll_ms / 1000.0,
        ),
        config_file=args.config_file,
        configs=configs,
        node=node,
        api=(
            nodeapi.connect(*credentials(args))
            if (configs is not None or gpu_health is not None) and node
            else None
        ),
        gpu_health=gpu_health,
    )


def _kwok_capacity(
    args: argparse.Namespace,
    node: str | None,
    configs: Any,
    stop: threading.Event,
    gpu_health: HealthSettings | None,
) -> int:
    """``device-plugin --kwok-capacity``: the simulated node's capacity instead of a kubelet;
    with ``gpu_health``, the GPUHealthy condition too, and unhealthy GPUs off allocatable."""
    from gpu_operator.agent.deviceplugin.capacity import counts, follow, set_capacity
    from gpu_operator.agent.deviceplugin.resources import device_map
    from gpu_operator.agent.deviceplugin.settings import plugin_settings

    if not args.simulate or not node:
        raise UsageProblem(
            "--kwok-capacity is for simulated kwok nodes",
            "it needs --simulate (or GPU_OPERATOR_SIMULATE) and the node's name (--node-name "
            "or NODE_NAME)",
        )
    overrides = {env: getattr(args, env.lower()) for env in PLUGIN_ENV}
    nvml = Nvml()
    nvml.open()
    api = nodeapi.connect(*credentials(args))
    inventory = [nvml.inventory()]  # the latest read that succeeded
    from gpu_operator.agent.deviceplugin.agent import EVENT_COMPONENT

    monitor = _health_monitor(nvml, api, node, gpu_health, inventory[0], EVENT_COMPONENT)

    def advertised(view: nodeapi.NodeView) -> tuple[dict[str, int], dict[str, int]]:
        if configs is not None:
            _, config = configs.choose(view.labels.get(configs.label_key) or None)
        else:
            config = load_device_plugin_config(args.config_file)
        settings = plugin_settings(config, overrides)
        try:
            inventory[0] = nvml.inventory()
        except NvmlError as exc:  # a GPU fell off the bus: its devices stay in the capacity
            log.warning("reading the GPUs failed, counting the last ones read: %s", exc)
        devices = device_map(inventory[0], config, settings.mig_strategy)
        unhealthy = monitor.unhealthy() if monitor is not None else frozenset[str]()
        return counts(devices), counts(devices, unhealthy)

    code: list[int] = []

    def run() -> None:
        on_node = monitor.on_node if monitor is not None else None
        code.append(follow(api, node, advertised, stop, on_node=on_node))
        stop.set()

    def refresh(_: frozenset[str]) -> None:  # the unhealthy GPUs changed: allocatable too
        view = nodeapi.read_node(api, node)
        set_capacity(api, view, *advertised(view))

    # The watch may block for its whole timeout: a daemon thread, so a signal ends it at once.
    threading.Thread(target=run, name="kwok capacity", daemon=True).start()
    if monitor is not None:
        poll_s = args.health_poll_ms / 1000.0
        _follow_health(monitor, nvml, lambda: inventory[0], refresh, stop, poll_s)
    wait_until(stop)
    nvml.close()
    return code[0] if code else 0


def _health_monitor(
    nvml: Nvml,
    api: Kube,
    node: str,
    settings: HealthSettings | None,
    inventory: Inventory,
    component: str,
) -> HealthMonitor | None:
    """The GPU health monitor whose Events name ``component``, primed from the Node's
    condition; None without settings."""
    if settings is None:
        return None
    from gpu_operator.agent.gpuhealth.monitor import HealthMonitor, KubeNode
    from gpu_operator.kube import NO_RETRY

    monitor = HealthMonitor(nvml, KubeNode(api.with_retry(NO_RETRY), node, component), settings)
    monitor.prime(inventory)
    return monitor


def _follow_health(
    monitor: HealthMonitor,
    nvml: Nvml,
    inventory: Callable[[], Inventory],
    on_change: Callable[[frozenset[str]], None],
    stop: threading.Event,
    poll_s: float,
) -> None:
    """Poll and publish ``monitor`` in a daemon thread of its own until ``stop``."""
    from gpu_operator.agent.gpuhealth.monitor import follow_health

    def xids(found: Inventory) -> list[XidEvent]:
        return nvml.xid_events([g.index for g in found.gpus]) if found.gpus else []

    health = (monitor, inventory, xids, on_change, stop, poll_s)
    threading.Thread(target=follow_health, args=health, name="gpu health", daemon=True).start()


# -- mps-control-daemon -------------------------------------------------------------------------
def cmd_mps_control_daemon(args: argparse.Namespace) -> int:
    from gpu_operator.agent.deviceplugin import mps
    from gpu_operator.agent.deviceplugin.resources import device_map
    from gpu_operator.agent.deviceplugin.settings import plugin_settings

    setup(args)
    configs = config_dir(args)
    nvml = Nvml().open()
    # Simulated GPUs (--simulate, or the stub driver of a simulated node) get the simulated
    # daemon; real GPUs need NVIDIA's.
    if not simulated():
        nvml.close()
        if args.simulated:
            raise UsageProblem(
                "--simulated needs simulated GPUs", "--simulate or a simulated node's driver"
            )
        raise UsageProblem(
            "this image has no CUDA MPS control daemon: it runs only for simulated GPUs",
            "use NVIDIA's device-plugin image (devicePlugin.repository/image) for MPS on real GPUs",
        )
    node = node_name(args)
    api = nodeapi.connect(*credentials(args)) if args.config_dir and node else None
    seen = {"version": ""}

    def resources() -> list[str]:
        if configs is not None:
            label = None
            if api is not None and node:
                view = nodeapi.read_node(api, node)
                seen["version"] = view.resource_version
                label = view.labels.get(configs.label_key) or None
            _, config = configs.choose(label)
        else:
            config = load_device_plugin_config(args.config_file)
        settings = plugin_settings(config, {"MIG_STRATEGY": args.mig_strategy})
        devices = device_map(nvml.inventory(), config, settings.mig_strategy)
        return mps.mps_resources(devices, config.sharing.strategy)

    stop = stop_on_signals()

    def changed() -> None:
        if (
            api is None
            or not node
            or not nodeapi.wait_for_node_change(api, node, seen["version"], 300)
        ):
            stop.wait(10)

    try:
        return mps.run_simulated(Path(args.mps_root), resources, stop, changed=changed)
    finally:
        nvml.close()


# -- mps-claim-daemon -----------------------------------------------------------------------------
def cmd_mps_claim_daemon(args: argparse.Namespace) -> int:
    from gpu_operator.agent.dra import mps_daemon

    setup(args)
    if not args.driver_root:
        raise UsageProblem(
            "mps-claim-daemon needs the driver root",
            "--driver-root (env CONTAINER_DRIVER_ROOT or NVIDIA_DRIVER_ROOT)",
        )
    return mps_daemon.run(args.driver_root, stop_on_signals())


# -- dra-plugin -----------------------------------------------------------------------------------
def cmd_dra_plugin(args: argparse.Namespace) -> int:
    from gpu_operator.agent.dra import agent as dra
    from gpu_operator.agent.dra.devices import DRIVER
    from gpu_operator.agent.dra.server import PluginPaths
    from gpu_operator.agent.dra.vfio import PassthroughError
    from gpu_operator.api import dragates

    setup(args)
    node = node_name(args)
    if not node:
        raise UsageProblem("dra-plugin needs the node's name", "--node-name or env NODE_NAME")
    try:
        gates = dragates.from_env(args.feature_gates)
    except dragates.GateError as exc:  # refused before anything is published or served
        raise UsageProblem(str(exc), "fix --feature-gates (env FEATURE_GATES)") from exc
    from gpu_operator.agent.gpuhealth import health_settings
    from gpu_operator.labels import HEALTH_ENV_CONDITION

    # NVIDIA's gate turns on the device plugin's GPU health: its settings, its condition.
    health_on = gates.on("NVMLDeviceHealthCheck")
    settings = health_settings({**os.environ, HEALTH_ENV_CONDITION: "true"}) if health_on else None
    stop = stop_on_signals()
    nvml = Nvml().open()
    api = nodeapi.connect(*credentials(args))
    health = _dra_health(nvml, api, node, settings, stop, args.health_poll_ms / 1000.0)
    try:
        return dra.run(
            api,
            nvml.inventory,
            dra.PluginOptions(
                node=node,
                paths=PluginPaths(
                    plugin_dir=Path(args.kubelet_plugins_directory_path) / DRIVER,
                    registry_dir=Path(args.kubelet_registrar_directory_path),
                    cdi_dir=Path(args.cdi_root),
                    host_driver_root=args.host_driver_root,
                    dev_root=args.dev_root,
                ),
                interval_s=args.interval,
                serve_kubelet=not args.publish_only,
                gates=gates,
                namespace=args.namespace,
                image=args.image,
                pull_policy=args.image_pull_policy,
                pci_root=args.pci_root,
            ),
            stop,
            health,
            nvml,
        )
    except PassthroughError as exc:  # refused before anything is published or served
        raise UsageProblem(str(exc), "turn the IOMMU on, or PassthroughSupport off") from exc
    finally:
        nvml.close()


def _dra_health(
    nvml: Nvml,
    api: Kube,
    node: str,
    settings: HealthSettings | None,
    stop: threading.Event,
    poll_s: float,
) -> Callable[[], dict[str, Any]] | None:
    """The GPUs' health, polled in a thread of its own (the device plugin's monitor, so the
    same GPUHealthy condition on the Node); None without settings."""
    from gpu_operator.agent.dra.health import EVENT_COMPONENT

    monitor = _health_monitor(nvml, api, node, settings, nvml.inventory(), EVENT_COMPONENT)
    if monitor is None:
        return None
    _follow_health(monitor, nvml, nvml.inventory, lambda _: None, stop, poll_s)
    return monitor.health


# -- compute-domain-plugin ------------------------------------------------------------------------
HEALTH_PORT_FIX = (
    "give 1-65535, 0 for any free port, or a negative number for no health service "
    "(--healthcheck-port, env HEALTHCHECK_PORT)"
)


def health_port(text: str) -> int:
    """``--healthcheck-port`` (env HEALTHCHECK_PORT) as a port; UsageProblem names the fix."""
    try:
        port = int(text)
    except ValueError:
        raise UsageProblem(f"health port {text!r} is not a number", HEALTH_PORT_FIX) from None
    if port > 65535:
        raise UsageProblem(f"health port {port} is not a port", HEALTH_PORT_FIX)
    return port


def cmd_compute_domain_plugin(args: argparse.Namespace) -> int:
    from gpu_operator.agent.dra.agent import find_driver
    from gpu_operator.agent.dra.computedomain import agent as domains
    from gpu_operator.agent.dra.computedomain.decide import DRIVER, IMEX_MGMT_CAPABILITY
    from gpu_operator.agent.dra.computedomain.plugin import HostFiles, Waiting
    from gpu_operator.agent.dra.server import PluginPaths
    from gpu_operator.agent.driverroot.rootfs import host_path
    from gpu_operator.agent.nvml import current_driver_root, node_clique

    setup(args)
    node = node_name(args)
    if not node:
        raise UsageProblem(
            "compute-domain-plugin needs the node's name", "--node-name or env NODE_NAME"
        )
    port = health_port(args.healthcheck_port)
    if not args.prepare_timeout > 0:
        raise UsageProblem(
            f"--prepare-timeout {args.prepare_timeout} is not a time to wait",
            "give the seconds (above 0) one prepare call waits for a domain's IMEX daemon",
        )
    # As NVIDIA's: another /proc/devices (a simulated node's) means the driver's /proc files
    # are under the driver root too.
    mgmt = IMEX_MGMT_CAPABILITY
    if args.proc_devices != DEFAULT_PROC_DEVICES:
        mgmt = host_path(current_driver_root() or "/", IMEX_MGMT_CAPABILITY)
    paths = PluginPaths(
        plugin_dir=Path(args.kubelet_plugins_directory_path) / DRIVER,
        registry_dir=Path(args.kubelet_registrar_directory_path),
        cdi_dir=Path(args.cdi_root),
        host_driver_root=args.host_driver_root,
        dev_root=args.dev_root,
        driver=DRIVER,
    )
    stop = stop_on_signals()
    nvml = Nvml().open()

    def read_clique() -> str | None:
        return node_clique([nvml.gpu_fabric(i) for i in range(nvml.device_count())])

    try:
        return domains.run(
            nodeapi.connect(*credentials(args)),
            read_clique,
            domains.DomainPluginOptions(
                node=node,
                paths=paths,
                healthcheck_port=port,
                files=HostFiles(Path(args.proc_devices), Path(mgmt)),
                waiting=Waiting(timeout_s=args.prepare_timeout),
            ),
            stop,
            lambda: find_driver(paths),
        )
    finally:
        nvml.close()


def _add_kubelet_plugin_args(p: argparse.ArgumentParser) -> None:
    """What every DRA kubelet plugin takes: where NVML and the driver are, the node, the
    kubelet's directories and the CDI root, under NVIDIA's plugins' environment names."""
    add_common(p)
    add_node_name(p)
    p.add_argument(
        "--kubelet-registrar-directory-path",
        default=os.environ.get("KUBELET_REGISTRAR_DIRECTORY_PATH")
        or "/var/lib/kubelet/plugins_registry",
        help="where the kubelet finds plugins' registration sockets (env "
        "KUBELET_REGISTRAR_DIRECTORY_PATH)",
    )
    p.add_argument(
        "--kubelet-plugins-directory-path",
        default=os.environ.get("KUBELET_PLUGINS_DIRECTORY_PATH") or "/var/lib/kubelet/plugins",
        help="where the plugin's own socket and state go (env KUBELET_PLUGINS_DIRECTORY_PATH)",
    )
    p.add_argument(
        "--cdi-root", default=os.environ.get("CDI_ROOT") or "/var/run/cdi", help=CDI_ROOT_HELP
    )
    p.add_argument(
        "--host-driver-root",
        default=os.environ.get("NVIDIA_DRIVER_ROOT") or "/",
        help="the driver root on the host, as claims' CDI specs name it (env NVIDIA_DRIVER_ROOT)",
    )
    p.add_argument(
        "--dev-root",
        default=os.environ.get("NVIDIA_DEV_ROOT") or None,
        help="where /dev/nvidia* are on the host (env NVIDIA_DEV_ROOT); default: with the driver",
    )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "dra-plugin",
        help="DRA kubelet plugin: publish GPUs as ResourceSlices, prepare claims with CDI",
        description="The node's GPUs as DRA ResourceSlices, and the kubelet plugin that "
        "prepares claims for them with CDI specs (NVIDIA's DRA driver's names and gates).",
    )
    _add_kubelet_plugin_args(p)
    p.add_argument(
        "--interval", type=float, default=2.0, help="seconds between inventory reads (2)"
    )
    add_cluster_options(
        p,
        namespace=os.environ.get("NAMESPACE") or "default",
        namespace_help="where claims' MPS control daemons run (env NAMESPACE: the plugin's own)",
    )
    p.add_argument(
        "--image",
        default=os.environ.get("IMAGE_NAME") or "",
        help="the image claims' MPS control daemons run (env IMAGE_NAME: the plugin's own)",
    )
    p.add_argument(
        "--image-pull-policy",
        default=os.environ.get("IMAGE_PULL_POLICY") or "IfNotPresent",
        help="their image pull policy (env IMAGE_PULL_POLICY; default IfNotPresent)",
    )
    p.add_argument(
        "--publish-only", action="store_true", help="publish slices, serve no kubelet (kwok)"
    )
    p.add_argument(
        "--pci-root",
        default=os.environ.get("PCI_ROOT") or "/",
        help="with gate PassthroughSupport: where the host's /sys and /dev are (env PCI_ROOT; "
        "default /; a simulated node's root)",
    )
    p.add_argument(
        "--health-poll-ms",
        type=int,
        default=500,
        help="with gate NVMLDeviceHealthCheck: milliseconds between GPU health polls (500)",
    )
    p.add_argument(
        "--feature-gates",
        default=os.environ.get("FEATURE_GATES") or "",
        help="NVIDIA's DRA driver's gates, Name=true,Other=false (env FEATURE_GATES); an "
        "unknown gate or a pair NVIDIA's driver refuses together stops the plugin",
    )
    p.set_defaults(func=cmd_dra_plugin)

    p = sub.add_parser(
        "compute-domain-plugin",
        help="DRA kubelet plugin compute-domain.nvidia.com: IMEX channels and daemons of "
        "ComputeDomains",
        description="NVIDIA's compute-domain kubelet plugin: publish the node's IMEX channel "
        "and daemon devices, label the node's NVLink clique (nvidia.com/gpu.clique), and "
        "prepare ComputeDomain claims with CDI specs.",
    )
    _add_kubelet_plugin_args(p)
    add_cluster_options(p)
    p.add_argument(
        "--healthcheck-port",
        default=os.environ.get("HEALTHCHECK_PORT") or "51515",
        help="the gRPC health service's port (env HEALTHCHECK_PORT; default 51515); 0: any "
        "free port, negative: none",
    )
    p.add_argument(
        "--proc-devices",
        default=os.environ.get("ALT_PROC_DEVICES_PATH") or DEFAULT_PROC_DEVICES,
        help="the kernel's device majors, for the IMEX channels' device nodes (env "
        "ALT_PROC_DEVICES_PATH, NVIDIA's; default /proc/devices; another one, a simulated "
        "node's, also means the driver's /proc files are under the driver root)",
    )
    p.add_argument(
        "--prepare-timeout",
        type=float,
        default=40.0,
        help="seconds one prepare call waits for the domain's IMEX daemon before the kubelet "
        "is told to ask again (40: under the kubelet's 45 s call timeout)",
    )
    p.set_defaults(func=cmd_compute_domain_plugin)

    p = sub.add_parser(
        "device-plugin",
        help="kubelet device plugin: advertise and allocate GPUs, MIG devices and replicas "
        "(env GPU_HEALTH_CONDITION=true: also publish the node's GPUHealthy condition)",
        description="NVIDIA's k8s-device-plugin, from its own config file and environment: "
        "advertise the node's GPUs, MIG devices and shared replicas to the kubelet and "
        "allocate them to containers.",
    )
    add_common(p)
    add_config_args(p)
    add_node_name(p)
    add_cluster_options(p)
    for env in PLUGIN_ENV:
        p.add_argument(
            "--" + env.lower().replace("_", "-"),
            dest=env.lower(),
            default=os.environ.get(env),
            help=f"overrides the config file (env {env})",
        )
    p.add_argument(
        "--kubelet-socket",
        default=os.environ.get("KUBELET_SOCKET") or "/var/lib/kubelet/device-plugins/kubelet.sock",
        help="plugin sockets go next to it (env KUBELET_SOCKET)",
    )
    p.add_argument(
        "--cdi-root", default=os.environ.get("CDI_ROOT") or "/var/run/cdi", help=CDI_ROOT_HELP
    )
    p.add_argument("--sysfs-root", default="/sys", help="for NUMA nodes and PCIe roots")
    p.add_argument(
        "--mps-dir",
        default=os.environ.get("MPS_DIR") or None,
        help="the MPS root as mounted here (/mps in the DaemonSet): MPS replicas wait for the "
        "control daemon's .started file there (env MPS_DIR; default: no wait)",
    )
    p.add_argument(
        "--pod-resources-socket",
        default=os.environ.get("POD_RESOURCES_SOCKET") or None,
        help="the kubelet's PodResources socket: the containers holding a GPU that turns "
        "Unhealthy are reported (env POD_RESOURCES_SOCKET; default: not looked up)",
    )
    p.add_argument(
        "--xid-recovery-seconds",
        type=float,
        default=float(os.environ.get("DP_XID_RECOVERY_SECONDS") or 300),
        help="a GPU quiet this long after an XID, answering NVML, is healthy again; 0: never "
        "(env DP_XID_RECOVERY_SECONDS)",
    )
    p.add_argument(
        "--health-poll-ms",
        type=int,
        default=500,
        help="milliseconds between GPU health polls (500)",
    )
    p.add_argument(
        "--kwok-capacity",
        action="store_true",
        help="simulated kwok nodes only: write the node's nvidia.com/* capacity and allocatable "
        "(what a kubelet would report from this plugin; with GPU_HEALTH_CONDITION=true, "
        "devices on unhealthy GPUs leave allocatable) instead of serving a kubelet",
    )
    p.set_defaults(func=cmd_device_plugin)

    p = sub.add_parser(
        "mps-control-daemon",
        help="SIMULATED MPS control daemon: the pipe and .started files the plugin's MPS "
        "resources need, for simulated GPUs only",
        description="Lay out what the device plugin's MPS-shared resources wait for (the "
        "control pipe and .started file) under --mps-root; simulated GPUs only, no CUDA MPS "
        "server runs.",
    )
    add_common(p)
    p.add_argument(
        "--simulated",
        action="store_true",
        help="say so explicitly (implied by simulated GPUs): no CUDA MPS server runs, only its "
        "files are laid out",
    )
    p.add_argument("--mps-root", default="/mps", help="the host's MPS root, as mounted here")
    add_config_args(p)
    p.add_argument(
        "--mig-strategy",
        default=os.environ.get("MIG_STRATEGY") or None,
        help="overrides the config's (env MIG_STRATEGY)",
    )
    add_node_name(p)
    add_cluster_options(p)
    p.set_defaults(func=cmd_mps_control_daemon)

    p = sub.add_parser(
        "mps-claim-daemon",
        help="one DRA claim's MPS control daemon: the driver's nvidia-cuda-mps-control with the "
        "claim's defaults (the DRA plugin's Deployment runs it)",
        description="Run the driver's nvidia-cuda-mps-control for one DRA claim, with the "
        "claim's defaults, until stopped.",
    )
    add_driver_root(p)
    p.set_defaults(func=cmd_mps_claim_daemon)
