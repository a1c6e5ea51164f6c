"""``gpu-operator agent ...``: the node agents' command line.

Every agent takes ``--simulate PROFILE:COUNT`` (or ``GPU_OPERATOR_SIMULATE``) to run against a
simulated NVML instead of the driver, and reads the same environment variables as NVIDIA's
images, so manifests carry over.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

# Light imports only: each command imports what it alone needs (pydantic, prometheus_client),
# so a feature-discovery pod does not carry the exporter's or the MIG manager's memory.
from gpu_operator import labels
from gpu_operator.agent import discovery, kube, validate
from gpu_operator.agent.deviceplugin.settings import ENV_NAMES as PLUGIN_ENV
from gpu_operator.agent.deviceplugin_config import DevicePluginConfig, load_device_plugin_config
from gpu_operator.agent.nvml import Nvml, NvmlError
from gpu_operator.agent.podresources import KUBELET_SOCKET
from gpu_operator.agent.simulated import ENV_SIMULATE, ENV_STATE, install_simulated_nvml

if TYPE_CHECKING:
    from gpu_operator.agent.deviceplugin.configs import ConfigDir
    from gpu_operator.agent.migparted import MigPartedConfig

log = logging.getLogger(__name__)

DEFAULT_MIG_CONFIG = "/mig-parted-config/config.yaml"
EXPORTER_PORT = 9400


def _env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def _setup(args: argparse.Namespace) -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=os.environ.get("LOG_LEVEL", "INFO").upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    spec = getattr(args, "simulate", None)
    if spec:
        state = getattr(args, "simulate_state", None) or None
        install_simulated_nvml(spec, state_file=state)
        log.info("using simulated NVML: %s", spec)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulate",
        metavar="PROFILE:COUNT",
        default=os.environ.get(ENV_SIMULATE) or None,
        help="simulated GPUs instead of the driver, e.g. a100-40gb:8 (env GPU_OPERATOR_SIMULATE)",
    )
    parser.add_argument(
        "--simulate-state",
        metavar="PATH",
        default=os.environ.get(ENV_STATE) or None,
        help="file sharing simulated MIG state between agents (env GPU_OPERATOR_SIMULATE_STATE)",
    )


def _node_name(args: argparse.Namespace) -> str | None:
    return cast(str | None, getattr(args, "node_name", None) or os.environ.get("NODE_NAME"))


# -- named configs (NVIDIA's config-manager inputs) ----------------------------------------------
def _add_config_args(p: argparse.ArgumentParser) -> None:
    """The device-plugin config: one file, or a directory of named ones the node label picks."""
    p.add_argument(
        "--config-file",
        default=os.environ.get("CONFIG_FILE") or None,
        help="NVIDIA device-plugin config, version v1 (env CONFIG_FILE)",
    )
    p.add_argument(
        "--config-dir",
        default=os.environ.get("CONFIG_FILE_SRCDIR") or None,
        help="directory of named configs; the node label picks one (env CONFIG_FILE_SRCDIR)",
    )
    p.add_argument("--default-config", default=os.environ.get("DEFAULT_CONFIG") or None)
    p.add_argument(
        "--fallback-strategies",
        default=os.environ.get("FALLBACK_STRATEGIES") or "named,single",
        help="without label or default: named, single and/or empty (env FALLBACK_STRATEGIES)",
    )
    p.add_argument(
        "--node-label", default=os.environ.get("NODE_LABEL") or labels.DEVICE_PLUGIN_CONFIG
    )


def _config_dir(args: argparse.Namespace) -> ConfigDir | None:
    """``--config-dir`` as a ConfigDir (None without one); raises ConfigSelectionError."""
    from gpu_operator.agent.deviceplugin.configs import ConfigDir, parse_fallbacks

    if not args.config_dir:
        return None
    if args.config_file:
        log.info("--config-dir given: CONFIG_FILE %s is not read", args.config_file)
    fallbacks = parse_fallbacks(args.fallback_strategies)
    return ConfigDir(Path(args.config_dir), args.default_config or None, fallbacks, args.node_label)


# -- discover -----------------------------------------------------------------------------------
def _cmd_discover(args: argparse.Namespace) -> int:
    from gpu_operator.agent.deviceplugin.configs import ConfigSelectionError

    _setup(args)
    try:
        configs = _config_dir(args)
    except ConfigSelectionError as exc:
        log.error("%s", exc)
        return 2
    if configs is None:
        config = load_device_plugin_config(args.config_file)
    else:
        # The interval is read once, from what applies without a node label; a failure here is
        # no error yet: the node's label may name a config, and each pass chooses again.
        config = DevicePluginConfig()
        with contextlib.suppress(OSError, ValueError):
            config = configs.choose(None)[1]
    interval = args.sleep_interval
    if interval is None:
        gfd = config.flags.gfd
        interval = (gfd.sleep_interval if gfd and gfd.sleep_interval else None) or "60s"
    oneshot = args.oneshot or _env_bool("GFD_ONESHOT")
    node = _node_name(args)
    api = None if args.output else kube.connect()
    nvml = Nvml().open()
    try:
        return discovery.run_discover(
            nvml.inventory,
            settings=discovery.Settings.chooser(args.mig_strategy, config, configs),
            node_name=node,
            api=api,
            output=args.output,
            interval_s=discovery.parse_interval(interval),
            oneshot=oneshot,
            machine_file=Path(args.machine_type_file),
            with_timestamp=not _env_bool("GFD_NO_TIMESTAMP"),
        )
    finally:
        nvml.close()


# -- mig-manager --------------------------------------------------------------------------------
def _cmd_mig_manager(args: argparse.Namespace) -> int:
    from gpu_operator.agent import mig_manager, migparted

    _setup(args)
    node = _node_name(args)
    if not node:
        log.error("NODE_NAME is required")
        return 2
    path = args.config_file

    def config() -> MigPartedConfig:
        return migparted.load_mig_config(path)

    namespace = args.namespace or mig_manager.DEFAULT_NAMESPACE
    api = kube.connect()
    with Nvml() as nvml:
        if args.once:
            step = mig_manager.reconcile(
                api, node, config, nvml, first_pass=True, namespace=namespace
            )
            print(f"{step.phase} {step.reason}".strip())
            return 1 if step.phase == "failed" else 0
        mig_manager.run_mig_manager(api, node, config, nvml, namespace=namespace)
    return 0


def _cmd_mig_parted(args: argparse.Namespace) -> int:
    from gpu_operator.agent import migparted

    _setup(args)
    with Nvml() as nvml:
        if args.action == "generate":
            sys.stdout.write(migparted.standard_configs(nvml.inventory()).to_yaml())
            return 0
        config = migparted.load_mig_config(args.config_file)
        try:
            if args.action == "plan":
                plan = migparted.plan(nvml.inventory(), config, args.config)
                for gpu in plan.gpus:
                    layout = ", ".join(f"{i.profile}@{i.placement.start}" for i in gpu.layout or ())
                    state = "applied" if gpu.already_applied else "to apply"
                    mig = "mig on" if gpu.mig_enabled else "mig off"
                    print(f"GPU {gpu.index} ({gpu.name}): {mig} [{layout}] {state}")
                return 0
            migparted.apply_config(nvml, config, args.config)
            print(f"MIG config {args.config} applied")
            return 0
        except (migparted.MigPlanError, migparted.MigApplyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1


# -- exporter -----------------------------------------------------------------------------------
def _cmd_exporter(args: argparse.Namespace) -> int:
    from gpu_operator.agent import exporter

    _setup(args)
    counters = exporter.load_counters(args.collectors)
    host, _, port = args.address.rpartition(":")
    nvml = Nvml().open()
    metrics = exporter.Exporter(
        nvml,
        counters,
        hostname=os.environ.get("NODE_NAME") or None,
        interval_s=args.interval_ms / 1000.0,
        pod_resources_socket=(args.pod_resources_socket or None) if args.kubernetes else None,
    ).start()
    server = exporter.make_server(metrics, host, int(port or EXPORTER_PORT))
    log.info("serving /metrics and /health on %s", args.address)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        metrics.stop()
        nvml.close()
    return 0


# -- device-plugin ------------------------------------------------------------------------------
def _cmd_device_plugin(args: argparse.Namespace) -> int:
    import signal

    from gpu_operator.agent.deviceplugin import agent as plugin
    from gpu_operator.agent.deviceplugin.configs import ConfigSelectionError
    from gpu_operator.agent.deviceplugin.health import xid_policy

    _setup(args)
    node = _node_name(args)
    try:
        configs = _config_dir(args)
    except ConfigSelectionError as exc:
        log.error("%s", exc)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if args.kwok_capacity:
        return _kwok_capacity(args, node, configs, stop)
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
        api=kube.connect() if configs is not None and node else None,
    )


def _kwok_capacity(
    args: argparse.Namespace, node: str | None, configs: Any, stop: threading.Event
) -> int:
    """``device-plugin --kwok-capacity``: the simulated node's capacity instead of a kubelet."""
    from gpu_operator.agent.deviceplugin import advertised_resources
    from gpu_operator.agent.deviceplugin.capacity import follow
    from gpu_operator.agent.deviceplugin.settings import plugin_settings

    if not args.simulate or not node:
        log.error(
            "--kwok-capacity is for simulated kwok nodes: it needs --simulate (or "
            "GPU_OPERATOR_SIMULATE) and the node's name (--node-name or NODE_NAME)"
        )
        return 2
    overrides = {env: getattr(args, env.lower()) for env in PLUGIN_ENV}
    nvml = Nvml()
    nvml.open()

    def advertised(view: kube.NodeView) -> dict[str, int]:
        if configs is not None:
            _, config = configs.choose(view.labels.get(configs.label_key) or None)
        else:
            config = load_device_plugin_config(args.config_file)
        settings = plugin_settings(config, overrides)
        return advertised_resources(nvml.inventory(), config, settings.mig_strategy)

    api = kube.connect()
    code: list[int] = []

    def run() -> None:
        code.append(follow(api, node, advertised, stop))
        stop.set()

    # The watch may block for its whole timeout: a daemon thread, so a signal ends it at once.
    threading.Thread(target=run, name="kwok capacity", daemon=True).start()
    stop.wait()
    nvml.close()
    return code[0] if code else 0


