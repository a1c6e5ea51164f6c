"""Command line: ``gpu-operator render | crd | ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gpu_operator.agent.cli import add_agent_commands
from gpu_operator.api.crd import all_crds
from gpu_operator.install.cli import add_install_commands
from gpu_operator.migrate_cli import add_migrate_command
from gpu_operator.render_cli import add_render_command, dump_yaml

__all__ = ["build_parser", "dump_yaml", "main"]


def _cmd_crd(args: argparse.Namespace) -> int:
    if not args.apply:
        crd = next(c for c in all_crds() if c["spec"]["names"]["kind"].lower() == args.kind)
        sys.stdout.write(dump_yaml([crd]))
        return 0
    from gpu_operator.controller.crd_install import ensure_crds
    from gpu_operator.kube import connect

    for kind, applied in ensure_crds(connect(args.kubeconfig)).items():
        sys.stdout.write(f"applied the {kind} CRD\n" if applied else f"the {kind} CRD is current\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_agent_commands(sub)
    crd = sub.add_parser(
        "crd",
        help="print the ClusterPolicy (or GPUCluster) CustomResourceDefinition, or apply both",
        description="Print a CRD; with --apply, install or upgrade both in the cluster as the "
        "operator does at start-up (a newer CRD there is left alone).",
    )
    crd.add_argument(
        "--kind",
        type=str.lower,
        choices=("clusterpolicy", "gpucluster", "nvidiadriver"),
        default="clusterpolicy",
        help="which CRD to print, any case (default: ClusterPolicy)",
    )
    crd.add_argument(
        "--apply", action="store_true", help="install or upgrade every CRD in the cluster"
    )
    crd.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else KUBECONFIG)")
    crd.set_defaults(func=_cmd_crd)
    add_install_commands(sub)
    add_render_command(sub)

    add_migrate_command(sub)

    run = sub.add_parser(
        "run",
        help="run the operator",
        description="Watch the cluster and keep the GPU stack as the active ClusterPolicy says.",
    )
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else KUBECONFIG)")
    run.add_argument(
        "-n", "--namespace", help="operand namespace (default: $OPERATOR_NAMESPACE or gpu-operator)"
    )
    run.add_argument(
        "--no-install-crd",
        dest="install_crd",
        action="store_false",
        help="do not install or upgrade the ClusterPolicy and NVIDIADriver CRDs at start-up",
    )
    run.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        help="act without holding the Lease (only ever with a single replica)",
    )
    run.add_argument(
        "--lease-duration",
        type=int,
        default=30,
        help="seconds a standby waits for a silent leader before taking over (renewed every third)",
    )
    run.add_argument("--health-port", type=int, default=8080, help="/healthz port, 0 for none")
    run.add_argument("--metrics-port", type=int, default=8081, help="/metrics port, 0 for none")
    run.set_defaults(func=_cmd_run)

    upgrade = sub.add_parser("upgrade", help="driver upgrades across the fleet")
    upgrade_sub = upgrade.add_subparsers(dest="upgrade_command", required=True)
    status = upgrade_sub.add_parser(
        "status", help="per-node upgrade state and overall progress, read from the cluster"
    )
    status.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG/in-cluster)")
    status.add_argument("--policy", default=None, help="ClusterPolicy name (default: the only one)")
    status.add_argument("-w", "--watch", action="store_true", help="refresh every 2 s until ^C")
    status.set_defaults(func=_cmd_upgrade_status)

    health = sub.add_parser("health", help="GPU health remediation across the fleet")
    health_sub = health.add_subparsers(dest="health_command", required=True)
    hstatus = health_sub.add_parser(
        "status",
        help="unhealthy and quarantined GPU nodes: since when, why, what is being done",
    )
    hstatus.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG/in-cluster)")
    hstatus.add_argument("--all", action="store_true", help="list healthy GPU nodes too")
    hstatus.add_argument("-w", "--watch", action="store_true", help="refresh every 2 s until ^C")
    hstatus.set_defaults(func=_cmd_health_status)
    return parser


def _cmd_health_status(args: argparse.Namespace) -> int:
    from gpu_operator.kube import connect
    from gpu_operator.remediation.report import health_report

    kube = connect(args.kubeconfig)

    def report() -> str:
        policies = kube.list_objects("ClusterPolicy")
        active = [p for p in policies if (p.get("status") or {}).get("state") != "ignored"]
        status = ((active or policies or [{}])[0]).get("status") or {}
        return health_report(kube.list_objects("Node"), status, all_nodes=args.all)

    return _show(report, watch=args.watch)


def _show(report: Callable[[], str], *, watch: bool) -> int:
    """Print ``report()`` once, or every 2 s like watch(1) until ^C."""
    import time

    while True:
        text = report()
        if watch:
            sys.stdout.write("\x1b[H\x1b[2J")
        sys.stdout.write(text)
        sys.stdout.flush()
        if not watch:
            return 0
        try:
            time.sleep(2)
        except KeyboardInterrupt:
            return 0


def _cmd_upgrade_status(args: argparse.Namespace) -> int:
    from gpu_operator.kube import connect
    from gpu_operator.upgrade.report import pool_report, status_report

    kube = connect(args.kubeconfig)
    policies = kube.list_objects("ClusterPolicy")
    if not [p for p in policies if args.policy in (None, p["metadata"]["name"])]:
        sys.stderr.write("no ClusterPolicy found\n")
        return 1

    def report() -> str:
        policies = kube.list_objects("ClusterPolicy")
        chosen = [p for p in policies if args.policy in (None, p["metadata"]["name"])]
        if not chosen:
            return "no ClusterPolicy found\n"
        active = [p for p in chosen if (p.get("status") or {}).get("state") != "ignored"]
        policy = (active or chosen)[0]
        pooled = ((policy.get("spec") or {}).get("driver") or {}).get("useNvidiaDriverCRD")
        if pooled:  # each NVIDIADriver upgrades its own pool
            return pool_report(kube.list_objects("Node"), kube.list_objects("NVIDIADriver"))
        return status_report(kube.list_objects("Node"), policy.get("status") or {})

    return _show(report, watch=args.watch)


def _cmd_run(args: argparse.Namespace) -> int:
    from gpu_operator.controller.runner import main_run  # kopf is heavy: import it when needed

    return main_run(
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        apply_crd=args.install_crd,
        leader_election=args.leader_election,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        lease_seconds=args.lease_duration,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
