"""The Helm chart's values: NVIDIA's chart keys, what each one does here, and their schema.

A values section named like a ClusterPolicy section (``driver``, ``toolkit``, ``devicePlugin``,
...) *is* that section: its schema is the CRD's, so every field the CRD has is a values key and
nothing else is. The other keys are the chart's own (the operator Deployment, the hooks,
ConfigMaps made from values) or keys NVIDIA's chart has that mean nothing here, accepted and
ignored for a stated reason. ``values.schema.json`` is generated from this module and refuses
any other key, so a misspelt or unsupported key fails ``helm install`` with its name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpu_operator import __version__
from gpu_operator.api.crd import openapi_schema
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.install import manifests
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.render.images import split_reference

# spec.operator holds only these; every other operator.* key configures the Deployment.
OPERATOR_POLICY_KEYS = ("defaultRuntime", "runtimeClass", "initContainer", "use_ocp_driver_toolkit")

# NVIDIA's chart names these two differently from the ClusterPolicy (values -> spec).
MOVES: tuple[tuple[str, str], ...] = (
    ("driver.nvidiaDriverCRD.enabled", "driver.useNvidiaDriverCRD"),
    ("driver.upgradePolicy.gpuPodDeletion", "driver.upgradePolicy.podDeletion"),
)

# ConfigMaps the chart makes from ``<section>.config.data`` when ``create`` is true, and the
# ConfigMap key a string ``data`` goes under (a map of named configs is used as is).
CONFIG_MAPS: dict[str, str | None] = {
    "devicePlugin": None,
    "dcgmExporter": "dcgm-metrics.csv",
    "migManager": None,
}

# Parts of ClusterPolicy sections that are the chart's: left out of the ClusterPolicy.
CHART_PARTS = (
    "driver.nvidiaDriverCRD",
    *(f"{section}.config.{key}" for section in CONFIG_MAPS for key in ("create", "data")),
)

# Values of these are strings in the ClusterPolicy; Helm reads `version: 550` as a number.
STRING_KEYS = ("version",)
STRING_PATHS = ("daemonsets.rollingUpdate.maxUnavailable",)

# NVIDIA's operator image cannot be this operator: with NVIDIA's values unchanged the chart
# runs the project's image instead (NOTES.txt says so).
NVIDIA_OPERATOR_IMAGES = ("nvcr.io/nvidia/gpu-operator",)
_DEFAULT = split_reference(DEFAULT_OPERATOR_IMAGE)
DEFAULT_REPOSITORY = _DEFAULT.repository or ""
DEFAULT_IMAGE = _DEFAULT.image or ""
APP_VERSION = f"v{__version__}"

ANY: dict[str, Any] = {}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
STRING: dict[str, Any] = {"type": "string"}
MAP: dict[str, Any] = {"type": "object"}
LIST: dict[str, Any] = {"type": "array"}
STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}


@dataclass(frozen=True)
class ValuesKey:
    """A key that is not a ClusterPolicy field: the chart's own, or NVIDIA's and ignored."""

    path: str
    schema: dict[str, Any]
    effect: str  # what it does here (or why it is ignored), for the README table
    ignored: bool = False


DEPLOYMENT = "the operator Deployment"
CHART_KEYS: tuple[ValuesKey, ...] = (
    ValuesKey(
        "operator.repository",
        STRING,
        f"{DEPLOYMENT} and hook image (NVIDIA's operator image is replaced by this project's)",
    ),
    ValuesKey("operator.image", STRING, f"{DEPLOYMENT} and hook image"),
    ValuesKey(
        "operator.version", {"type": ["string", "number"]}, f"image tag (default {APP_VERSION})"
    ),
    ValuesKey("operator.imagePullPolicy", STRING, f"{DEPLOYMENT} and hooks"),
    ValuesKey(
        "operator.imagePullSecrets",
        {"type": "array", "items": STRING},
        f"{DEPLOYMENT} and hooks (secret names)",
    ),
    ValuesKey("operator.priorityClassName", STRING, DEPLOYMENT),
    ValuesKey(
        "operator.tolerations", LIST, f"{DEPLOYMENT} and hooks (after their own, of the GPU taint)"
    ),
    ValuesKey("operator.nodeSelector", STRING_MAP, f"{DEPLOYMENT} and hooks (added)"),
    ValuesKey(
        "operator.affinity", MAP, f"{DEPLOYMENT} (each kind of affinity given replaces the chart's)"
    ),
    ValuesKey("operator.annotations", STRING_MAP, f"{DEPLOYMENT}'s pod annotations"),
    ValuesKey("operator.resources", MAP, f"{DEPLOYMENT}'s container resources"),
    ValuesKey(
        "operator.logging.level",
        {"anyOf": [{"enum": ["debug", "info", "error"]}, {"type": "integer", "minimum": 1}]},
        "LOG_LEVEL of the operator (debug, info, error; a number means debug)",
    ),
    ValuesKey(
        "operator.logging.develMode",
        BOOLEAN,
        "LOG_FORMAT of the operator: true, text lines; false, JSON objects (as NVIDIA's "
        "production logging); unset, text",
    ),
    ValuesKey(
        "operator.upgradeCRD",
        BOOLEAN,
        "pre-install/pre-upgrade hook applies the chart's CRD before anything else; false also "
        "stops the operator applying it at start-up (--no-install-crd)",
    ),
    ValuesKey(
        "operator.cleanupCRD",
        BOOLEAN,
        "the pre-delete hook also deletes the three CRDs once every resource of theirs is gone",
    ),
    ValuesKey(
        "extraObjects",
        {"type": "array", "items": MAP},
        "each object added to the release as given (objects, not template strings)",
    ),
    *(
        ValuesKey(
            f"{section}.config.create",
            BOOLEAN,
            f"the chart makes ConfigMap `{section}.config.name` from `{section}.config.data`",
        )
        for section in CONFIG_MAPS
    ),
    *(
        ValuesKey(
            f"{section}.config.data",
            STRING if key else STRING_MAP,
            f"the ConfigMap's data ({f'under key {key}' if key else 'one key per config'})",
        )
        for section, key in CONFIG_MAPS.items()
    ),
)

_NO_NFD = (
    "this chart deploys no Node Feature Discovery: install it yourself, or label GPU nodes "
    "nvidia.com/gpu.present=true"
)
IGNORED_KEYS: tuple[ValuesKey, ...] = (
    ValuesKey("nfd.enabled", BOOLEAN, _NO_NFD, ignored=True),
    ValuesKey("nfd.nodefeaturerules", BOOLEAN, _NO_NFD, ignored=True),
    ValuesKey("node-feature-discovery", ANY, f"NVIDIA's NFD subchart values; {_NO_NFD}", True),
    ValuesKey(
        "platform.openshift",
        BOOLEAN,
        "changes nothing: the operator does not set up OpenShift's security context "
        "constraints yet",
        ignored=True,
    ),
    ValuesKey(
        "operator.logging.timeEncoding",
        STRING,
        "the operator's log times are fixed: local time in text lines, RFC 3339 UTC in JSON",
        True,
    ),
    ValuesKey(
        "driver.nvidiaDriverCRD.deployDefaultCR",
        BOOLEAN,
        "the chart creates no NVIDIADriver resource",
        ignored=True,
    ),
    ValuesKey(
        "driver.nvidiaDriverCRD.driverType",
        STRING,
        "the chart creates no NVIDIADriver resource",
        ignored=True,
    ),
    ValuesKey(
        "driver.nvidiaDriverCRD.nodeSelector",
        MAP,
        "the chart creates no NVIDIADriver resource",
        ignored=True,
    ),
)

VALUES_KEYS = CHART_KEYS + IGNORED_KEYS


@cache
def _spec_schema() -> dict[str, Any]:
    """The CRD's spec schema from the models (legacy fields are no values keys)."""
    return openapi_schema(ClusterPolicySpec)


