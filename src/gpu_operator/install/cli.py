"""``gpu-operator deploy | bundle | uninstall``: install commands, the only code here that writes
files or deletes policies."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from gpu_operator import __version__
from gpu_operator.api import PolicyError, parse_document
from gpu_operator.cluster_args import add_cluster_options, cluster
from gpu_operator.durations import EXAMPLES, duration_arg
from gpu_operator.formats import add_output_option, object_list, structured
from gpu_operator.install import bundle, helm, manifests
from gpu_operator.install.helm_values import key_table_markdown
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.textfiles import FileProblem, parse_file

DEFAULT_EXAMPLE = "examples/clusterpolicy.yaml"


def write_files(root: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` (relative path -> text) under ``root``; the paths written, in order."""
    written = []
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def load_example(path: str) -> dict[str, Any]:
    """The ClusterPolicy for alm-examples, checked so the bundle never ships a broken example."""
    try:
        doc = parse_file(path, yaml.safe_load)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except FileProblem as exc:
        raise ValueError(f"{exc}: {exc.hint}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a ClusterPolicy object")
    try:
        parse_document(doc)
    except PolicyError as exc:
        raise ValueError("\n".join(f"{path}: {p}" for p in exc.problems)) from None
    return doc


def _error(message: str) -> int:
    sys.stderr.write("".join(f"error: {line}\n" for line in message.splitlines()))
    return 1


def _print_objects(objects: list[dict[str, Any]], output: str) -> None:
    """Objects on stdout: YAML documents, or one JSON List."""
    text = (
        manifests.to_yaml(objects) if output == "yaml" else structured(object_list(objects), output)
    )
    sys.stdout.write(text)


def _cmd_deploy(args: argparse.Namespace) -> int:
    if args.output_dir is None:
        _print_objects(manifests.deploy_objects(args.namespace, args.image), args.output)
        return 0
    files = manifests.deploy_files(args.namespace, args.image)
    for path in write_files(Path(args.output_dir), files):
        sys.stdout.write(f"wrote {path}\n")
    return 0


def _cmd_bundle(args: argparse.Namespace) -> int:
    try:
        example = load_example(args.example)
        if args.output_dir is None:
            objects = bundle.bundle_objects(args.version, example, args.image)
            docs = [obj for path, obj in objects.items() if path.startswith("manifests/")]
            _print_objects(docs, args.output)
            return 0
        files = bundle.bundle_files(args.version, example, args.image)
    except ValueError as exc:
        return _error(str(exc))
    for path in write_files(Path(args.output_dir), files):
        sys.stdout.write(f"wrote {path}\n")
    return 0


def _cmd_chart(args: argparse.Namespace) -> int:
    for path in write_files(Path(args.output_dir), helm.chart_files(args.version)):
        sys.stdout.write(f"wrote {path}\n")
    if args.readme:
        try:
            replace_section(Path(args.readme), VALUES_TABLE, key_table_markdown())
        except ValueError as exc:
            return _error(str(exc))
        sys.stdout.write(f"updated the values table in {args.readme}\n")
    return 0


VALUES_TABLE = "helm-values-table"


def replace_section(path: Path, name: str, body: str) -> None:
    """Replace what lies between ``<!-- name:start -->`` and ``<!-- name:end -->`` in ``path``."""
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    text = path.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise ValueError(f"{path}: no {start.strip()} ... {end} section to replace")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + start + body + end + tail, encoding="utf-8")


def _cmd_uninstall(args: argparse.Namespace) -> int:
    from gpu_operator.install.uninstall import UninstallError, uninstall

    try:
        uninstall(
            cluster(args),
            sys.stdout,
            wait=args.wait,
            timeout=args.timeout,
            delete_crd=args.delete_crd,
            namespace=args.namespace,
        )
    except UninstallError as exc:
        return _error(str(exc))
    return 0


OUTPUT_DIR_NOTE = "; with --output-dir, the files written are listed instead"


def add_install_commands(sub: Any) -> None:
    """Register ``deploy``, ``bundle``, ``chart`` and ``uninstall`` on the top-level
    subparsers."""
    deploy = sub.add_parser(
        "deploy",
        help="print or write the kubectl install (namespace, CRD, RBAC, Deployment)",
        description="The manifests `kubectl apply --server-side -f deploy/` installs.",
    )
    deploy.add_argument(
        "--output-dir", metavar="DIR", help="write them as numbered files into DIR instead"
    )
    add_output_option(deploy, ("yaml", "json"), "yaml", OUTPUT_DIR_NOTE)
    deploy.add_argument(
        "-n",
        "--namespace",
        default=manifests.NAMESPACE,
        help=f"the namespace to install into (default {manifests.NAMESPACE})",
    )
    deploy.add_argument("--image", default=DEFAULT_OPERATOR_IMAGE, help="the operator image")
    deploy.set_defaults(func=_cmd_deploy)

    olm = sub.add_parser(
        "bundle",
        help="print or write the OLM registry+v1 bundle",
        description="The ClusterServiceVersion, CRD and metadata of an OLM bundle.",
    )
    olm.add_argument("--version", required=True, help="bundle (CSV) version, e.g. 0.1.0")
    olm.add_argument(
        "--output-dir", metavar="DIR", help="write manifests/ and metadata/ into DIR instead"
    )
    add_output_option(olm, ("yaml", "json"), "yaml", OUTPUT_DIR_NOTE)
    olm.add_argument("--image", help="operator image (default: the project's, tag v<version>)")
    olm.add_argument(
        "--example", default=DEFAULT_EXAMPLE, help=f"alm-examples ClusterPolicy ({DEFAULT_EXAMPLE})"
    )
    olm.set_defaults(func=_cmd_bundle)

    chart = sub.add_parser(
        "chart",
        help="write the Helm chart (NVIDIA's chart values keys) into a directory",
        description="The chart in deploy/helm/gpu-operator: same CRD, RBAC and Deployment as "
        "deploy/, and a ClusterPolicy made from the values.",
    )
    chart.add_argument("--output-dir", required=True, metavar="DIR", help="the chart's directory")
    chart.add_argument("--version", default=__version__, help="chart version (default: ours)")
    chart.add_argument(
        "--readme", metavar="FILE", help=f"also update the {VALUES_TABLE} section of FILE"
    )
    chart.set_defaults(func=_cmd_chart)

    remove = sub.add_parser(
        "uninstall",
        help="delete every ClusterPolicy, NVIDIADriver and GPUCluster, clean the nodes, then "
        "the CRDs if asked",
        description="Run while the operator still runs: its finalizers remove the node labels "
        "and taint it added and tear the DRA stack down in order (once it is gone, this removes "
        "its finalizers and cleans the nodes itself). The Helm chart runs this as its pre-delete "
        "hook.",
    )
    add_cluster_options(
        remove,
        namespace=manifests.NAMESPACE,
        namespace_help="the operator's (operand) namespace, where --delete-crd waits for garbage "
        f"collection (default {manifests.NAMESPACE})",
    )
    remove.add_argument(
        "--wait",
        action="store_true",
        help="wait until every resource (and the CRDs) is gone and the nodes are clean",
    )
    remove.add_argument(
        "--timeout",
        type=duration_arg,
        default=300.0,
        metavar="DURATION",
        help=f"how long --wait waits, {EXAMPLES} (default 5m)",
    )
    remove.add_argument(
        "--delete-crd",
        action="store_true",
        help="then, once garbage collection has removed what they owned, the three CRDs too",
    )
    remove.set_defaults(func=_cmd_uninstall)
