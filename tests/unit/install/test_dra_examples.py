"""examples/gpucluster.yaml, dra-pod.yaml, dra-time-slicing.yaml, dra-mps.yaml, dra-vfio.yaml
and computedomain-job.yaml: valid, and they do what they say."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.api import draconfig
from gpu_operator.api.computedomain import parse_computedomain
from gpu_operator.api.crd import computedomain_crd, gpucluster_crd
from gpu_operator.api.dragates import Gates, resolve
from gpu_operator.api.gpucluster import parse_gpucluster
from gpu_operator.render.facts import Facts
from gpu_operator.render.gpucluster import render_gpucluster
from tests.paths import REPO
from tests.schema import prune_nulls, strict, validate_kubernetes

EXAMPLES = REPO / "examples"
TIME_SLICING_ON = resolve({"TimeSlicingSettings": True})
MPS_ON = resolve({"MPSSupport": True})
PASSTHROUGH_ON = resolve({"PassthroughSupport": True})


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


def test_the_time_slicing_example_shares_one_claim_with_the_long_interval() -> None:
    docs = documents("dra-time-slicing.yaml")
    for doc in docs:
        assert validate_kubernetes(doc), doc["kind"]
    template, pod = docs
    devices = template["spec"]["spec"]["devices"]
    entries = draconfig.claim_configs(devices["config"], TIME_SLICING_ON, "spec.devices.config")
    config = draconfig.config_for(entries, "gpu", "gpu")
    assert isinstance(config, draconfig.GpuConfig) and config.sharing is not None
    assert config.sharing.time_slicing_config is not None
    assert config.sharing.time_slicing_config.interval == "Long"
    with pytest.raises(draconfig.ConfigError, match="TimeSlicingSettings"):  # the gate it needs
        draconfig.claim_configs(devices["config"], Gates.defaults(), "spec.devices.config")
    claims = [c["resources"]["claims"] for c in pod["spec"]["containers"]]
    assert claims == [[{"name": "gpu"}], [{"name": "gpu"}]]  # two containers, one claim


def test_the_mps_example_shares_one_claim_between_two_pods_with_its_limits() -> None:
    docs = documents("dra-mps.yaml")
    for doc in docs:
        assert validate_kubernetes(doc), doc["kind"]
    claim, *pods = docs
    entries = draconfig.claim_configs(claim["spec"]["devices"]["config"], MPS_ON, "config")
    config = draconfig.config_for(entries, "gpu", "gpu")
    assert isinstance(config, draconfig.GpuConfig) and config.sharing is not None
    mps = config.sharing.mps_config
    assert mps is not None and mps.default_active_thread_percentage == 50
    assert draconfig.pinned_limits(mps, ["GPU-0"]) == {"GPU-0": "10240M"}
    with pytest.raises(draconfig.ConfigError, match="MPSSupport"):  # the gate it needs
        draconfig.claim_configs(claim["spec"]["devices"]["config"], Gates.defaults(), "config")
    assert len(pods) == 2
    for pod in pods:  # one claim by name: both pods share the one daemon
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}
        ]


def test_the_vfio_example_asks_for_a_vfio_device_with_nvidias_config() -> None:
    docs = documents("dra-vfio.yaml")
    for doc in docs:
        assert validate_kubernetes(doc), doc["kind"]
    template, pod = docs
    devices = template["spec"]["spec"]["devices"]
    assert [r["exactly"]["deviceClassName"] for r in devices["requests"]] == ["vfio.gpu.nvidia.com"]
    entries = draconfig.claim_configs(devices["config"], PASSTHROUGH_ON, "spec.devices.config")
    config = draconfig.config_for(entries, "gpu", "vfio")
    assert isinstance(config, draconfig.VfioDeviceConfig) and config.iommu is not None
    assert config.iommu.backend_policy == "LegacyOnly"
    with pytest.raises(draconfig.ConfigError, match="PassthroughSupport"):  # the gate it needs
        draconfig.claim_configs(devices["config"], Gates.defaults(), "spec.devices.config")
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]


def test_the_computedomain_job_claims_its_domains_channel_one_pod_a_node() -> None:
    docs = {d["kind"]: d for d in documents("computedomain-job.yaml")}
    domain_doc = docs["ComputeDomain"]
    schema = strict(computedomain_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.validate(prune_nulls(domain_doc), schema)
    domain = parse_computedomain({**domain_doc, "metadata": {**domain_doc["metadata"],
                                                             "uid": "u-1"}})  # fmt: skip
    job = docs["StatefulSet"]
    assert validate_kubernetes(job)
    assert job["metadata"]["namespace"] == domain.namespace == docs["Namespace"]["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    (claim,) = pod["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == domain.template_name
    (spread,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"  # a node publishes one channel
    (together,) = pod["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert together["podAffinityTerm"]["topologyKey"] == "nvidia.com/gpu.clique"
