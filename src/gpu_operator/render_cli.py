"""``gpu-operator render``: the objects the operator would apply for a document, offline.

Each document of the file is checked by its API module's parser (every bad field named, nothing
printed unless all are valid) and rendered by the renderer its controller uses: ``render`` for a
ClusterPolicy, ``render.driver`` per node pool for an NVIDIADriver (as its own loop does),
``render.gpucluster`` for a GPUCluster. Documents of other kinds (the ConfigMaps beside a policy,
a workload) are printed unchanged, as ``kubectl apply`` would apply them; the ConfigMaps a
ClusterPolicy names are read as the controller reads them from its namespace. The command-line
options stand in for the other cluster facts the controllers observe. What the API server would
refuse is refused here first: names that are not DNS-1123 names, and two documents making the
same object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from gpu_operator.api import gpucluster as gpc
from gpu_operator.api import nvidiadriver as nvd
from gpu_operator.api import policy
from gpu_operator.api.formats import DNS_LABEL_MAX, dns_name, image_name
from gpu_operator.api.gpucluster import GPUClusterSpec, parse_gpucluster
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec, parse_driver_spec
from gpu_operator.api.policy import PolicyError, name_problems, parse_document
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.formats import add_output_option
from gpu_operator.labels import OS_ID, OS_VERSION
from gpu_operator.render import RenderedComponent, default_policy, render_components
from gpu_operator.render.driver import (
    KERNEL_LABEL,
    POOL_LABEL,
    ExtraConfig,
    Pool,
    driver_names,
    render_driver,
)
from gpu_operator.render.engine import SAFE_LOADER
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE, Facts, NodeOS
from gpu_operator.render.gpucluster import render_gpucluster
from gpu_operator.render.user_configs import (
    config_facts,
    reference_problems,
    referenced_configmaps,
)
from gpu_operator.textfiles import read_text, yaml_problem

CLUSTERPOLICY, GPUCLUSTER = policy.KIND, gpc.KIND
KINDS = {CLUSTERPOLICY: policy.API_VERSION, nvd.KIND: nvd.API_VERSION, GPUCLUSTER: gpc.API_VERSION}
KNOWN = f"{CLUSTERPOLICY}, {nvd.KIND} or {GPUCLUSTER}"
GROUP = policy.GROUP  # of all three kinds

DESCRIPTION = f"""\
Render documents into the Kubernetes objects the operator would apply for them,
offline. -f takes one YAML document or a multi-document stream of these kinds:

  {CLUSTERPOLICY} ({KINDS[CLUSTERPOLICY]}): the GPU stack, component by component,
    the driver DaemonSet once per --node-os. Without -f: all defaults.
  {nvd.KIND} ({KINDS[nvd.KIND]}): the driver's ServiceAccount, RBAC,
    startup-probe ConfigMap and DaemonSet for each --node-os (and each --kernel
    when usePrecompiled), as the operator renders each node pool. The hash in
    the DaemonSet's name is of metadata.uid, or of the name when there is none.
  {GPUCLUSTER} ({KINDS[GPUCLUSTER]}): the DRA stack: the kubelet plugin DaemonSet
    and its RBAC, the DeviceClasses, the DRA validator and dcgm-exporter.

Documents of any other kind are printed unchanged. The ConfigMaps a ClusterPolicy
names (device-plugin, MIG manager, exporter configs) are read from the file when
they are in it, in the --namespace, as the operator reads them from its own.

--namespace and --operator-image apply to every kind; --node-os, --runtime and
--openshift to ClusterPolicy and NVIDIADriver; --mps-config and --simulate-gpus
to ClusterPolicy only.
"""


class CliError(Exception):
    """A problem the user can fix; reported on stderr with exit code 1."""


def dump_yaml(docs: Sequence[object]) -> str:
    """Multi-document YAML, block style, keys in the order they were built."""
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=100)


@dataclass(frozen=True)
class Document:
    """One valid document of the stream: its kind, name and parsed spec; a document of
    another kind has no spec and is passed through as it was read (``body``)."""

    kind: str
    name: str
    uid: str
    spec: ClusterPolicySpec | NVIDIADriverSpec | GPUClusterSpec | None
    number: int = 0  # its place in the file, from 1
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"document {self.number} ({self.kind} {self.name})".replace(" )", ")")


@dataclass(frozen=True)
class Rendered:
    document: Document
    objects: list[dict[str, Any]]
    summary: str
    notes: tuple[str, ...] = ()  # what was left out, and the option that renders it


def read_documents(path: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``path`` (``-``: stdin), each a mapping."""
    try:
        # A file that is not UTF-8 text raises a FileProblem naming it.
        text = sys.stdin.read() if path == "-" else read_text(path)
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=SAFE_LOADER) if d is not None]
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: {yaml_problem(exc)}") from None
    if not docs:
        raise CliError(f"{path}: expected a {KNOWN} object, found no document")
    for doc in docs:
        if not isinstance(doc, dict):
            raise CliError(f"{path}: expected a {KNOWN} object, found a {type(doc).__name__}")
    return docs


