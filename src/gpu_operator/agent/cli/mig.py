"""``agent mig-manager`` (applies the layout the node label names) and ``agent mig-parted``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from gpu_operator.agent import nodeapi
from gpu_operator.agent.cli.common import add_common, add_node_name, node_name, setup
from gpu_operator.agent.nvml import Nvml
from gpu_operator.cluster_args import add_cluster_options, credentials
from gpu_operator.usage import UsageProblem

if TYPE_CHECKING:
    from gpu_operator.agent.migparted import MigPartedConfig

DEFAULT_MIG_CONFIG = "/mig-parted-config/config.yaml"


def cmd_mig_manager(args: argparse.Namespace) -> int:
    from gpu_operator.agent import mig_manager, migparted

    setup(args)
    node = node_name(args)
    if not node:
        raise UsageProblem("mig-manager needs the node's name", "--node-name or env NODE_NAME")
    path = args.config_file

    def config() -> MigPartedConfig:
        return migparted.load_mig_config(path)

    namespace = args.namespace or mig_manager.DEFAULT_NAMESPACE
    api = nodeapi.connect(*credentials(args))
    with Nvml() as nvml:
        if args.once:
            step = mig_manager.reconcile(
                api, node, config, nvml, first_pass=True, namespace=namespace
            )
            print(f"{step.phase} {step.reason}".strip())
            return 1 if step.phase == "failed" else 0
        mig_manager.run_mig_manager(api, node, config, nvml, namespace=namespace)
    return 0


def cmd_mig_parted(args: argparse.Namespace) -> int:
    from gpu_operator.agent import migparted

    if args.action != "generate" and not args.config_file:
        if not os.path.exists(DEFAULT_MIG_CONFIG):
            raise UsageProblem(
                f"mig-parted {args.action} needs a config: no {DEFAULT_MIG_CONFIG} here",
                "give one with -f FILE (env CONFIG_FILE)",
            )
        args.config_file = DEFAULT_MIG_CONFIG
    setup(args)
    with Nvml() as nvml:
        if args.action == "generate":
            sys.stdout.write(migparted.standard_configs(nvml.inventory()).to_yaml())
            return 0
        config = migparted.load_mig_config(args.config_file)
        try:  # a config that cannot be planned is a MigPlanError: a ValueError, bad input
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
        except migparted.MigApplyError as exc:  # NVML refused: the GPU and step, in one line
            raise SystemExit(str(exc)) from exc


def register(sub: Any) -> None:
    p = sub.add_parser(
        "mig-manager",
        help="apply the MIG layout named by nvidia.com/mig.config",
        description="NVIDIA's k8s-mig-manager: apply the mig-parted config the node's "
        "nvidia.com/mig.config label names, pausing the GPU operands meanwhile, and report "
        "the outcome in nvidia.com/mig.config.state.",
    )
    add_common(p)
    p.add_argument(
        "--config-file",
        default=os.environ.get("CONFIG_FILE", DEFAULT_MIG_CONFIG),
        help="mig-parted config or ConfigMap YAML (env CONFIG_FILE)",
    )
    add_node_name(p)
    add_cluster_options(
        p,
        namespace=os.environ.get("DEFAULT_GPU_CLIENTS_NAMESPACE"),
        namespace_help="where the operands to pause run (env DEFAULT_GPU_CLIENTS_NAMESPACE; "
        "default gpu-operator)",
    )
    p.add_argument("--once", action="store_true", help="reconcile until idle, then exit")
    p.set_defaults(func=cmd_mig_manager)

    p = sub.add_parser(
        "mig-parted",
        help="plan/apply a MIG config locally, or generate configs",
        description="What nvidia-mig-parted does, on this node's GPUs: plan or apply one named "
        "config of a mig-parted config file, or print standard configs for these GPUs.",
    )
    add_common(p)
    p.add_argument(
        "action",
        choices=["plan", "apply", "generate"],
        help="plan: print what applying would do; apply: do it; generate: print configs",
    )
    p.add_argument(
        "config", nargs="?", default="all-disabled", help="config name (default all-disabled)"
    )
    p.add_argument(
        "--config-file",
        "-f",
        metavar="FILE",
        default=os.environ.get("CONFIG_FILE") or None,
        help=f"mig-parted config or ConfigMap YAML (env CONFIG_FILE; default {DEFAULT_MIG_CONFIG})",
    )
    p.set_defaults(func=cmd_mig_parted)
