"""The ClusterPolicy, GPUCluster, NVIDIADriver and ComputeDomain CRDs, generated from the
pydantic models.

pydantic's JSON Schema is turned into a structural OpenAPI v3 schema: references inlined,
optional unions collapsed, ``int | str`` made ``x-kubernetes-int-or-string``, and only the
defaults NVIDIA's schema publishes kept (``x-crd-default``), so the apiserver fills in what
NVIDIA's would and nothing more. Fields NVIDIA moved or removed (``legacy.py``) are declared
too, so the API server keeps them for the operator to say where they went instead of pruning
what the user meant.
"""

from __future__ import annotations

import copy
from typing import Any

from gpu_operator.api import computedomain as cd
from gpu_operator.api import gpucluster as gc
from gpu_operator.api import nvidiadriver
from gpu_operator.api.legacy import BY_PATH
from gpu_operator.api.policy import GROUP, KIND, PLURAL, VERSION
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import ClusterPolicyStatus

_DROP = {"title", "default", "x-crd-default", "$defs"}


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        types = {b.get("type") for b in branches}
        if len(branches) == 1:
            return _structural({**branches[0], **rest}, defs)
        if types == {"integer", "string"}:
            return _structural({"x-kubernetes-int-or-string": True, **rest}, defs)
        raise ValueError(f"cannot express union {branches} in a structural schema")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key in ("items",) or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key == "additionalProperties" and value is False:
            continue  # unknown fields are pruned (or refused by kubectl's strict validation)
        elif key == "propertyNames":
            continue  # key patterns are checked by the models
        elif key == "patternProperties":
            # Structural schemas have no patternProperties: keep the value schema only.
            (value_schema,) = value.values()
            out["additionalProperties"] = _structural(value_schema, defs)
        elif key == "required":
            out[key] = sorted(value)
        else:
            out[key] = value
    if "x-crd-default" in node:
        out["default"] = node["x-crd-default"]
    if out.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" in out:
        del out["additionalProperties"]
    if "enum" in out and "type" not in out:
        out["type"] = _type_of(out["enum"][0])
    if "properties" in out or out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("type", "object")
    return out


def _type_of(value: Any) -> str:
    return {bool: "boolean", int: "integer", str: "string"}[type(value)]


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def with_legacy_fields(spec_schema: dict[str, Any]) -> dict[str, Any]:
    """``spec_schema`` plus every legacy field, described by where it lives now."""
    for path, entry in BY_PATH.items():
        node = spec_schema
        for part in path[:-1]:
            node = node["properties"][part]
        node["properties"][path[-1]] = {
            **copy.deepcopy(entry.schema),  # shared dicts would become YAML aliases
            "description": f"Legacy, refused by the operator: {entry.hint}.",
        }
    return spec_schema


