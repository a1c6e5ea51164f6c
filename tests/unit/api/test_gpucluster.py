"""NVIDIA's GPUCluster: its sample loads unchanged, bad documents name the field, the CRD
generated from the models is committed, structural and covers NVIDIA's schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.api.crd import gpucluster_crd
from gpu_operator.api.gpucluster import (
    SINGLETON,
    example_document,
    parse_gpucluster,
)
from gpu_operator.api.policy import PolicyError
from gpu_operator.cli import dump_yaml
from tests.paths import REPO
from tests.prerequisites import nvidia as reference
from tests.schema import prune_nulls, strict

CRD_FILE = REPO / "crds" / "gpucluster.yaml"


def ours() -> dict[str, Any]:
    schema: dict[str, Any] = gpucluster_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")


def test_nvidias_sample_is_accepted_unchanged() -> None:
    doc = yaml.safe_load(reference("gpucluster-sample.yaml").read_text())
    spec = parse_gpucluster(doc)
    assert spec.dra_driver.image == "dra-driver-nvidia-gpu"
    assert spec.compute_domains_enabled
    assert spec.daemonsets.tolerations and spec.daemonsets.tolerations[0].key == "nvidia.com/gpu"
    jsonschema.validate(prune_nulls(doc), strict(ours()))


def test_our_example_is_accepted() -> None:
    spec = parse_gpucluster(example_document())
    assert not spec.compute_domains_enabled
    jsonschema.validate(example_document(), strict(ours()))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["spec"].pop("draDriver"), "spec.draDriver"),
        (lambda d: d["spec"]["draDriver"].update(imagePullPolicy="Sometimes"), "imagePullPolicy"),
        (
            lambda d: d["spec"]["draDriver"]["gpus"]["kubeletPlugin"].update(
                healthcheck={"port": 70000}
            ),
            "spec.draDriver.gpus.kubeletPlugin.healthcheck.port",
        ),
        (
            lambda d: d["spec"]["draDriver"].update(featureGates={"MPSSupport": "maybe"}),
            "MPSSupport",
        ),
        (
            lambda d: d["spec"]["draDriver"].update(featureGates={"MPSSupport": True, "Mps": 1}),
            "spec.draDriver.featureGates: unknown feature gate(s) Mps",
        ),
        (
            lambda d: d["spec"]["draDriver"].update(
                featureGates={"DynamicMIG": True, "MPSSupport": True}
            ),
            "DynamicMIG and MPSSupport cannot both be on",
        ),
        (lambda d: d["spec"]["dcgmExporter"].update(enabeld=True), "spec.dcgmExporter.enabeld"),
        (lambda d: d["metadata"].update(name="my-cluster"), "metadata.name"),
    ],
)
def test_an_invalid_gpucluster_names_the_field(change: Any, field: str) -> None:
    doc = example_document()
    doc["spec"]["draDriver"]["gpus"] = {"kubeletPlugin": {}}
    change(doc)
    with pytest.raises(PolicyError) as err:
        parse_gpucluster(doc)
    assert field in str(err.value)


def test_an_unknown_field_points_at_the_gpucluster_schema() -> None:
    doc = example_document()
    doc["spec"]["draDriver"]["gpuz"] = {}
    with pytest.raises(PolicyError, match="GPUCluster schema"):
        parse_gpucluster(doc)


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == dump_yaml([gpucluster_crd()]), (
        "crds/gpucluster.yaml is stale: run `make manifests`"
    )


def test_crd_shape_is_nvidias() -> None:
    crd = gpucluster_crd()
    nvidia = yaml.safe_load(reference("gpuclusters-crd.yaml").read_text())
    assert crd["metadata"]["name"] == nvidia["metadata"]["name"] == "gpuclusters.nvidia.com"
    assert crd["spec"]["names"] == nvidia["spec"]["names"]
    assert crd["spec"]["scope"] == nvidia["spec"]["scope"]
    (version,) = crd["spec"]["versions"]
    (theirs,) = nvidia["spec"]["versions"]
    assert version["name"] == theirs["name"] == "v1alpha1"
    assert version["additionalPrinterColumns"] == theirs["additionalPrinterColumns"]
    assert version["subresources"] == theirs["subresources"]
    rules = version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    assert rules[0]["rule"] == f"self.metadata.name == '{SINGLETON}'"
    assert ours()["properties"]["spec"]["required"] == ["draDriver"]


def test_every_nvidia_spec_field_exists_in_ours_with_its_type_and_default() -> None:
    nvidia = yaml.safe_load(reference("gpuclusters-crd.yaml").read_text())
    theirs = dict(walk(nvidia["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
    mine = dict(walk(ours()))
    missing = [p for p in theirs if p not in mine]
    assert not missing
    for path, node in theirs.items():
        if "default" in node:
            assert mine[path].get("default") == node["default"], path
        if node.get("type") and mine[path].get("type"):
            assert mine[path]["type"] == node["type"], path


def test_status_states_include_nvidias() -> None:
    nvidia = yaml.safe_load(reference("gpuclusters-crd.yaml").read_text())
    theirs = nvidia["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    states = set(ours()["properties"]["status"]["properties"]["state"]["enum"])
    assert set(theirs["properties"]["state"]["enum"]) <= states
    assert "ignored" in states  # a second GPUCluster, or one the operator does not act on