# -- mps-control-daemon -------------------------------------------------------------------------
def _cmd_mps_control_daemon(args: argparse.Namespace) -> int:
    import signal

    from gpu_operator.agent.deviceplugin import mps
    from gpu_operator.agent.deviceplugin.configs import ConfigSelectionError
    from gpu_operator.agent.deviceplugin.resources import device_map
    from gpu_operator.agent.deviceplugin.settings import plugin_settings

    _setup(args)
    # Simulated GPUs (GPU_OPERATOR_SIMULATE, set by the renderer or by the node's runtime) get the
    # simulated daemon; real GPUs need NVIDIA's.
    if not args.simulate:
        if args.simulated:
            log.error("--simulated needs simulated GPUs: --simulate or GPU_OPERATOR_SIMULATE")
        else:
            log.error(
                "this image has no CUDA MPS control daemon: it runs only simulated, for "
                "simulated GPUs (GPU_OPERATOR_SIMULATE); use NVIDIA's device-plugin image "
                "(devicePlugin.repository/image) for MPS on real GPUs"
            )
        return 2
    node = _node_name(args)
    api = kube.connect() if args.config_dir and node else None
    try:
        configs = _config_dir(args)
    except ConfigSelectionError as exc:
        log.error("%s", exc)
        return 2
    nvml = Nvml()
    nvml.open()
    seen = {"version": ""}

    def resources() -> list[str]:
        if configs is not None:
            label = None
            if api is not None and node:
                view = kube.read_node(api, node)
                seen["version"] = view.resource_version
                label = view.labels.get(configs.label_key) or None
            _, config = configs.choose(label)
        else:
            config = load_device_plugin_config(args.config_file)
        settings = plugin_settings(config, {"MIG_STRATEGY": args.mig_strategy})
        devices = device_map(nvml.inventory(), config, settings.mig_strategy)
        return mps.mps_resources(devices, config.sharing.strategy)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def changed() -> None:
        if (
            api is None
            or not node
            or not kube.wait_for_node_change(api, node, seen["version"], 300)
        ):
            stop.wait(10)

    try:
        return mps.run_simulated(Path(args.mps_root), resources, stop, changed=changed)
    finally:
        nvml.close()