def policy_sections() -> list[str]:
    """The ClusterPolicy sections whose values keys are their fields, by wire name."""
    names = [info.alias or name for name, info in ClusterPolicySpec.model_fields.items()]
    return [name for name in names if name != "operator"]


def _values_schema_of(node: dict[str, Any], key: str = "") -> dict[str, Any]:
    """A CRD schema node as JSON Schema for values: unknown keys refused, ``""`` = unset.

    NVIDIA's values write ``""``, ``[]`` and ``{}`` for "not set", and Helm reads
    ``version: 550`` as a number; both are accepted and dealt with by the chart.
    """
    out: dict[str, Any] = {}
    for name, value in node.items():
        if name == "properties":
            out[name] = {k: _values_schema_of(v, k) for k, v in value.items()}
        elif name == "items" or (name == "additionalProperties" and isinstance(value, dict)):
            out[name] = _values_schema_of(value)
        elif name == "x-kubernetes-int-or-string":
            out["type"] = ["integer", "string"]
        elif name == "default" or name.startswith("x-kubernetes"):
            continue
        else:
            out[name] = value
    preserved = node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not preserved:
        out.setdefault("additionalProperties", False)
    if key in STRING_KEYS:
        out["type"] = ["string", "number"]
    if "enum" in out and out.get("type") == "string" and "" not in out["enum"]:
        out["enum"] = [*out["enum"], ""]
    if "pattern" in out:
        out["pattern"] = f"^$|{out['pattern']}"
    return out