def parse_nvidiadriver(doc: Mapping[str, Any]) -> NVIDIADriverSpec:
    """A whole NVIDIADriver object, checked as its API server does (kind, name, spec, CEL).

    Its name is also the value of its nodes' pool label, so it has a label value's length.
    """
    problems = []
    if doc.get("apiVersion") != nvd.API_VERSION:
        problems.append(f"apiVersion: must be {nvd.API_VERSION} (got {doc.get('apiVersion')!r})")
    name = (doc.get("metadata") or {}).get("name")
    if not name:
        problems.append("metadata.name: required (the driver's objects are named after it)")
    else:
        problems += name_problems(name, DNS_LABEL_MAX, f"it is the value of the {POOL_LABEL} label")
    if problems:
        raise PolicyError(problems)
    spec = doc.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise PolicyError([f"spec: must be a mapping (got {type(spec).__name__})"])
    parsed = parse_driver_spec(spec)
    if parsed.default and parsed.node_selector:
        raise PolicyError([f"spec.nodeSelector: {nvd.DEFAULT_WITHOUT_SELECTOR['message']}"])
    return parsed


def is_operator_kind(doc: Mapping[str, Any]) -> bool:
    """A document for the operator's parsers: one of its kinds in its group (or with no
    apiVersion, which is then named): another group's ``ClusterPolicy`` (Kyverno's) is not."""
    api_version = doc.get("apiVersion")
    group = str(api_version).split("/", 1)[0] if api_version else GROUP
    return doc.get("kind") in KINDS and group == GROUP