# -- dra-plugin -----------------------------------------------------------------------------------
def _cmd_dra_plugin(args: argparse.Namespace) -> int:
    import signal

    from gpu_operator.agent.dra import agent as dra
    from gpu_operator.agent.dra.devices import DRIVER
    from gpu_operator.agent.dra.server import PluginPaths

    _setup(args)
    node = _node_name(args)
    if not node:
        log.error("dra-plugin needs the node's name: --node-name or env NODE_NAME")
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    nvml = Nvml().open()
    try:
        return dra.run(
            kube.connect(),
            nvml.inventory,
            dra.PluginOptions(
                node=node,
                paths=PluginPaths(
                    plugin_dir=Path(args.kubelet_plugins_directory_path) / DRIVER,
                    registry_dir=Path(args.kubelet_registrar_directory_path),
                    cdi_dir=Path(args.cdi_root),
                    dev_root=args.dev_root,
                ),
                interval_s=args.interval,
                serve_kubelet=not args.publish_only,
            ),
            stop,
        )
    finally:
        nvml.close()


# -- validate -----------------------------------------------------------------------------------
def _cmd_validate(args: argparse.Namespace) -> int:
    _setup(args)
    node = _node_name(args)
    components = [c.strip() for c in args.components.split(",") if c.strip()]
    unknown = sorted(set(components) - set(validate.COMPONENTS))
    if unknown:
        log.error("unknown components %s (known: %s)", unknown, ", ".join(validate.COMPONENTS))
        return 2
    read_node = None
    if "plugin" in components and node:
        api = kube.connect()

        def read_node() -> kube.NodeView:
            return kube.read_node(api, node)

    def read_inventory() -> Any:
        with Nvml() as nvml:
            return nvml.inventory()

    validator = validate.Validator(
        read_inventory=read_inventory,
        read_node=read_node,
        runtime_configs=args.runtime_config or validate.host_runtime_configs(args.host_root),
        directory=Path(args.output_dir),
        components=components,
        driver_root=args.driver_root,
        uvm_device=_uvm_device(args),
    )
    return validate.run_validator(
        validator, interval_s=args.interval, oneshot=args.oneshot, stop=threading.Event()
    )


