"""``agent exporter`` (Prometheus GPU metrics) and ``agent validate`` (the node's stack)."""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_operator.agent import nodeapi, validate
from gpu_operator.agent.cli.common import add_common, add_node_name, env_bool, node_name, setup
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.podresources import KUBELET_SOCKET
from gpu_operator.cluster_args import add_cluster_options, credentials
from gpu_operator.textfiles import FileProblem
from gpu_operator.usage import UsageProblem

if TYPE_CHECKING:
    from gpu_operator.agent.driverready import DriverLocation

log = logging.getLogger(__name__)

EXPORTER_PORT = 9400
UVM_NODE = "dev/nvidia-uvm"


def cmd_exporter(args: argparse.Namespace) -> int:
    from gpu_operator.agent import exporter

    setup(args)
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


def cmd_validate(args: argparse.Namespace) -> int:
    if args.driver_install_dir_ctr_path and not args.simulate:
        located = _locate_driver(args)
        if located is None:
            return 1
        args.driver_root, args.host_driver_root = located.container, located.host
    setup(args)
    node = node_name(args)
    components = [c.strip() for c in args.components.split(",") if c.strip()]
    unknown = sorted(set(components) - set(validate.COMPONENTS))
    if unknown:
        raise UsageProblem(
            f"unknown components {', '.join(unknown)} in --components (env COMPONENTS)",
            f"known: {', '.join(validate.COMPONENTS)}",
        )
    try:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FileProblem(
            args.output_dir,
            f"cannot write the validation files there ({exc.strerror})",
            "give a directory this user may write with --output-dir (env VALIDATIONS_DIR)",
        ) from exc
    read_node = None
    if "plugin" in components and node:
        api = nodeapi.connect(*credentials(args))

        def read_node() -> nodeapi.NodeView:
            return nodeapi.read_node(api, node)

    def read_inventory() -> Any:
        with Nvml() as nvml:
            return nvml.inventory()

    validator = validate.Validator(
        read_inventory=read_inventory,
        read_node=read_node,
        runtime_configs=args.runtime_config or validate.host_runtime_configs(args.host_root),
        directory=Path(args.output_dir),
        components=components,
        driver_root=args.host_driver_root,
        container_root=args.driver_root,
        uvm_device=uvm_device(args),
    )
    return validate.run_validator(
        validator,
        interval_s=args.interval,
        oneshot=args.oneshot,
        until_ready=args.with_wait,
        stop=threading.Event(),
    )


def _locate_driver(args: argparse.Namespace) -> DriverLocation | None:
    """Which of the two roots holds the driver: the driver container's install dir, or the
    host's / (NVIDIA's driver-validation init container); with --with-wait, until one does."""
    from gpu_operator.agent.driverready import DriverLocation, locate
    from gpu_operator.agent.driverroot import DriverNotFound

    candidates = [
        DriverLocation(args.driver_install_dir, args.driver_install_dir_ctr_path),
        DriverLocation("/", args.host_root),
    ]
    while True:
        try:
            found = locate(candidates)
        except DriverNotFound as exc:
            log.warning("no driver yet: %s", exc)
            if not args.with_wait:
                return None
            time.sleep(args.interval)
            continue
        log.info("driver root %s (on the host: %s)", found.container, found.host)
        return found