def _crd(
    *,
    group: str,
    version: str,
    kind: str,
    plural: str,
    description: str,
    spec_schema: dict[str, Any],
    status_schema: dict[str, Any],
    short_names: list[str] | None = None,
    validations: list[dict[str, str]] | None = None,
    scope: str = "Cluster",
    state_path: str = ".status.state",
) -> dict[str, Any]:
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
    }
    if short_names:
        names["shortNames"] = short_names
    root: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    if validations:
        root["x-kubernetes-validations"] = validations
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "labels": {"app.kubernetes.io/part-of": "gpu-operator"},
        },
        "spec": {
            "group": group,
            "names": names,
            "scope": scope,
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Status", "type": "string", "jsonPath": state_path},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def clusterpolicy_crd() -> dict[str, Any]:
    spec_schema = with_legacy_fields(openapi_schema(ClusterPolicySpec))
    spec_schema["description"] = "Desired state of the GPU stack on every GPU node."
    status_schema = openapi_schema(ClusterPolicyStatus)
    status_schema["description"] = "Observed state, written by the operator."
    return _crd(
        group=GROUP,
        version=VERSION,
        kind=KIND,
        plural=PLURAL,
        description="ClusterPolicy configures the NVIDIA GPU stack "
        "the operator installs and runs on GPU nodes.",
        spec_schema=spec_schema,
        status_schema=status_schema,
    )


def gpucluster_crd() -> dict[str, Any]:
    """NVIDIA's GPUCluster (v1alpha1): the DRA stack; a singleton, as NVIDIA's CEL rule says."""
    spec_schema = openapi_schema(gc.GPUClusterSpec)
    spec_schema["description"] = "Desired state of the DRA-based GPU stack."
    status_schema = openapi_schema(gc.GPUClusterStatus)
    status_schema["description"] = "Observed state, written by the operator."
    return _crd(
        group=gc.GROUP,
        version=gc.VERSION,
        kind=gc.KIND,
        plural=gc.PLURAL,
        description="GPUCluster configures the NVIDIA DRA driver stack on GPU nodes.",
        spec_schema=spec_schema,
        status_schema=status_schema,
        short_names=["gc"],
        validations=[
            {
                "rule": f"self.metadata.name == '{gc.SINGLETON}'",
                "message": f"GPUCluster is a singleton, metadata.name must be '{gc.SINGLETON}'",
            }
        ],
    )


def nvidiadriver_crd() -> dict[str, Any]:
    """NVIDIA's nvidia.com/v1alpha1 NVIDIADriver, with its short names, columns and CEL rules."""
    spec_schema = openapi_schema(nvidiadriver.NVIDIADriverSpec)
    spec_schema["description"] = "One driver configuration for the GPU nodes it selects."
    spec_schema["required"] = ["default", "driverType", "image"]
    spec_schema["x-kubernetes-validations"] = [nvidiadriver.DEFAULT_WITHOUT_SELECTOR]
    status_schema = openapi_schema(nvidiadriver.NVIDIADriverStatus)
    status_schema["description"] = "Observed state, written by the operator."
    kind = nvidiadriver.KIND
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{nvidiadriver.PLURAL}.{nvidiadriver.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "gpu-operator"},
        },
        "spec": {
            "group": nvidiadriver.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": nvidiadriver.PLURAL,
                "singular": kind.lower(),
                "shortNames": ["nvd", "nvdriver", "nvdrivers"],
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": nvidiadriver.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Status", "type": "string", "jsonPath": ".status.state"},
                        {"name": "Default", "type": "boolean", "jsonPath": ".spec.default"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "NVIDIADriver installs one NVIDIA driver "
                            "configuration on the GPU nodes it selects.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                            "x-kubernetes-validations": [nvidiadriver.NAME_FITS_A_LABEL],
                        }
                    },
                }
            ],
        },
    }


def computedomain_crd() -> dict[str, Any]:
    """NVIDIA's namespaced ComputeDomain (v1beta1): its spec fixed at creation by NVIDIA's CEL
    rule, and its status with the ``conditions`` this project adds."""
    spec_schema = openapi_schema(cd.ComputeDomainSpec)
    spec_schema["description"] = "A multi-node NVLink (IMEX) domain and its workload channel."
    spec_schema["x-kubernetes-validations"] = [cd.IMMUTABLE_SPEC]
    status_schema = openapi_schema(cd.ComputeDomainStatus)
    status_schema["description"] = "Observed state, written by the operator."
    status_schema["required"] = ["status"]
    return _crd(
        group=cd.GROUP,
        version=cd.VERSION,
        kind=cd.KIND,
        plural=cd.PLURAL,
        description="ComputeDomain prepares a set of nodes for one multi-node NVLink workload.",
        spec_schema=spec_schema,
        status_schema=status_schema,
        scope="Namespaced",
        state_path=".status.status",
    )


def all_crds() -> list[dict[str, Any]]:
    """Every CRD the operator serves, in install order."""
    return [clusterpolicy_crd(), gpucluster_crd(), nvidiadriver_crd()]


def printable_crds() -> list[dict[str, Any]]:
    """Every CRD ``gpu-operator crd --kind`` prints: those served, and ComputeDomain, which the
    operator does not install yet (NVIDIA's DRA driver chart installs the same CRD)."""
    return [*all_crds(), computedomain_crd()]