def passed_through(doc: Mapping[str, Any]) -> tuple[str, str]:
    """The kind and name of a document of another kind: what ``kubectl apply`` needs."""
    problems = []
    for key in ("apiVersion", "kind"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            problems.append(f"{key}: required (every document must be a Kubernetes object)")
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        problems.append("metadata.name: required (kubectl apply names every object)")
    if problems:
        raise PolicyError(problems)
    return str(doc["kind"]), str(name)


def parse(doc: Mapping[str, Any], number: int = 0) -> Document:
    """``doc`` validated by its kind's parser; ``PolicyError`` names every bad field."""
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        raise PolicyError([f"metadata: must be a mapping (got {type(meta).__name__})"])
    if not is_operator_kind(doc):
        kind, name = passed_through(doc)
        return Document(kind, name, "", None, number, doc)
    kind = str(doc["kind"])
    name, uid = str((meta or {}).get("name") or ""), str((meta or {}).get("uid") or "")
    spec: ClusterPolicySpec | NVIDIADriverSpec | GPUClusterSpec
    if kind == CLUSTERPOLICY:
        spec = parse_document(doc)
    elif kind == nvd.KIND:
        spec = parse_nvidiadriver(doc)
    else:
        spec = parse_gpucluster(doc)
    return Document(kind, name, uid or name, spec, number, doc)


def load(path: str) -> list[Document]:
    """Every document of ``path``, valid; else a ``CliError`` naming each bad field."""
    docs = read_documents(path)
    parsed, problems = [], []
    for number, doc in enumerate(docs, 1):
        try:
            parsed.append(parse(doc, number))
        except PolicyError as exc:
            problems += [f"{where(path, number, len(docs))}: {problem}" for problem in exc.problems]
    if problems:
        raise CliError("\n".join(problems))
    return parsed


def where(path: str, number: int, count: int) -> str:
    return f"{path} (document {number})" if count > 1 else path


def _namespace_of(doc: Document) -> str | None:
    return (doc.body.get("metadata") or {}).get("namespace")


def with_configmaps(docs: Sequence[Document], facts: Facts, path: str) -> Facts:
    """``facts`` with what the ConfigMaps of the file in ``facts.namespace`` tell (as the
    controller learns it from its namespace); a ConfigMap a policy names that is elsewhere, or
    a choice a policy makes that its ConfigMap lacks, is a ``CliError``."""
    configmaps = [d for d in docs if d.spec is None and d.kind == "ConfigMap"]
    here = {d.name: d.body for d in configmaps if _namespace_of(d) in (None, "", facts.namespace)}
    problems = []
    for doc in docs:
        if not isinstance(doc.spec, ClusterPolicySpec):
            continue
        at = where(path, doc.number, len(docs))
        for name in referenced_configmaps(doc.spec):
            elsewhere = [d for d in configmaps if d.name == name and d.name not in here]
            for cm in elsewhere:
                problems.append(
                    f"{where(path, cm.number, len(docs))}: metadata.namespace: the operator reads "
                    f"ConfigMap {name} from its namespace {facts.namespace!r} (got "
                    f"{_namespace_of(cm)!r}): move it there, or render with -n {_namespace_of(cm)}"
                )
        problems += [f"{at}: {p}" for p in reference_problems(doc.spec, here)]
    if problems:
        raise CliError("\n".join(problems))
    learned = config_facts(list(here.values()))
    return replace(
        facts,
        config_hashes={**facts.config_hashes, **learned.hashes},
        mps_configs=facts.mps_configs | learned.mps,
        configmap_keys=tuple(sorted({**dict(facts.configmap_keys), **learned.keys}.items())),
    )


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What names an object in the API: group, kind, namespace and name."""
    group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return group, str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name"))


def duplicates(rendered: Sequence[Rendered], path: str) -> list[str]:
    """One line for each two documents that make the same object: the second would overwrite
    the first when applied (two ClusterPolicies: only the oldest is ever active)."""
    first: dict[tuple[str, str, str, str], Document] = {}
    clashes: dict[tuple[int, int], list[tuple[str, str, str, str]]] = {}
    docs = {part.document.number: part.document for part in rendered}
    for part in rendered:
        for obj in part.objects:
            key = _identity(obj)
            earlier = first.setdefault(key, part.document)
            if earlier is not part.document:
                clashes.setdefault((earlier.number, part.document.number), []).append(key)
    lines = []
    for (a, b), keys in clashes.items():
        _, kind, namespace, name = min(keys, key=lambda k: k[1] != "DaemonSet")
        more = f" (and {len(keys) - 1} more objects)" if len(keys) > 1 else ""
        both = {docs[a].kind, docs[b].kind}
        fix = (
            "only the oldest ClusterPolicy is ever active: keep one"
            if both == {CLUSTERPOLICY}
            else "keep one of them"
        )
        lines.append(
            f"{path}: {docs[a].label} and {docs[b].label} both make {kind} "
            f"{namespace + '/' if namespace else ''}{name}{more}: {fix}"
        )
    return lines


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns; the last one is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip() + "\n")
    return "".join(lines)


def summary_table(parts: Sequence[RenderedComponent]) -> str:
    """One row per component: is it on, how many objects, which image(s)."""
    rows = [("COMPONENT", "ENABLED", "OBJECTS", "IMAGE")]
    for part in parts:
        enabled = "yes" if part.enabled else "no"
        rows.append((part.component.name, enabled, str(len(part.objects)), ",".join(part.images)))
    return table(rows)


def object_table(objects: Sequence[Mapping[str, Any]]) -> str:
    """One row per object: kind, name, the images of its pods."""
    rows = [("KIND", "NAME", "IMAGE")]
    for obj in objects:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        containers = [*pod.get("initContainers", ()), *pod.get("containers", ())]
        images = dict.fromkeys(str(c.get("image")) for c in containers)
        rows.append((obj["kind"], obj["metadata"]["name"], ",".join(images)))
    return table(rows)


def driver_pools(
    spec: NVIDIADriverSpec, name: str, facts: Facts, kernels: Sequence[str]
) -> list[Pool]:
    """The pools the controller would find on nodes of ``facts.node_oses`` (and ``kernels``):
    none for a precompiled driver without ``kernels``, as for nodes without the kernel label."""
    precompiled = bool(spec.use_precompiled)
    pools: dict[tuple[str, str | None], Pool] = {}
    for os in facts.node_oses:
        for kernel in kernels if precompiled else [None]:
            labels = {OS_ID: os.id, OS_VERSION: os.version_id}
            if kernel:
                labels[KERNEL_LABEL] = kernel
            pool = Pool.of_node(labels, precompiled, name)
            if pool is not None:
                pools.setdefault((pool.os_tag, pool.kernel), pool)
    return [pools[key] for key in sorted(pools, key=lambda k: (k[0], k[1] or ""))]


def render_document(
    doc: Document, facts: Facts, kernels: Sequence[str], taint_key: str
) -> Rendered:
    """What the controller of ``doc.kind`` renders for it, with a summary table; a document of
    another kind, as it is."""
    if doc.spec is None:
        return Rendered(doc, [dict(doc.body)], object_table([doc.body]))
    if isinstance(doc.spec, ClusterPolicySpec):
        parts = render_components(doc.spec, facts)
        summary = summary_table(parts)
        ignored = doc.spec.unimplemented_enabled()
        if ignored:
            summary += f"not implemented, ignored: {', '.join(ignored)}\n"
        return Rendered(doc, [obj for part in parts for obj in part.objects], summary)
    if isinstance(doc.spec, NVIDIADriverSpec):
        extra = ExtraConfig(
            namespace=facts.namespace,
            configmap_keys=dict(facts.configmap_keys),
            openshift=facts.openshift,
            runtime=facts.runtime,
            gpu_taint_key=taint_key,
        )
        objects = []
        for pool in driver_pools(doc.spec, doc.name, facts, kernels):
            names = driver_names(doc.name, doc.uid, doc.spec, pool)
            try:
                objects += render_driver(doc.spec, pool, names, extra)
            except ValueError as err:
                raise CliError(f"{nvd.KIND} {doc.name}: spec.{err}") from None
        notes: tuple[str, ...] = ()
        if doc.spec.use_precompiled and not kernels:
            notes = (
                f"{nvd.KIND} {doc.name}: spec.usePrecompiled: true: its driver DaemonSets are "
                "per kernel, none rendered: give --kernel (the nodes' kernel-version.full)",
            )
        summary = object_table(objects) + "".join(f"not rendered: {n}\n" for n in notes)
        return Rendered(doc, objects, summary, notes)
    objects = render_gpucluster(doc.spec, facts)
    return Rendered(doc, objects, object_table(objects))


def _fail(message: str) -> int:
    sys.stderr.write("".join(f"error: {line}\n" for line in message.splitlines()))
    return 1


def _cmd_render(args: argparse.Namespace) -> int:
    for flag, value, check in (
        ("--namespace", args.namespace, lambda v: dns_name(v, label=True)),
        ("--operator-image", args.operator_image, image_name),
    ):
        try:
            check(value)
        except ValueError as exc:
            return _fail(f"{flag} {value!r}: {exc}")
    facts = Facts(
        namespace=args.namespace,
        runtime=args.runtime,
        node_oses=tuple(args.node_os or Facts.node_oses),
        openshift=args.openshift,
        operator_image=args.operator_image,
        mps_configs=frozenset(args.mps_config or ()),
        simulate_gpus=args.simulate_gpus,
    )
    try:
        docs = load(args.file) if args.file else [Document(CLUSTERPOLICY, "", "", default_policy())]
        facts = with_configmaps(docs, facts, args.file)
    except CliError as exc:
        return _fail(str(exc))
    # NVIDIADrivers tolerate the GPU taint of the ClusterPolicy beside them, as in the cluster.
    policies = [d.spec for d in docs if isinstance(d.spec, ClusterPolicySpec)]
    taint_key = (policies[0] if policies else default_policy()).gpu_node_taint.key
    try:
        rendered = [render_document(d, facts, args.kernel or (), taint_key) for d in docs]
    except CliError as exc:
        return _fail(f"{args.file}: {exc}")
    clashes = duplicates(rendered, args.file)
    if clashes:
        return _fail("\n".join(clashes))
    if args.summary:
        for part in rendered:
            if len(rendered) > 1:
                sys.stdout.write(f"# {part.document.kind} {part.document.name}\n")
            sys.stdout.write(part.summary)
        return 0
    sys.stderr.write("".join(f"note: {n}\n" for part in rendered for n in part.notes))
    objects = [obj for part in rendered for obj in part.objects]
    if args.output == "json":
        items = {"apiVersion": "v1", "kind": "List", "items": objects}
        sys.stdout.write(json.dumps(items, indent=2) + "\n")
    else:
        sys.stdout.write(dump_yaml(objects))
    return 0


def _node_os(text: str) -> NodeOS:
    try:
        return NodeOS.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_render_command(sub: Any) -> None:
    """Register ``render`` on the top-level subparsers."""
    render = sub.add_parser(
        "render",
        help=f"print the objects a {CLUSTERPOLICY}, {nvd.KIND} or {GPUCLUSTER} deploys",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    render.add_argument(
        "-f", "--file", help=f"YAML file of {KNOWN} (and other) documents, '-' for stdin"
    )
    render.add_argument("-n", "--namespace", default=Facts.namespace, help="operand namespace")
    render.add_argument(
        "--node-os",
        action="append",
        type=_node_os,
        metavar="OS",
        help="GPU node OS such as ubuntu22.04 or rhel9.4; repeat for several (default ubuntu22.04)",
    )
    render.add_argument(
        "--kernel",
        action="append",
        metavar="VERSION",
        help="the GPU nodes' kernel (NFD's kernel-version.full), for NVIDIADrivers with "
        "usePrecompiled: true; repeat for several",
    )
    render.add_argument(
        "--runtime",
        choices=["containerd", "crio", "docker"],
        default=Facts.runtime,
        help=f"the GPU nodes' container runtime (default {Facts.runtime})",
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
    add_output_option(render, ("yaml", "json"), "yaml")
    render.add_argument(
        "--summary",
        action="store_true",
        help="print a table instead: per component for a ClusterPolicy, per object otherwise",
    )
    render.set_defaults(func=_cmd_render)