def _put(schema: dict[str, Any], path: str, leaf: dict[str, Any]) -> None:
    """Declare ``path`` in ``schema`` (an object schema), creating strict objects on the way."""
    node = schema
    parts = path.split(".")
    for part in parts[:-1]:
        props = node.setdefault("properties", {})
        node = props.setdefault(part, {"type": "object", "additionalProperties": False})
    node.setdefault("properties", {})[parts[-1]] = copy.deepcopy(leaf)


def _remove(schema: dict[str, Any], path: str) -> dict[str, Any]:
    parts = path.split(".")
    node = schema
    for part in parts[:-1]:
        node = node["properties"][part]
    removed: dict[str, Any] = node["properties"].pop(parts[-1])
    return removed


def values_schema() -> dict[str, Any]:
    """values.schema.json: the CRD's sections, the chart's keys and the ignored ones; no other."""
    spec = copy.deepcopy(_spec_schema())
    schema: dict[str, Any] = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "gpu-operator chart values (NVIDIA's gpu-operator chart keys)",
        "type": "object",
        "additionalProperties": False,
        "properties": {},
    }
    for section in policy_sections():
        schema["properties"][section] = _values_schema_of(spec["properties"][section], section)
    operator = _values_schema_of(spec["properties"]["operator"])
    operator["properties"] = {k: operator["properties"][k] for k in OPERATOR_POLICY_KEYS}
    schema["properties"]["operator"] = operator
    for source, target in MOVES:
        _put(schema, source, _remove(schema, target))
    for key in VALUES_KEYS:
        _put(schema, key.path, key.schema)
    for path in STRING_PATHS:
        node = schema
        for part in path.split("."):
            node = node["properties"][part]
        node["type"] = ["string", "integer"]
    return schema


