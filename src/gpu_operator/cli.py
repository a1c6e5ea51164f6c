"""Command line: ``gpu-operator render | crd | ...``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from gpu_operator.agent.cli import add_agent_commands
from gpu_operator.api import KIND, ClusterPolicySpec, PolicyError, parse_document
from gpu_operator.api.crd import clusterpolicy_crd, gpucluster_crd
from gpu_operator.api.legacy import migrate
from gpu_operator.install.cli import add_install_commands
from gpu_operator.render import RenderedComponent, default_policy, render_components
from gpu_operator.render.engine import SAFE_LOADER
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE, Facts, NodeOS


def dump_yaml(docs: Sequence[object]) -> str:
    """Multi-document YAML, block style, keys in the order they were built."""
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=100)


class CliError(Exception):
    """A problem the user can fix; reported on stderr with exit code 1."""


def _cmd_crd(args: argparse.Namespace) -> int:
    if not args.apply:
        crd = gpucluster_crd() if args.kind == "GPUCluster" else clusterpolicy_crd()
        sys.stdout.write(dump_yaml([crd]))
        return 0
    from gpu_operator.controller.crd_install import ensure_crds
    from gpu_operator.kube import connect

    for kind, applied in ensure_crds(connect(args.kubeconfig)).items():
        sys.stdout.write(f"applied the {kind} CRD\n" if applied else f"the {kind} CRD is current\n")
    return 0


def load_policy(path: str) -> ClusterPolicySpec:
    """The first YAML document of ``path`` (``-`` for stdin) as a validated ClusterPolicy."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return policy_from_text(text, path)


def policy_from_text(text: str, source: str) -> ClusterPolicySpec:
    """Parse and validate a ClusterPolicy document; ``CliError`` lines name ``source``."""
    try:
        doc = next((d for d in yaml.load_all(text, Loader=SAFE_LOADER) if d is not None), None)
    except yaml.YAMLError as exc:
        raise CliError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        found = "no document" if doc is None else f"a {type(doc).__name__}"
        raise CliError(f"{source}: expected a ClusterPolicy object, found {found}")
    try:
        return parse_document(doc)
    except PolicyError as exc:
        raise CliError("\n".join(f"{source}: {problem}" for problem in exc.problems)) from None


