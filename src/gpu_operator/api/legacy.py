"""Fields NVIDIA moved or removed across its releases: where each lives now, and the rewrite.

Old ClusterPolicy documents (operator 1.x alm-examples, samples copied into GitOps repos, Helm
values pasted into a CR) still carry them. NVIDIA's schema prunes them, so what the user meant
is silently lost. Here the CRD declares them (``crd.py``), the API server keeps them, and the
models refuse them with the new place named, in ``gpu-operator render`` and in the policy's
status alike. ``migrate`` rewrites a document for today's schema.

Each entry is data: where the field was, what old documents put there, the hint, and how
``migrate`` carries the value over. The NVIDIA release named is the first one whose schema no
longer has the field (facts from NVIDIA's published CRDs and samples).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

MIGRATE = "spec: `gpu-operator migrate -f FILE` rewrites the fields NVIDIA moved or removed"

# Operand sections that once had their own scheduling fields (NVIDIA 1.x).
COMPONENT_SECTIONS = (
    "driver",
    "toolkit",
    "devicePlugin",
    "dcgm",
    "dcgmExporter",
    "gfd",
    "migManager",
    "nodeStatusExporter",
    "validator",
)

Spec = dict[str, Any]
# A rewrite moves ``value`` (found at ``where``) into ``spec``; it returns what it did, for the
# user. The legacy field itself is removed by ``migrate`` afterwards.
Rewrite = Callable[[Spec, str, Any], str]

OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
ARRAY: dict[str, Any] = {"type": "array", "items": OBJECT}
STRING: dict[str, Any] = {"type": "string"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
INTEGER: dict[str, Any] = {"type": "integer"}


def dotted(path: tuple[str, ...]) -> str:
    return "spec." + ".".join(path)


def _get(spec: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = spec
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _set(spec: Spec, path: tuple[str, ...], value: Any) -> None:
    node = spec
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def move_to(*target: str) -> Rewrite:
    """The value belongs at ``target``; a value already there wins (and the clash is said)."""

    def rewrite(spec: Spec, where: str, value: Any) -> str:
        current = _get(spec, target)
        if current is None:
            _set(spec, target, value)
            return f"moved {where} to {dotted(target)}"
        if current == value:
            return f"removed {where} (same as {dotted(target)})"
        return f"removed {where}: {dotted(target)} is already set to {current!r}, which wins"

    return rewrite


def merge_into(*target: str) -> Rewrite:
    """A list that is now one list for every operand: append what is not there yet."""

    def rewrite(spec: Spec, where: str, value: Any) -> str:
        current = list(_get(spec, target) or [])
        added = [item for item in value if item not in current]
        _set(spec, target, current + added)
        return f"merged {where} into {dotted(target)}"

    return rewrite


def to_env(section: str, name: str, unit: str = "") -> Rewrite:
    """A setting the operand now reads from an environment variable in ``section.env``."""

    def rewrite(spec: Spec, where: str, value: Any) -> str:
        env = list(_get(spec, (section, "env")) or [])
        if any(isinstance(e, Mapping) and e.get("name") == name for e in env):
            return f"removed {where}: spec.{section}.env already sets {name}, which wins"
        text = f"{value}{unit}" if not isinstance(value, bool) else str(value).lower()
        _set(spec, (section, "env"), [*env, {"name": name, "value": text}])
        return f"moved {where} to spec.{section}.env {name}={text}"

    return rewrite


def drop(reason: str) -> Rewrite:
    def rewrite(spec: Spec, where: str, value: Any) -> str:
        return f"removed {where}: {reason}"

    return rewrite


@dataclass(frozen=True)
class LegacyField:
    section: str  # spec section, or "*" for each of COMPONENT_SECTIONS
    path: tuple[str, ...]  # inside the section
    schema: dict[str, Any]  # what old documents put there (the CRD keeps it)
    hint: str  # where it lives now, or what replaced it
    rewrite: Rewrite = field(compare=False)

    def expand(self) -> Iterator[tuple[tuple[str, ...], LegacyField]]:
        sections = COMPONENT_SECTIONS if self.section == "*" else (self.section,)
        for section in sections:
            yield (section, *self.path), self


_OFF_NODE = (
    "operands run on GPU nodes labelled nvidia.com/gpu.deploy.<component>=true by the "
    "operator; set that label to false on a node to keep a component off it"
)

LEGACY_FIELDS: tuple[LegacyField, ...] = (
    LegacyField(
        "driver",
        ("use_ocp_driver_toolkit",),
        BOOLEAN,
        "moved to spec.operator.use_ocp_driver_toolkit in NVIDIA v1.11",
        move_to("operator", "use_ocp_driver_toolkit"),
    ),
    LegacyField(
        "driver",
        ("driver_toolkit_image",),
        STRING,
        "not a ClusterPolicy field: on OpenShift the Driver Toolkit image comes from the "
        "cluster's release; spec.operator.use_ocp_driver_toolkit turns it on",
        drop("the Driver Toolkit image comes from the OpenShift release"),
    ),
    LegacyField(
        "driver",
        ("rollingUpdate",),
        OBJECT,
        "not a driver field: the driver DaemonSet is always updated OnDelete, node by node as "
        "spec.driver.upgradePolicy says; other operands roll as spec.daemonsets.rollingUpdate "
        "says",
        drop("the driver is upgraded node by node as spec.driver.upgradePolicy says"),
    ),
    LegacyField(
        "driver",
        ("upgradePolicy", "drain", "enabled"),
        BOOLEAN,
        "renamed to spec.driver.upgradePolicy.drain.enable",
        move_to("driver", "upgradePolicy", "drain", "enable"),
    ),
    LegacyField(
        "driver",
        ("repoConfig", "destinationDir"),
        STRING,
        "removed from NVIDIA's schema after v1.8: the repository files are mounted where each "
        "OS's package manager reads them; spec.driver.repoConfig.configMapName is all it takes",
        drop("the repository files are mounted where the OS's package manager reads them"),
    ),
    LegacyField(
        "operator",
        ("deployGFD",),
        BOOLEAN,
        "removed in NVIDIA v1.6: GPU feature discovery is switched with spec.gfd.enabled",
        move_to("gfd", "enabled"),
    ),
    LegacyField(
        "operator",
        ("validator",),
        OBJECT,
        "removed in NVIDIA v1.7: it named a CUDA sample image that is no longer run; the "
        "validator is configured in spec.validator",
        drop("the CUDA sample image is no longer run; spec.validator configures validation"),
    ),
    LegacyField(
        "gfd",
        ("migStrategy",),
        {"type": "string", "enum": ["none", "single", "mixed"]},
        "moved to spec.mig.strategy in NVIDIA v1.7",
        move_to("mig", "strategy"),
    ),
    LegacyField(
        "gfd",
        ("sleepInterval",),
        STRING,
        "never in NVIDIA's schema: GPU feature discovery reads GFD_SLEEP_INTERVAL from "
        "spec.gfd.env",
        to_env("gfd", "GFD_SLEEP_INTERVAL"),
    ),
    LegacyField(
        "gfd",
        ("discoveryIntervalSeconds",),
        INTEGER,
        "removed in NVIDIA v1.6: set GFD_SLEEP_INTERVAL (such as 60s) in spec.gfd.env",
        to_env("gfd", "GFD_SLEEP_INTERVAL", "s"),
    ),
    LegacyField(
        "*",
        ("tolerations",),
        ARRAY,
        "moved to spec.daemonsets.tolerations in NVIDIA v1.8 (one list for every operand)",
        merge_into("daemonsets", "tolerations"),
    ),
    LegacyField(
        "*",
        ("priorityClassName",),
        STRING,
        "moved to spec.daemonsets.priorityClassName in NVIDIA v1.8 (one for every operand)",
        move_to("daemonsets", "priorityClassName"),
    ),
    LegacyField(
        "*",
        ("podSecurityContext",),
        OBJECT,
        "moved to spec.daemonsets.podSecurityContext in NVIDIA v1.8 (one for every operand)",
        move_to("daemonsets", "podSecurityContext"),
    ),
    LegacyField(
        "*",
        ("nodeSelector",),
        OBJECT,
        f"removed in NVIDIA v1.8: {_OFF_NODE}",
        drop(_OFF_NODE),
    ),
    LegacyField(
        "*",
        ("affinity",),
        OBJECT,
        f"removed in NVIDIA v1.8: {_OFF_NODE}",
        drop(_OFF_NODE),
    ),
    LegacyField(
        "*",
        ("securityContext",),
        OBJECT,
        "removed in NVIDIA v1.8: the operator sets each operand container's security context",
        drop("the operator sets each operand container's security context"),
    ),
)

BY_PATH: dict[tuple[str, ...], LegacyField] = {
    path: entry for legacy in LEGACY_FIELDS for path, entry in legacy.expand()
}


def hint(path: tuple[str | int, ...]) -> str | None:
    """What to tell a user who set the field at ``path`` (under spec), if NVIDIA moved it."""
    entry = BY_PATH.get(tuple(str(p) for p in path))
    return entry.hint if entry else None


# devicePlugin.args from NVIDIA 1.x: the plugin reads every flag from the environment variable
# of the same name, which is how the operator configures it now; the MIG strategy is
# spec.mig.strategy (the flag would override it silently).
PLUGIN_FLAG_TARGETS = {"--mig-strategy": ("mig", "strategy")}


def _plugin_args(spec: Spec) -> list[str]:
    plugin = spec.get("devicePlugin")
    args = plugin.get("args") if isinstance(plugin, dict) else None
    if not isinstance(args, list) or not args:
        return []
    notes, kept = [], []
    for arg in args:
        if not isinstance(arg, str) or not arg.startswith("--"):
            kept.append(arg)
            continue
        flag, _, value = arg.partition("=")
        value = value or "true"
        target = PLUGIN_FLAG_TARGETS.get(flag)
        if target is not None:
            notes.append(move_to(*target)(spec, f"spec.devicePlugin.args {arg}", value))
            continue
        name = flag.removeprefix("--").replace("-", "_").upper()
        notes.append(to_env("devicePlugin", name)(spec, f"spec.devicePlugin.args {arg}", value))
    if kept:
        spec["devicePlugin"]["args"] = kept
    else:
        del spec["devicePlugin"]["args"]
    return notes


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value == ""


def _remove(spec: Spec, path: tuple[str, ...]) -> None:
    parent = _get(spec, path[:-1])
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


@dataclass(frozen=True)
class Migration:
    document: dict[str, Any]
    notes: tuple[str, ...]  # one line per change, in the order made


def migrate_spec(spec: Mapping[str, Any]) -> tuple[Spec, list[str]]:
    """``spec`` rewritten for today's schema, and what was changed."""
    out: Spec = copy.deepcopy(dict(spec))
    notes: list[str] = []
    empty: list[str] = []
    for path, entry in BY_PATH.items():
        parent = _get(out, path[:-1])
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue
        value = parent[path[-1]]
        _remove(out, path)
        if _empty(value):
            empty.append(dotted(path))
        else:
            notes.append(entry.rewrite(out, dotted(path), copy.deepcopy(value)))
    if empty:
        notes.append(f"removed {len(empty)} empty legacy fields: {', '.join(empty)}")
    notes.extend(_plugin_args(out))
    return out, notes


def migrate(document: Mapping[str, Any]) -> Migration:
    """A ClusterPolicy document with every moved field at its place today; the rest untouched."""
    doc = copy.deepcopy(dict(document))
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        return Migration(doc, ())
    doc["spec"], notes = migrate_spec(spec)
    return Migration(doc, tuple(notes))
