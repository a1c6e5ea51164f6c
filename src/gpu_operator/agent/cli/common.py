"""What every agent command shares: logging, where NVML comes from, the node's name, and the
device-plugin config arguments (one file, or a directory of named configs). ``--simulate`` goes
to the simulation the command line registered with the NVML loader (never imported here)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gpu_operator import labels, logsetup
from gpu_operator.agent.driverready import read_ready
from gpu_operator.agent.nvml import (
    ENV_SIMULATE,
    ENV_SIMULATE_STATE,
    driver_root_from_env,
    install_simulated,
    use_driver_root,
)

if TYPE_CHECKING:
    from gpu_operator.agent.deviceplugin.configs import ConfigDir

log = logging.getLogger(__name__)

DRIVER_ROOT_HELP = (
    "where the driver root is in this container: NVML is loaded from it (default: env "
    "CONTAINER_DRIVER_ROOT, else NVIDIA_DRIVER_ROOT, else /)"
)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def setup(args: argparse.Namespace) -> None:
    """Logging (``--log-format``, LOG_LEVEL, LOG_FORMAT), then NVML's source: the simulated
    NVML of ``--simulate``, else the driver root of ``--driver-root`` (commands without one
    keep the loader's default)."""
    logsetup.configure(fmt=getattr(args, "log_format", None))
    spec = getattr(args, "simulate", None)
    if spec:
        install_simulated(spec, getattr(args, "simulate_state", None) or None)
        log.info("using simulated NVML: %s", spec)
    elif getattr(args, "driver_ready", None):
        # A pod that could not know where the driver is: its init container found it.
        ready = read_ready(Path(args.driver_ready))
        if ready is None:
            raise SystemExit(
                f"no driver location in {args.driver_ready}: did the driver-"
                "validation init container run?"
            )
        args.driver_root, args.host_driver_root = ready.container, ready.host
        use_driver_root(ready.container)
    elif getattr(args, "driver_root", None):
        use_driver_root(args.driver_root)


def add_driver_root(parser: argparse.ArgumentParser) -> None:
    """``--driver-root``: where this container has the driver root, to load NVML from."""
    parser.add_argument("--driver-root", default=driver_root_from_env(), help=DRIVER_ROOT_HELP)
    parser.add_argument(
        "--driver-ready",
        default=os.environ.get("DRIVER_READY_FILE") or None,
        help="NVIDIA's driver-ready file: the driver root, on the host and here, as the "
        "driver-validation init container found it (env DRIVER_READY_FILE); over --driver-root",
    )


def add_common(parser: argparse.ArgumentParser) -> None:
    """The options of every command that reads the GPUs: simulated, or from a driver root."""
    parser.add_argument(
        "--simulate",
        metavar="PROFILE:COUNT",
        default=os.environ.get(ENV_SIMULATE) or None,
        help="simulated GPUs instead of the driver, e.g. a100-40gb:8 (env GPU_OPERATOR_SIMULATE)",
    )
    parser.add_argument(
        "--simulate-state",
        metavar="PATH",
        default=os.environ.get(ENV_SIMULATE_STATE) or None,
        help="file sharing simulated MIG state between agents (env GPU_OPERATOR_SIMULATE_STATE)",
    )
    add_driver_root(parser)


def add_node_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name", default=None, help="this node's name (default: env NODE_NAME)"
    )


def node_name(args: argparse.Namespace) -> str | None:
    return cast(str | None, getattr(args, "node_name", None) or os.environ.get("NODE_NAME"))


# -- named configs (NVIDIA's config-manager inputs) ----------------------------------------------
def add_config_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--default-config",
        default=os.environ.get("DEFAULT_CONFIG") or None,
        help="the named config for a node without the label (env DEFAULT_CONFIG)",
    )
    p.add_argument(
        "--fallback-strategies",
        default=os.environ.get("FALLBACK_STRATEGIES") or "named,single",
        help="without label or default: named, single and/or empty (env FALLBACK_STRATEGIES)",
    )
    p.add_argument(
        "--node-label",
        default=os.environ.get("NODE_LABEL") or labels.DEVICE_PLUGIN_CONFIG,
        help=f"the node label naming the config (env NODE_LABEL; default "
        f"{labels.DEVICE_PLUGIN_CONFIG})",
    )


def config_dir(args: argparse.Namespace) -> ConfigDir | None:
    """``--config-dir`` as a ConfigDir (None without one); raises ConfigSelectionError."""
    from gpu_operator.agent.deviceplugin.configs import ConfigDir, parse_fallbacks

    if not args.config_dir:
        return None
    if args.config_file:
        log.info("--config-dir given: CONFIG_FILE %s is not read", args.config_file)
    fallbacks = parse_fallbacks(args.fallback_strategies)
    return ConfigDir(Path(args.config_dir), args.default_config or None, fallbacks, args.node_label)
