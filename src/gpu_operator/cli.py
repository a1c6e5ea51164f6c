"""Command line: ``gpu-operator run | render | crd | migrate | deploy | ... | agent ...``.

:func:`main` is the one error path: whatever a command raises becomes one line on stderr and an
exit code (:mod:`gpu_operator.cli_errors`), with the traceback only under ``--debug`` or
LOG_LEVEL=debug. Usage errors are one line too (:class:`Parser`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from gpu_operator import __version__
from gpu_operator.agent.cli import add_agent_commands
from gpu_operator.api.crd import printable_crds
from gpu_operator.argtree import leaves
from gpu_operator.cli_errors import BAD_INPUT, USAGE, exit_codes_text, explain, one_line
from gpu_operator.cluster_args import add_cluster_options, cluster
from gpu_operator.formats import add_output_option, structured
from gpu_operator.install.cli import add_install_commands
from gpu_operator.logsetup import add_log_format_option, wants_debug
from gpu_operator.migrate_cli import add_migrate_command
from gpu_operator.render_cli import add_render_command, dump_yaml

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

__all__ = ["Parser", "build_parser", "dump_yaml", "main", "package_version"]

DESCRIPTION = """\
Install and run the NVIDIA GPU stack on Kubernetes from one ClusterPolicy: the
operator (run) and its node agents (agent ...); policies rendered and migrated
offline (render, migrate); the install as CRDs, manifests, a Helm chart or an
OLM bundle (crd, deploy, chart, bundle) and its removal (uninstall); the fleet's
driver upgrades and GPU health (upgrade status, health status).
"""
EPILOG = exit_codes_text() + "\nEach command has its own --help."
WATCH_S = 2.0
DEBUG_HELP = "on failure, print the traceback too (also with env LOG_LEVEL=debug)"


class Parser(argparse.ArgumentParser):
    """argparse with a usage error in one line and exit code 2; the usage it would print
    first is one ``--help`` away."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, one_line(f"{self.prog}: {message}", f"see {self.prog} --help") + "\n")


