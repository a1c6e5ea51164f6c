"""The generated CRD: in sync with the models, structural, and a superset of NVIDIA's schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import clusterpolicy_crd
from gpu_operator.cli import dump_yaml
from tests import prerequisites
from tests.paths import CRD_FILE
from tests.schema import prune_nulls as _prune_nulls
from tests.schema import strict as _strict

# Where our schema is deliberately stricter than NVIDIA's: a value that would only fail later,
# when the rendered DaemonSet is applied, is refused when the policy is applied instead.
STRICTER = {
    "imagePullPolicy": "enum Always|IfNotPresent|Never",
    "fsGroupChangePolicy": "enum",
    "supplementalGroupsPolicy": "enum",
    "type": "enum (seccomp/appArmor type, service type)",
    "defaultRuntime": "enum containerd|crio|docker",
    "operator": "enum Exists|Equal",
    "effect": "enum of taint effects",
    "internalTrafficPolicy": "enum Cluster|Local",
    "maxUnavailable": "pattern count-or-percent",
}


def ours() -> dict[str, Any]:
    schema: dict[str, Any] = clusterpolicy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def nvidia() -> dict[str, Any]:
    crd = yaml.safe_load(prerequisites.nvidia("clusterpolicies-crd.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == dump_yaml([clusterpolicy_crd()]), (
        "crds/clusterpolicy.yaml is stale: run `gpu-operator crd > crds/clusterpolicy.yaml`"
    )


def test_crd_shape() -> None:
    crd = clusterpolicy_crd()
    assert crd["metadata"]["name"] == "clusterpolicies.nvidia.com"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == "ClusterPolicy"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"Status": ".status.state", "Age": ".metadata.creationTimestamp"}


def test_schema_is_structural() -> None:
    """Every node has a type (or is int-or-string/preserved); no constructs k8s refuses."""
    for path, node in walk(ours()):
        assert "$ref" not in node and "anyOf" not in node and "patternProperties" not in node, path
        assert "title" not in node, path
        if not node.get("x-kubernetes-int-or-string"):
            assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), path


def test_enums_and_defaults_where_nvidia_has_them() -> None:
    schema = dict(walk(ours()))
    assert schema[".spec.mig.strategy"]["enum"] == ["none", "single", "mixed"]
    assert schema[".spec.daemonsets.updateStrategy"]["default"] == "RollingUpdate"
    assert schema[".spec.driver.upgradePolicy.maxUnavailable"]["default"] == "25%"
    assert schema[".spec.driver.upgradePolicy.maxParallelUpgrades"]["minimum"] == 0
    assert schema[".status.state"]["enum"] == ["ready", "notReady", "ignored"]
    preserved = [p for p, n in schema.items() if n.get("x-kubernetes-preserve-unknown-fields")]
    for path, node in walk(nvidia()):
        if any(path.startswith(p + ".") for p in preserved):
            continue  # sections we preserve but do not interpret
        if "default" in node:
            assert schema[path].get("default") == node["default"], path
        if "enum" in node:
            assert set(node["enum"]) <= set(schema[path]["enum"]), path


def test_every_nvidia_field_is_in_our_schema() -> None:
    """The compatibility oracle: each field NVIDIA's schema has, ours has with the same type."""
    mine = dict(walk(ours()))
    preserved = [p for p, n in mine.items() if n.get("x-kubernetes-preserve-unknown-fields")]
    missing, mismatched = [], []
    for path, node in walk(nvidia()):
        if not path.startswith(".spec"):
            continue
        if any(path.startswith(p + ".") for p in preserved):
            continue
        if path not in mine:
            missing.append(path)
            continue
        mine_node = mine[path]
        theirs_type, my_type = _type(node), _type(mine_node)
        if theirs_type != my_type:
            mismatched.append(f"{path}: NVIDIA {theirs_type}, ours {my_type}")
        extra = {"enum", "pattern"} & (mine_node.keys() - node.keys())
        if extra and path.rsplit(".", 1)[-1] not in STRICTER:
            mismatched.append(f"{path}: ours adds {sorted(extra)} without a reason in STRICTER")
    assert not missing, missing
    assert not mismatched, mismatched


def _type(node: dict[str, Any]) -> str | None:
    return "int-or-string" if node.get("x-kubernetes-int-or-string") else node.get("type")


def test_nvidia_requires_nothing_we_lack() -> None:
    theirs = dict(walk(nvidia()))
    mine = dict(walk(ours()))
    for path, node in theirs.items():
        if path.startswith(".spec") and path in mine:
            # Anything NVIDIA requires is a field we know; we require no more than NVIDIA.
            assert set(mine[path].get("required", [])) <= set(node.get("required", [])), path


@pytest.mark.parametrize("name", ["clusterpolicy-helm-default.yaml", "clusterpolicy-sample.yaml"])
def test_nvidia_documents_validate_against_our_schema(name: str) -> None:
    doc = yaml.safe_load(prerequisites.nvidia(name).read_text())
    doc = _prune_nulls(doc)  # the apiserver prunes nulls before validating
    jsonschema.validate(doc, _strict(ours()))


def test_our_schema_rejects_bad_enum_and_unknown_fields() -> None:
    strict = _strict(ours())
    with pytest.raises(jsonschema.ValidationError, match="'bogus' is not one of"):
        jsonschema.validate({"spec": {"mig": {"strategy": "bogus"}}}, strict)
    with pytest.raises(jsonschema.ValidationError, match="devicePlugn"):
        jsonschema.validate({"spec": {"devicePlugn": {}}}, strict)


# A resource quantity and whether Kubernetes takes it for a request or limit.
QUANTITIES = {
    "512Ki": True, "4Gi": True, "500m": True, "2": True, 2: True, "1e3": True, "+1": True,
    ".5": True, "1.5": True, "0": True,
    "-5Gi": False, -1: False, "512ki": False, "1.2.3": False, "1K": False, " 1": False,
    "NaN": False, "5 Gi": False, "": False,
}  # fmt: skip


@pytest.mark.parametrize(("value", "valid"), QUANTITIES.items(), ids=[repr(q) for q in QUANTITIES])
def test_the_crd_and_the_models_agree_on_resource_quantities(value: int | str, valid: bool) -> None:
    """The API server refuses at `kubectl apply` what the operator would refuse (naming the
    field), and takes what NVIDIA's CRD takes but a negative amount."""
    spec = {"driver": {"resources": {"limits": {"memory": value}}}}
    try:
        jsonschema.validate({"spec": spec}, _strict(ours()))
        schema_takes = True
    except jsonschema.ValidationError as exc:
        assert list(exc.absolute_path)[-1] == "memory"
        schema_takes = False
    try:
        parse_spec(spec)
        model_takes = True
    except PolicyError:
        model_takes = False
    assert (schema_takes, model_takes) == (valid, valid)
