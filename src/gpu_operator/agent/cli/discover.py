"""``agent discover`` (GPU feature discovery: the node's labels) and ``agent nvml-info``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.agent import discovery, kube
from gpu_operator.agent.cli.common import (
    add_common,
    add_config_args,
    add_node_name,
    config_dir,
    env_bool,
    node_name,
    setup,
)
from gpu_operator.agent.deviceplugin_config import DevicePluginConfig, load_device_plugin_config
from gpu_operator.agent.nvml import Nvml, NvmlError

log = logging.getLogger(__name__)


def cmd_discover(args: argparse.Namespace) -> int:
    from gpu_operator.agent.deviceplugin.configs import ConfigSelectionError

    setup(args)
    try:
        configs = config_dir(args)
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
    oneshot = args.oneshot or env_bool("GFD_ONESHOT")
    node = node_name(args)
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
            with_timestamp=not env_bool("GFD_NO_TIMESTAMP"),
        )
    finally:
        nvml.close()


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


def cmd_nvml_info(args: argparse.Namespace) -> int:
    setup(args)
    try:
        with Nvml() as nvml:
            sys.stdout.write(yaml.safe_dump(inventory_document(nvml), sort_keys=False))
    except NvmlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("discover", help="GPU feature discovery: label the node")
    add_common(p)
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
    add_config_args(p)
    p.add_argument(
        "--machine-type-file",
        default=os.environ.get("GFD_MACHINE_TYPE_FILE", str(discovery.MACHINE_TYPE_FILE)),
    )
    add_node_name(p)
    p.set_defaults(func=cmd_discover)

    p = sub.add_parser("nvml-info", help="print the GPU inventory as YAML")
    add_common(p)
    p.set_defaults(func=cmd_nvml_info)