def _cmd_migrate(args: argparse.Namespace) -> int:
    """Every ClusterPolicy in the file rewritten for today's schema; other documents as they are."""
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as handle:
                text = handle.read()
        docs = [d for d in yaml.load_all(text, Loader=SAFE_LOADER) if d is not None]
    except OSError as exc:
        return _fail(f"{args.file}: cannot read: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        return _fail(f"{args.file}: not valid YAML: {exc}")
    out, problems = [], []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            out.append(doc)
            continue
        result = migrate(doc)
        name = (result.document.get("metadata") or {}).get("name", "?")
        for note in result.notes:
            sys.stderr.write(f"{args.file}: {name}: {note}\n")
        try:
            parse_document(result.document)
        except PolicyError as exc:
            problems += [f"{args.file}: {name}: {p}" for p in exc.problems]
        out.append(result.document)
    if args.output == "json":
        body = out[0] if len(out) == 1 else {"apiVersion": "v1", "kind": "List", "items": out}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        sys.stdout.write(dump_yaml(out))
    if problems:
        return _fail("\n".join(["still invalid after migration:", *problems]))
    return 0


def _fail(message: str) -> int:
    sys.stderr.write("".join(f"error: {line}\n" for line in message.splitlines()))
    return 1


def _node_os(text: str) -> NodeOS:
    try:
        return NodeOS.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def summary_table(parts: Sequence[RenderedComponent]) -> str:
    """One row per component: is it on, how many objects, which image(s)."""
    rows = [("COMPONENT", "ENABLED", "OBJECTS", "IMAGE")]
    for part in parts:
        enabled = "yes" if part.enabled else "no"
        rows.append((part.component.name, enabled, str(len(part.objects)), ",".join(part.images)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip() + "\n")
    return "".join(lines)


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file) if args.file else default_policy()
    except CliError as exc:
        return _fail(str(exc))
    facts = Facts(
        namespace=args.namespace,
        runtime=args.runtime,
        node_oses=tuple(args.node_os or Facts.node_oses),
        openshift=args.openshift,
        operator_image=args.operator_image,
        mps_configs=frozenset(args.mps_config or ()),
        simulate_gpus=args.simulate_gpus,
    )
    parts = render_components(policy, facts)
    if args.summary:
        out = summary_table(parts)
        ignored = policy.unimplemented_enabled()
        if ignored:
            out += f"not implemented, ignored: {', '.join(ignored)}\n"
        sys.stdout.write(out)
        return 0
    objects: list[dict[str, Any]] = [obj for part in parts for obj in part.objects]
    if args.output == "json":
        items = {"apiVersion": "v1", "kind": "List", "items": objects}
        sys.stdout.write(json.dumps(items, indent=2) + "\n")
    else:
        sys.stdout.write(dump_yaml(objects))
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
        choices=("ClusterPolicy", "GPUCluster"),
        default="ClusterPolicy",
        help="which CRD to print (default ClusterPolicy)",
    )
    crd.add_argument("--apply", action="store_true", help="install or upgrade it in the cluster")
    crd.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else KUBECONFIG)")
    crd.set_defaults(func=_cmd_crd)
    add_install_commands(sub)

    render = sub.add_parser(
        "render",
        help="print the objects a ClusterPolicy deploys",
        description="Render a ClusterPolicy (default: all defaults) into Kubernetes objects.",
    )
    render.add_argument("-f", "--file", help="ClusterPolicy YAML file, '-' for stdin")
    render.add_argument("-n", "--namespace", default=Facts.namespace, help="operand namespace")
    render.add_argument(
        "--node-os",
        action="append",
        type=_node_os,
        metavar="OS",
        help="GPU node OS such as ubuntu22.04 or rhel9.4; repeat for several (default ubuntu22.04)",
    )
    render.add_argument(
        "--runtime", choices=["containerd", "crio", "docker"], default=Facts.runtime
    )
    render.add_argument("--openshift", action="store_true", help="add OpenShift SCC access")
    render.add_argument(
        "--operator-image", default=DEFAULT_OPERATOR_IMAGE, help="the project's image"
    )
    render.add_argument(
        "--mps-config",
        action="append",
        metavar="CONFIGMAP",
        help="the device-plugin ConfigMap configures MPS sharing: render the MPS control daemon",
    )
    render.add_argument(
        "--simulate-gpus",
        metavar="PROFILE:COUNT",
        help="the project's agents use simulated GPUs (GPU_OPERATOR_SIMULATE), e.g. a100-40gb:8",
    )
    render.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    render.add_argument(
        "--summary", action="store_true", help="print a per-component table instead"
    )
    render.set_defaults(func=_cmd_render)

    migrate_cmd = sub.add_parser(
        "migrate",
        help="rewrite an old ClusterPolicy for today's schema",
        description="Print the file with every field NVIDIA moved or removed at its place today "
        "(what changed goes to stderr; exit 1 if something else is still invalid).",
    )
    migrate_cmd.add_argument("-f", "--file", required=True, help="YAML file, '-' for stdin")
    migrate_cmd.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    migrate_cmd.set_defaults(func=_cmd_migrate)

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
        help="do not install or upgrade the ClusterPolicy CRD at start-up",
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
    return parser


def _cmd_upgrade_status(args: argparse.Namespace) -> int:
    import time

    from gpu_operator.kube import connect
    from gpu_operator.upgrade.report import status_report

    kube = connect(args.kubeconfig)
    while True:
        policies = kube.list_objects("ClusterPolicy")
        chosen = [p for p in policies if args.policy in (None, p["metadata"]["name"])]
        if not chosen:
            sys.stderr.write("no ClusterPolicy found\n")
            return 1
        active = [p for p in chosen if (p.get("status") or {}).get("state") != "ignored"]
        report = status_report(kube.list_objects("Node"), (active or chosen)[0].get("status") or {})
        if args.watch:
            sys.stdout.write("\x1b[H\x1b[2J")  # clear the screen, like watch(1)
        sys.stdout.write(report)
        sys.stdout.flush()
        if not args.watch:
            return 0
        try:
            time.sleep(2)
        except KeyboardInterrupt:
            return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from gpu_operator.controller.runner import main_run  # import the operator only when run

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
