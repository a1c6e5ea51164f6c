"""Golden manifests and schema validation for every render case.

``UPDATE_GOLDEN=1 pytest tests/unit/render/test_render_golden.py`` rewrites the golden files;
review the diff like any other code change.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import kubernetes_validate
import pytest

from gpu_operator.cli import dump_yaml
from gpu_operator.render import render
from tests.unit.render.render_cases import CASES, GOLDEN_DIR, case

KUBERNETES_VERSION = "1.34"
# Kinds outside the core API that kubernetes-validate has no schema for.
NO_SCHEMA_KINDS = {"ServiceMonitor"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    policy, facts = case(name)
    rendered = dump_yaml(render(policy, facts))
    golden = GOLDEN_DIR / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert golden.exists(), f"no golden file; run UPDATE_GOLDEN=1 pytest to create {golden}"
    expected = golden.read_text()
    if rendered != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), rendered.splitlines(), "golden", "rendered", lineterm=""
        )
        pytest.fail(f"{name} differs from {golden}:\n" + "\n".join(list(diff)[:80]))


def _validate(obj: dict[str, Any]) -> str | None:
    """Validate strictly (no unknown fields); the kind when there is no schema for it."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return str(obj["kind"])
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}")
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_object_validates(name: str) -> None:
    policy, facts = case(name)
    objects = render(policy, facts)
    unvalidated = {kind for obj in objects if (kind := _validate(obj)) is not None}
    assert objects
    assert unvalidated <= NO_SCHEMA_KINDS


def test_kinds_without_a_schema_are_rendered() -> None:
    """Guards NO_SCHEMA_KINDS: each is really rendered (else it would hide nothing)."""
    policy, facts = case("everything-on")
    assert {obj["kind"] for obj in render(policy, facts)} >= NO_SCHEMA_KINDS


def test_validation_is_strict() -> None:
    """Guards the test above: an unknown field must fail, not pass silently."""
    policy, facts = case("minimal")
    daemonset = next(o for o in render(policy, facts) if o["kind"] == "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"][0]["bogusField"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)