def _uvm_device(args: argparse.Namespace) -> Path | None:
    """``--uvm-device``; by default /dev/nvidia-uvm, unchecked under simulated NVML."""
    if args.uvm_device is not None:
        return Path(args.uvm_device) if args.uvm_device else None
    return None if getattr(args, "simulate", None) else validate.UVM_DEVICE


# -- nvml-info ----------------------------------------------------------------------------------
def inventory_document(nvml: Nvml) -> dict[str, Any]:
    inventory = nvml.inventory()
    return {
        "driverVersion": inventory.driver_version,
        "cudaDriverVersion": inventory.cuda_driver_version,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "pciBusId": g.pci_bus_id,
                "pciDeviceId": g.device_filter_id,
                "memoryMiB": g.memory_mib,
                "computeCapability": f"{g.compute_major}.{g.compute_minor}",
                "architecture": g.architecture,
                "mig": {
                    "capable": g.mig_capable,
                    "current": g.mig_current,
                    "pending": g.mig_pending,
                    "devices": [
                        {
                            "uuid": d.uuid,
                            "profile": d.profile,
                            "gi": d.gi_id,
                            "ci": d.ci_id,
                            "memoryMiB": d.memory_mib,
                            "multiprocessors": d.sm_count,
                            "placement": f"{d.placement.start}:{d.placement.size}",
                        }
                        for d in g.mig_devices
                    ],
                },
            }
            for g in inventory.gpus
        ],
    }


