"""Schema checks shared by the test suites: our CRD as strict JSON Schema, Kubernetes' own."""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
import kubernetes_validate
import referencing
from kubernetes_validate import utils

KUBERNETES_VERSION = "1.34"


def prune_nulls(value: Any) -> Any:
    """What the apiserver does to custom resources before validating them."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    return value


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Our schema as plain JSON Schema, unknown fields refused (kubectl's strict validation)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {k: strict(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = strict(value)
        elif key == "x-kubernetes-int-or-string":
            out["type"] = ["integer", "string"]
        elif not key.startswith("x-kubernetes"):
            out[key] = value
    if "properties" in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    if out.get("type") == "object" and "metadata" in out.get("properties", {}):
        out["properties"]["metadata"] = {"type": "object"}
    return out


def validate_kubernetes(obj: dict[str, Any]) -> bool:
    """Validate against Kubernetes' OpenAPI schema, unknown fields refused.

    False when kubernetes-validate has no schema for the kind (custom resources); a
    ``kubernetes_validate.ValidationError`` when the object is invalid. The same check as
    ``kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)``, with each kind's
    validator built once (the library reloads every definition on each call: ~40 ms an object).
    """
    validator = _validator(str(obj.get("kind")), str(obj.get("apiVersion")))
    if validator is None:
        return False
    try:
        validator.validate(obj)
    except jsonschema.ValidationError as exc:
        raise kubernetes_validate.ValidationError(exc, version=KUBERNETES_VERSION) from None
    return True


@functools.cache
def _definitions(schema_dir: str) -> referencing.Resource[Any]:
    return referencing.Resource.from_contents(
        utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", "")
    )


@functools.cache
def _validator(kind: str, api_version: str) -> jsonschema.protocols.Validator | None:
    version = [v for v in utils.all_versions() if utils.major_minor(v) <= KUBERNETES_VERSION][-1]
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_dir = f"v{version}-local-strict"
    try:
        schema = utils.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json", ""
        )
    except FileNotFoundError:
        return None
    registry: referencing.Registry[Any] = referencing.Resource.from_contents(schema) @ (
        _definitions(schema_dir) @ referencing.Registry()
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)