def default_values() -> dict[str, Any]:
    """The chart's own defaults. ClusterPolicy fields left out take the operator's defaults;
    the few set here are where NVIDIA's chart behaves differently from an empty policy."""
    resources = manifests.deployment_spec()["template"]["spec"]["containers"][0]["resources"]
    return {
        "operator": {
            "repository": DEFAULT_REPOSITORY,
            "image": DEFAULT_IMAGE,
            "version": "",
            "imagePullPolicy": "IfNotPresent",
            "imagePullSecrets": [],
            "priorityClassName": "",
            "tolerations": [],
            "nodeSelector": {},
            "affinity": {},
            "annotations": {},
            "resources": resources,
            "logging": {"level": "info"},
            "upgradeCRD": True,
            "cleanupCRD": True,
        },
        "driver": {"enabled": True, "upgradePolicy": {"autoUpgrade": True}},
        "toolkit": {"enabled": True},
        "devicePlugin": {
            "enabled": True,
            "config": {"create": False, "name": "", "default": "", "data": {}},
        },
        "dcgm": {"enabled": False},
        "dcgmExporter": {"enabled": True, "config": {"create": False, "name": "", "data": ""}},
        "gfd": {"enabled": True},
        "migManager": {
            "enabled": True,
            "config": {"create": False, "name": "", "default": "all-disabled", "data": {}},
        },
        "nodeStatusExporter": {"enabled": False},
        "mig": {"strategy": "single"},
        "extraObjects": [],
    }


def handled(path: str) -> str | None:
    """How the chart handles the values key ``path`` (a leaf, dotted), as the README's table
    says: "ClusterPolicy", "accepted, not implemented", "chart" or "ignored"; None when the
    chart refuses it. ``values.schema.json`` is what Helm checks; this reads the same data."""
    for key in VALUES_KEYS:
        if path == key.path or path.startswith(key.path + "."):
            return "ignored" if key.ignored else "chart"
    if any(path == source or path.startswith(source + ".") for source, _ in MOVES):
        return "ClusterPolicy"
    if any(path == target or path.startswith(target + ".") for _, target in MOVES):
        return None  # only under NVIDIA's name
    section, _, rest = path.partition(".")
    if section == "operator":
        return "ClusterPolicy" if rest.split(".")[0] in OPERATOR_POLICY_KEYS else None
    if section not in policy_sections():
        return None
    node = _spec_schema()["properties"][section]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "accepted, not implemented"
    for part in rest.split(".") if rest else []:
        if part not in (node.get("properties") or {}):
            return None if "properties" in node else "ClusterPolicy"
        node = node["properties"][part]
    return "ClusterPolicy"


@dataclass(frozen=True)
class Row:
    keys: str
    handled: str  # "ClusterPolicy", "chart", "ignored", "accepted, not implemented"
    effect: str


def key_table() -> list[Row]:
    """Every values key the chart accepts, grouped as the README shows it."""
    rows = []
    spec = _spec_schema()
    for section in policy_sections():
        node = spec["properties"][section]
        if node.get("x-kubernetes-preserve-unknown-fields"):
            rows.append(
                Row(
                    f"`{section}.*`",
                    "accepted, not implemented",
                    f"`spec.{section}` as given; the status says so when it is enabled",
                )
            )
        else:
            rows.append(Row(f"`{section}.*`", "ClusterPolicy", f"`spec.{section}`, every field"))
    keys = ", ".join(f"`operator.{k}`" for k in OPERATOR_POLICY_KEYS)
    rows.append(Row(keys, "ClusterPolicy", "`spec.operator`"))
    for source, target in MOVES:
        suffix = ".*" if source.endswith("Deletion") else ""
        rows.append(Row(f"`{source}{suffix}`", "ClusterPolicy", f"`spec.{target}{suffix}`"))
    for key in VALUES_KEYS:
        suffix = ".*" if key.schema is ANY else ""
        rows.append(Row(f"`{key.path}{suffix}`", "ignored" if key.ignored else "chart", key.effect))
    return rows


def key_table_markdown() -> str:
    lines = ["| values key | handled | what it does here |", "| --- | --- | --- |"]
    lines += [f"| {row.keys} | {row.handled} | {row.effect} |" for row in key_table()]
    return "\n".join(lines) + "\n"