def package_version() -> str:
    """The installed distribution's version; the package's own when it runs from a tree."""
    try:
        return importlib.metadata.version("gpu-operator")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def _cmd_crd(args: argparse.Namespace) -> int:
    if not args.apply:
        crd = next(c for c in printable_crds() if c["spec"]["names"]["kind"].lower() == args.kind)
        sys.stdout.write(dump_yaml([crd]))
        return 0
    from gpu_operator.controller.runtime.crd_install import ensure_crds

    for kind, applied in ensure_crds(cluster(args)).items():
        sys.stdout.write(f"applied the {kind} CRD\n" if applied else f"the {kind} CRD is current\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The whole command line. It wires the simulation (:mod:`gpu_operator.sim`, above the
    agents, which never import it) into the agents it offers: its commands under ``agent``,
    and its NVML (``--simulate``, a stub driver) registered with their NVML loader. Imported
    here rather than with this module, which other modules import for less (:func:`dump_yaml`)."""
    from gpu_operator.sim import commands as sim_commands
    from gpu_operator.sim import registration as sim_registration

    sim_registration.register()
    parser = Parser(
        prog="gpu-operator",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpu-operator {package_version()}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_agent_commands(sub, more=(sim_commands.register,))
    crd = sub.add_parser(
        "crd",
        help="print one CustomResourceDefinition, or apply the operator's three",
        description="Print the ClusterPolicy, GPUCluster, NVIDIADriver or ComputeDomain CRD; "
        "with --apply, install or upgrade the first three in the cluster as the operator does "
        "at start-up (a newer CRD there is left alone).",
    )
    crd.add_argument(
        "--kind",
        type=str.lower,
        choices=("clusterpolicy", "gpucluster", "nvidiadriver", "computedomain"),
        default="clusterpolicy",
        help="which CRD to print, any case (default: ClusterPolicy)",
    )
    crd.add_argument(
        "--apply", action="store_true", help="install or upgrade every CRD in the cluster"
    )
    add_cluster_options(crd)
    crd.set_defaults(func=_cmd_crd)
    add_install_commands(sub)
    add_render_command(sub)

    add_migrate_command(sub)

    run = sub.add_parser(
        "run",
        help="run the operator",
        description="Watch the cluster and keep the GPU stack as the active ClusterPolicy says.",
    )
    add_cluster_options(
        run, namespace_help="operand namespace (default: $OPERATOR_NAMESPACE or gpu-operator)"
    )
    run.add_argument(
        "--no-install-crd",
        dest="install_crd",
        action="store_false",
        help="do not install or upgrade the ClusterPolicy, GPUCluster and NVIDIADriver CRDs "
        "at start-up",
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
        metavar="SECONDS",
        help="seconds a standby waits for a silent leader before taking over (renewed every "
        "sixth; default 30)",
    )
    run.add_argument("--health-port", type=int, default=8080, help="/healthz port, 0 for none")
    run.add_argument("--metrics-port", type=int, default=8081, help="/metrics port, 0 for none")
    add_log_format_option(run)
    run.set_defaults(func=_cmd_run)

    domains = sub.add_parser(
        "compute-domain-controller",
        help="run the ComputeDomain controller (the GPUCluster's, for multi-node NVLink)",
        description="Give each ComputeDomain its IMEX daemons and channel template, report "
        "its status, and take it apart when it is deleted.",
    )
    add_cluster_options(
        domains,
        namespace_help="where the IMEX daemons run (default: $NAMESPACE or gpu-operator)",
    )
    domains.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        help="act without holding the Lease (only ever with a single replica)",
    )
    domains.add_argument("--health-port", type=int, default=8080, help="/healthz port, 0: none")
    add_log_format_option(domains)
    domains.set_defaults(func=_cmd_compute_domain_controller)

    upgrade = sub.add_parser(
        "upgrade",
        help="driver upgrades across the fleet",
        description="The fleet's driver upgrades, as the operator rolls them.",
    )
    upgrade_sub = upgrade.add_subparsers(dest="upgrade_command", required=True, metavar="COMMAND")
    status = upgrade_sub.add_parser(
        "status",
        help="per-node upgrade state and overall progress, read from the cluster",
        description="Each GPU node's driver upgrade state, how long it has been in it and "
        "whether it is schedulable, then the fleet's progress (one table per pool when the "
        "policy uses NVIDIADrivers). Read from node labels and the policy's status, so it "
        "answers whichever operator replica leads, or none.",
    )
    add_cluster_options(status)
    status.add_argument("--policy", default=None, help="ClusterPolicy name (default: the only one)")
    _add_watch(status)
    add_output_option(status, ("table", "json", "yaml"), "table")
    status.set_defaults(func=_cmd_upgrade_status)

    health = sub.add_parser(
        "health",
        help="GPU health remediation across the fleet",
        description="GPU health across the fleet, as the remediation sees it.",
    )
    health_sub = health.add_subparsers(dest="health_command", required=True, metavar="COMMAND")
    hstatus = health_sub.add_parser(
        "status",
        help="unhealthy and quarantined GPU nodes: since when, why, what is being done",
        description="Each GPU node whose GPUHealthy condition is not True, or that the "
        "remediation holds: since when, why, the remediation step and the quarantine taint; "
        "then the remediation's summary. Read from the nodes and the policy's status.",
    )
    add_cluster_options(hstatus)
    hstatus.add_argument("--all", action="store_true", help="list healthy GPU nodes too")
    _add_watch(hstatus)
    add_output_option(
        hstatus, ("table", "wide", "json", "yaml"), "table", "; wide: the whole reason"
    )
    hstatus.set_defaults(func=_cmd_health_status)
    for leaf in leaves(parser):
        leaf.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )
    return parser


def _add_watch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help=f"print it again every {WATCH_S:.0f} s until ^C (a terminal is cleared first)",
    )


def _show(text: Callable[[], str], *, watch: bool, output: str) -> int:
    """Print ``text()`` once, or every few seconds like watch(1) until ^C. Only a terminal is
    cleared before a table: a pipe or a file gets each refresh after the last, with no escape
    codes in it (YAML ones as documents of one stream)."""
    import time

    clear = watch and output in ("table", "wide") and sys.stdout.isatty()
    while True:
        page = text()
        if clear:
            sys.stdout.write("\x1b[H\x1b[2J")
        elif watch and output == "yaml":
            sys.stdout.write("---\n")
        sys.stdout.write(page)
        sys.stdout.flush()
        if not watch:
            return 0
        try:
            time.sleep(WATCH_S)
        except KeyboardInterrupt:
            return 0


def _page(output: str, table: Callable[[], str], data: Callable[[], Any]) -> str:
    """The table, or the same as data in ``output`` (json, yaml)."""
    return table() if output in ("table", "wide") else structured(data(), output)


def _policies(kube: Kube, name: str | None) -> list[dict[str, Any]]:
    """The ClusterPolicies named ``name`` (every one when None), the active ones first."""
    chosen = [
        p for p in kube.list_objects("ClusterPolicy") if name in (None, p["metadata"]["name"])
    ]
    return sorted(chosen, key=lambda p: (p.get("status") or {}).get("state") == "ignored")


def _cmd_health_status(args: argparse.Namespace) -> int:
    from gpu_operator.kube import INTERACTIVE
    from gpu_operator.remediation.report import health_document, health_report

    kube = cluster(args, INTERACTIVE)

    def page() -> str:
        status = (_policies(kube, None) or [{}])[0].get("status") or {}
        nodes = kube.list_objects("Node")
        return _page(
            args.output,
            lambda: health_report(nodes, status, all_nodes=args.all, wide=args.output == "wide"),
            lambda: health_document(nodes, status, all_nodes=args.all),
        )

    return _show(page, watch=args.watch, output=args.output)


def _cmd_upgrade_status(args: argparse.Namespace) -> int:
    from gpu_operator.kube import INTERACTIVE
    from gpu_operator.upgrade.report import (
        pool_document,
        pool_report,
        status_document,
        status_report,
    )

    kube = cluster(args, INTERACTIVE)
    if not _policies(kube, args.policy):
        named = f" named {args.policy}" if args.policy else ""
        found = f"no ClusterPolicy{named} found"
        sys.stderr.write(one_line(found, "apply one (e.g. examples/clusterpolicy.yaml)") + "\n")
        return BAD_INPUT

    def page() -> str:
        chosen = _policies(kube, args.policy)
        nodes = kube.list_objects("Node")
        if not chosen:  # deleted while watching
            return _page(args.output, lambda: "no ClusterPolicy found\n", lambda: {"nodes": []})
        policy = chosen[0]
        if ((policy.get("spec") or {}).get("driver") or {}).get("useNvidiaDriverCRD"):
            drivers = kube.list_objects("NVIDIADriver")  # each upgrades its own pool
            return _page(
                args.output,
                lambda: pool_report(nodes, drivers),
                lambda: pool_document(nodes, drivers),
            )
        status = policy.get("status") or {}
        return _page(
            args.output,
            lambda: status_report(nodes, status),
            lambda: status_document(nodes, status),
        )

    return _show(page, watch=args.watch, output=args.output)


def _cmd_run(args: argparse.Namespace) -> int:
    from gpu_operator.controller.runner import main_run  # kopf is heavy: import it when needed

    return main_run(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespace=args.namespace,
        apply_crd=args.install_crd,
        leader_election=args.leader_election,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        lease_seconds=args.lease_duration,
        log_format=args.log_format,
    )


def _cmd_compute_domain_controller(args: argparse.Namespace) -> int:
    from gpu_operator.controller.computedomain.process import main as main_domains

    try:
        return main_domains(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace,
            leader_election=args.leader_election,
            health_port=args.health_port,
            log_format=args.log_format,
        )
    except ValueError as exc:  # a bad number in the Deployment's environment
        sys.stderr.write(one_line(str(exc), "fix the controller's environment") + "\n")
        return BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Whatever it raises is reported in one line with its exit code (see
    :mod:`gpu_operator.cli_errors`); the traceback too with ``--debug`` or LOG_LEVEL=debug."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except SystemExit as exc:  # a command's own "cannot go on" message
        if not isinstance(exc.code, str):
            raise
        sys.stderr.write(one_line(exc.code) + "\n")
        return 1
    except (Exception, KeyboardInterrupt) as exc:
        code, line = explain(exc)
        if args.debug or wants_debug():
            traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.write(line + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