def _cmd_nvml_info(args: argparse.Namespace) -> int:
    _setup(args)
    try:
        with Nvml() as nvml:
            sys.stdout.write(yaml.safe_dump(inventory_document(nvml), sort_keys=False))
    except NvmlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


# -- SIMULATED operands (the testenv's stand-ins for NVIDIA's images) ----------------------------
def _cmd_simulate_driver(args: argparse.Namespace) -> int:
    from gpu_operator.agent import simulated_operands as sim

    _setup(args)
    host = Path(args.host_root)
    sim_dir = host / labels.SIMULATED_GPUS_DIR.lstrip("/")
    driver_root = Path(args.driver_root)
    if args.action == "smi":
        return sim.main_smi(driver_root, sim_dir)
    if args.action == "manager":
        return sim.run_manager(driver_root)
    return sim.run_driver(
        sim_dir / labels.SIMULATED_GPUS_PROFILE,
        driver_root,
        sim_dir,
        driver_version=args.driver_version or None,
    )


def _cmd_simulate_toolkit(args: argparse.Namespace) -> int:
    from gpu_operator.agent import simulated_operands as sim

    _setup(args)
    return sim.run_toolkit(Path(args.containerd_config), args.runtime_class)


# -- wiring -------------------------------------------------------------------------------------
def add_agent_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``agent`` and its sub-commands to the main parser's sub-parsers."""
    agent = subparsers.add_parser("agent", help="node agents (run in the operand pods)")
    sub = agent.add_subparsers(dest="agent_command", required=True)

    p = sub.add_parser("discover", help="GPU feature discovery: label the node")
    _add_common(p)
    p.add_argument(
        "--mig-strategy",
        choices=["none", "single", "mixed"],
        default=os.environ.get("MIG_STRATEGY") or None,
    )
    p.add_argument(
        "--sleep-interval",
        default=os.environ.get("GFD_SLEEP_INTERVAL") or None,
        help="time between passes, e.g. 60s (env GFD_SLEEP_INTERVAL)",
    )
    p.add_argument("--oneshot", action="store_true", help="one pass, then exit (env GFD_ONESHOT)")
    p.add_argument(
        "--output",
        "-o",
        default=os.environ.get("GFD_OUTPUT_FILE") or None,
        help="'-' prints key=value lines, a path writes them; default: patch the Node",
    )
    _add_config_args(p)
    p.add_argument(
        "--machine-type-file",
        default=os.environ.get("GFD_MACHINE_TYPE_FILE", str(discovery.MACHINE_TYPE_FILE)),
    )
    p.add_argument("--node-name", default=None, help="default: env NODE_NAME")
    p.set_defaults(func=_cmd_discover)

    p = sub.add_parser("mig-manager", help="apply the MIG layout named by nvidia.com/mig.config")
    _add_common(p)
    p.add_argument(
        "--config-file",
        default=os.environ.get("CONFIG_FILE", DEFAULT_MIG_CONFIG),
        help="mig-parted config or ConfigMap YAML (env CONFIG_FILE)",
    )
    p.add_argument("--node-name", default=None, help="default: env NODE_NAME")
    p.add_argument(
        "--namespace",
        default=os.environ.get("DEFAULT_GPU_CLIENTS_NAMESPACE"),
        help="where the operands to pause run (env DEFAULT_GPU_CLIENTS_NAMESPACE; "
        "default gpu-operator)",
    )
    p.add_argument("--once", action="store_true", help="reconcile until idle, then exit")
    p.set_defaults(func=_cmd_mig_manager)

    p = sub.add_parser("mig-parted", help="plan/apply a MIG config locally, or generate configs")
    _add_common(p)
    p.add_argument("action", choices=["plan", "apply", "generate"])
    p.add_argument("config", nargs="?", default="all-disabled", help="config name")
    p.add_argument("--config-file", "-f", default=os.environ.get("CONFIG_FILE", DEFAULT_MIG_CONFIG))
    p.set_defaults(func=_cmd_mig_parted)

    p = sub.add_parser("exporter", help="Prometheus GPU metrics on :9400 (dcgm-exporter names)")
    _add_common(p)
    p.add_argument(
        "--collectors",
        "-f",
        default=os.environ.get("DCGM_EXPORTER_COLLECTORS") or None,
        help="counters CSV (env DCGM_EXPORTER_COLLECTORS); default: all NVML fields",
    )
    p.add_argument("--address", "-a", default=os.environ.get("DCGM_EXPORTER_LISTEN", ":9400"))
    p.add_argument(
        "--interval-ms",
        "-c",
        type=int,
        default=int(os.environ.get("DCGM_EXPORTER_INTERVAL", "30000")),
    )
    p.add_argument(
        "--pod-resources-socket",
        default=os.environ.get("POD_RESOURCES_SOCKET", KUBELET_SOCKET),
    )
    p.add_argument(
        "--kubernetes",
        "-k",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("DCGM_EXPORTER_KUBERNETES", True),
        help="label series with the pod holding the GPU, from the PodResources socket (env "
        "DCGM_EXPORTER_KUBERNETES; on unless set false, where NVIDIA's exporter is off)",
    )
    p.set_defaults(func=_cmd_exporter)

    p = sub.add_parser(
        "dra-plugin",
        help="DRA kubelet plugin: publish GPUs as ResourceSlices, prepare claims with CDI",
    )
    _add_common(p)
    p.add_argument("--node-name", default=None, help="default: env NODE_NAME")
    p.add_argument(
        "--kubelet-registrar-directory-path",
        default=os.environ.get("KUBELET_REGISTRAR_DIRECTORY_PATH")
        or "/var/lib/kubelet/plugins_registry",
    )
    p.add_argument(
        "--kubelet-plugins-directory-path",
        default=os.environ.get("KUBELET_PLUGINS_DIRECTORY_PATH") or "/var/lib/kubelet/plugins",
    )
    p.add_argument("--cdi-root", default=os.environ.get("CDI_ROOT") or "/var/run/cdi")
    p.add_argument(
        "--dev-root", default=os.environ.get("DEV_ROOT") or "/", help="host root holding /dev"
    )
    p.add_argument(
        "--interval", type=float, default=2.0, help="seconds between inventory reads (2)"
    )
    p.add_argument(
        "--publish-only", action="store_true", help="publish slices, serve no kubelet (kwok)"
    )
    p.set_defaults(func=_cmd_dra_plugin)

    p = sub.add_parser(
        "device-plugin",
        help="kubelet device plugin: advertise and allocate GPUs, MIG devices and replicas",
    )
    _add_common(p)
    _add_config_args(p)
    p.add_argument("--node-name", default=None, help="default: env NODE_NAME")
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
    p.add_argument("--cdi-root", default=os.environ.get("CDI_ROOT") or "/var/run/cdi")
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
    p.add_argument("--health-poll-ms", type=int, default=500)
    p.add_argument(
        "--kwok-capacity",
        action="store_true",
        help="simulated kwok nodes only: write the node's nvidia.com/* capacity and allocatable "
        "(what a kubelet would report from this plugin) instead of serving a kubelet",
    )
    p.set_defaults(func=_cmd_device_plugin)

    p = sub.add_parser(
        "mps-control-daemon",
        help="SIMULATED MPS control daemon: the pipe and .started files the plugin's MPS "
        "resources need, for simulated GPUs only",
    )
    _add_common(p)
    p.add_argument(
        "--simulated",
        action="store_true",
        help="say so explicitly (implied by simulated GPUs): no CUDA MPS server runs, only its "
        "files are laid out",
    )
    p.add_argument("--mps-root", default="/mps", help="the host's MPS root, as mounted here")
    _add_config_args(p)
    p.add_argument("--mig-strategy", default=os.environ.get("MIG_STRATEGY") or None)
    p.add_argument("--node-name", default=None, help="default: env NODE_NAME")
    p.set_defaults(func=_cmd_mps_control_daemon)

    p = sub.add_parser("validate", help="validate driver, toolkit, CUDA and device plugin")
    _add_common(p)
    p.add_argument(
        "--components", default=os.environ.get("COMPONENTS", ",".join(validate.COMPONENTS))
    )
    p.add_argument(
        "--output-dir", default=os.environ.get("VALIDATIONS_DIR", str(validate.VALIDATIONS_DIR))
    )
    p.add_argument(
        "--runtime-config",
        action="append",
        default=None,
        help="container runtime config to check (repeatable; globs allowed)",
    )
    p.add_argument(
        "--host-root",
        default=os.environ.get("HOST_ROOT_MOUNT") or validate.default_host_root(),
        help="where the host's / is mounted, to read its container runtime config (env "
        "HOST_ROOT_MOUNT; default /host when mounted, as in the validator's DaemonSet)",
    )
    p.add_argument("--driver-root", default=os.environ.get("NVIDIA_DRIVER_ROOT", "/"))
    p.add_argument(
        "--uvm-device",
        default=os.environ.get("NVIDIA_UVM_DEVICE"),
        help="device node CUDA needs (default /dev/nvidia-uvm, not checked when simulating; "
        "'' skips it) (env NVIDIA_UVM_DEVICE)",
    )
    p.add_argument("--interval", type=float, default=10.0)
    p.add_argument("--oneshot", action="store_true")
    p.add_argument("--node-name", default=None, help="default: env NODE_NAME")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser(
        "simulate-driver",
        help="SIMULATED NVIDIA driver container (testenv stand-in images only)",
    )
    p.add_argument("action", nargs="?", choices=["init", "smi", "manager"], default="init")
    # k8s-driver-manager's own step word (uninstall_driver); the stand-in has only that one.
    p.add_argument("step", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--host-root", default=os.environ.get("HOST_ROOT", "/host"))
    p.add_argument("--driver-root", default=labels.SIMULATED_DRIVER_ROOT)
    p.add_argument(
        "--driver-version",
        default=os.environ.get("DRIVER_VERSION"),
        help="the version installed (env DRIVER_VERSION, as NVIDIA's driver images set it)",
    )
    p.set_defaults(func=_cmd_simulate_driver)

    p = sub.add_parser(
        "simulate-toolkit",
        help="SIMULATED NVIDIA container toolkit (testenv stand-in images only)",
    )
    p.add_argument(
        "--containerd-config",
        default=os.environ.get("CONTAINERD_CONFIG", "/etc/containerd/config.toml"),
    )
    p.add_argument("--runtime-class", default=os.environ.get("CONTAINERD_RUNTIME_CLASS", "nvidia"))
    p.set_defaults(func=_cmd_simulate_toolkit)

    p = sub.add_parser("nvml-info", help="print the GPU inventory as YAML")
    _add_common(p)
    p.set_defaults(func=_cmd_nvml_info)
    return cast(argparse.ArgumentParser, agent)
