"""examples/gpucluster.yaml and examples/dra-pod.yaml: valid, and they do what they say."""

from __future__ import annotations

from typing import Any

import jsonschema
import yaml

from gpu_operator.api.crd import gpucluster_crd
from gpu_operator.api.gpucluster import parse_gpucluster
from gpu_operator.render.facts import Facts
from gpu_operator.render.gpucluster import render_gpucluster
from tests.paths import REPO
from tests.schema import prune_nulls, strict, validate_kubernetes

EXAMPLES = REPO / "examples"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def test_the_gpucluster_example_loads_and_renders_the_dra_stack() -> None:
    (doc,) = documents("gpucluster.yaml")
    schema = strict(gpucluster_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.validate(prune_nulls(doc), schema)
    spec = parse_gpucluster(doc)
    assert not spec.compute_domains_enabled
    names = {(o["kind"], o["metadata"]["name"]) for o in render_gpucluster(spec, Facts())}
    assert ("DaemonSet", "nvidia-dra-driver-kubelet-plugin") in names
    assert ("DeviceClass", "mig.nvidia.com") in names


def test_the_pod_example_asks_through_claims_for_the_published_classes() -> None:
    docs = documents("dra-pod.yaml")
    for doc in docs:
        assert validate_kubernetes(doc), doc["kind"]
    templates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ResourceClaimTemplate"}
    classes = {
        r["exactly"]["deviceClassName"]
        for t in templates.values()
        for r in t["spec"]["spec"]["devices"]["requests"]
    }
    assert classes == {"gpu.nvidia.com", "mig.nvidia.com"}
    for pod in (d for d in docs if d["kind"] == "Pod"):
        (claim,) = pod["spec"]["resourceClaims"]
        assert claim["resourceClaimTemplateName"] in templates
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["claims"] == [{"name": claim["name"]}]