def uvm_device(args: argparse.Namespace) -> Path | Callable[[], Path] | None:
    """``--uvm-device``; by default ``<dev root>/dev/nvidia-uvm``, the dev root being where the
    driver's device nodes are (``/``, or the driver root's own ``dev/``), looked up at each
    check (a driver container makes them after this starts); unchecked under simulated NVML."""
    from gpu_operator.agent.driverroot import dev_root_of

    if args.uvm_device is not None:
        return Path(args.uvm_device) if args.uvm_device else None
    if getattr(args, "simulate", None):
        return None
    root = args.driver_root
    return lambda: Path(dev_root_of(root) or "/", UVM_NODE)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "exporter",
        help="Prometheus GPU metrics on :9400 (dcgm-exporter names)",
        description="Serve the GPUs' metrics under dcgm-exporter's names and labels on "
        "/metrics, read from NVML every --interval-ms.",
    )
    add_common(p)
    p.add_argument(
        "--collectors",
        "-f",
        default=os.environ.get("DCGM_EXPORTER_COLLECTORS") or None,
        help="counters CSV (env DCGM_EXPORTER_COLLECTORS); default: all NVML fields",
    )
    p.add_argument(
        "--address",
        "-a",
        default=os.environ.get("DCGM_EXPORTER_LISTEN", ":9400"),
        help="[HOST]:PORT to serve on (env DCGM_EXPORTER_LISTEN; default :9400)",
    )
    p.add_argument(
        "--interval-ms",
        "-c",
        type=int,
        default=int(os.environ.get("DCGM_EXPORTER_INTERVAL", "30000")),
        help="milliseconds between NVML reads (env DCGM_EXPORTER_INTERVAL; default 30000)",
    )
    p.add_argument(
        "--pod-resources-socket",
        default=os.environ.get("POD_RESOURCES_SOCKET", KUBELET_SOCKET),
        help=f"the kubelet's PodResources socket (env POD_RESOURCES_SOCKET; default "
        f"{KUBELET_SOCKET})",
    )
    p.add_argument(
        "--kubernetes",
        "-k",
        action=argparse.BooleanOptionalAction,
        default=env_bool("DCGM_EXPORTER_KUBERNETES", True),
        help="label series with the pod holding the GPU, from the PodResources socket (env "
        "DCGM_EXPORTER_KUBERNETES; on unless set false, where NVIDIA's exporter is off)",
    )
    p.set_defaults(func=cmd_exporter)

    p = sub.add_parser(
        "validate",
        help="validate driver, toolkit, CUDA and device plugin",
        description="Check each component of the node's GPU stack and write NVIDIA's "
        "validation files (the marker files other operands wait for).",
    )
    add_common(p)
    p.add_argument(
        "--components",
        default=os.environ.get("COMPONENTS", ",".join(validate.COMPONENTS)),
        help=f"comma-separated, of {', '.join(validate.COMPONENTS)} (env COMPONENTS; default all)",
    )
    p.add_argument(
        "--output-dir",
        metavar="DIR",
        default=os.environ.get("VALIDATIONS_DIR", str(validate.VALIDATIONS_DIR)),
        help=f"where the validation files go (env VALIDATIONS_DIR; default "
        f"{validate.VALIDATIONS_DIR})",
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
    p.add_argument(
        "--host-driver-root",
        default=os.environ.get("NVIDIA_DRIVER_ROOT", "/"),
        help="the driver root on the host, written into the validations file (env "
        "NVIDIA_DRIVER_ROOT; default /)",
    )
    p.add_argument(
        "--uvm-device",
        default=os.environ.get("NVIDIA_UVM_DEVICE"),
        help="device node CUDA needs (default <dev root>/dev/nvidia-uvm, the dev root being / "
        "or the driver root where its own dev/nvidiactl is; not checked when simulating; "
        "'' skips it) (env NVIDIA_UVM_DEVICE)",
    )
    p.add_argument(
        "--driver-install-dir",
        default=os.environ.get("DRIVER_INSTALL_DIR") or "/run/nvidia/driver",
        help="a driver container's install dir on the host (env DRIVER_INSTALL_DIR)",
    )
    p.add_argument(
        "--driver-install-dir-ctr-path",
        default=os.environ.get("DRIVER_INSTALL_DIR_CTR_PATH") or None,
        help="where that dir is mounted here: given, the driver is looked for there and in "
        "--host-root, and the driver-ready file says which (env DRIVER_INSTALL_DIR_CTR_PATH)",
    )
    p.add_argument(
        "--with-wait",
        action="store_true",
        default=env_bool("WITH_WAIT"),
        help="wait until every check passes, then exit 0 (an init container; env WITH_WAIT)",
    )
    p.add_argument(
        "--interval", type=float, default=10.0, help="seconds between checks (default 10)"
    )
    p.add_argument("--oneshot", action="store_true", help="check once, then exit")
    add_node_name(p)
    add_cluster_options(p)
    p.set_defaults(func=cmd_validate)
