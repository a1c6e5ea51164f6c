"""``agent discover`` (GPU feature discovery: the node's labels) and ``agent nvml-info``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from gpu_operator.agent import discovery, nodeapi
from gpu_operator.agent.cli.common import (
    add_common,
    add_config_args,
    add_node_name,
    config_dir,
    env_bool,
    node_name,
    setup,
)
from gpu_operator.agent.deviceplugin.config_file import (
    DevicePluginConfig,
    load_device_plugin_config,
)
from gpu_operator.agent.nvml import Nvml
from gpu_operator.cluster_args import add_cluster_options, credentials
from gpu_operator.durations import EXAMPLES, parse_duration
from gpu_operator.formats import add_output_option, structured


def cmd_discover(args: argparse.Namespace) -> int:
    setup(args)
    configs = config_dir(args)
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
    api = None if args.output_file else nodeapi.connect(*credentials(args))
    nvml = Nvml().open()
    try:
        return discovery.run_discover(
            nvml.inventory,
            settings=discovery.Settings.chooser(args.mig_strategy, config, configs),
            node_name=node,
            api=api,
            output=args.output_file,
            interval_s=parse_duration(interval),
            oneshot=oneshot,
            machine_file=Path(args.machine_type_file),
            with_timestamp=not env_bool("GFD_NO_TIMESTAMP"),
            read_fabrics=nvml.gpu_fabrics,
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
    with Nvml() as nvml:
        sys.stdout.write(structured(inventory_document(nvml), args.output))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "discover",
        help="GPU feature discovery: label the node",
        description="Label the node with its GPUs' features (NVIDIA's gpu-feature-discovery "
        "labels), every --sleep-interval, or once.",
    )
    add_common(p)
    p.add_argument(
        "--mig-strategy",
        choices=["none", "single", "mixed"],
        default=os.environ.get("MIG_STRATEGY") or None,
        help="how MIG devices are labelled (env MIG_STRATEGY; default: the config's, else none)",
    )
    p.add_argument(
        "--sleep-interval",
        default=os.environ.get("GFD_SLEEP_INTERVAL") or None,
        help=f"time between passes, {EXAMPLES} (env GFD_SLEEP_INTERVAL; default 60s)",
    )
    p.add_argument("--oneshot", action="store_true", help="one pass, then exit (env GFD_ONESHOT)")
    p.add_argument(
        "--output-file",
        metavar="FILE",
        default=os.environ.get("GFD_OUTPUT_FILE") or None,
        help="write the labels as key=value lines to FILE ('-': stdout) instead of patching "
        "the Node (env GFD_OUTPUT_FILE)",
    )
    add_config_args(p)
    p.add_argument(
        "--machine-type-file",
        default=os.environ.get("GFD_MACHINE_TYPE_FILE", str(discovery.MACHINE_TYPE_FILE)),
        help="the file the machine type label is read from (env GFD_MACHINE_TYPE_FILE)",
    )
    add_node_name(p)
    add_cluster_options(p)
    p.set_defaults(func=cmd_discover)

    p = sub.add_parser(
        "nvml-info",
        help="print the GPU inventory as YAML",
        description="What NVML reports: driver, GPUs and their MIG devices.",
    )
    add_common(p)
    add_output_option(p, ("yaml", "json"), "yaml")
    p.set_defaults(func=cmd_nvml_info)
