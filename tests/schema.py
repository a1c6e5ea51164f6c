"""Schema checks shared by the test suites: our CRD as strict JSON Schema, Kubernetes' own."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

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
    ``kubernetes_validate.ValidationError`` when the object is invalid.
    """
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    return True
