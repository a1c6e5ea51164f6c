"""The GPUCluster loop against the real control plane, with deploy/'s least-privilege RBAC:
NVIDIA's sample accepted unchanged, an invalid one refused naming the field, the DRA stack
rendered and reported, and a ClusterPolicy's device plugin on the same nodes reported on both
objects and the nodes instead of advertising GPUs twice."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpu_operator import testenv
from gpu_operator.api.gpucluster import parse_gpucluster_spec
from gpu_operator.install import manifests
from gpu_operator.kube import Kube
from gpu_operator.labels import DRA_TEARDOWN_FINALIZER
from tests.e2e.support import (
    NotYet,
    api_served,
    node_events,
    policy_status,
    private_cluster,
    service_account_config,
    start_operator,
    wait_for,
)
from tests.paths import REPO
from tests.prerequisites import REFERENCE

NS = "gpu-operator"
NODES = ["gpu-node-0", "gpu-node-1"]
PLUGIN = "nvidia-dra-driver-kubelet-plugin"
CONTROLLER = "nvidia-dra-driver-controller"
DOMAIN_CRD = "computedomains.resource.nvidia.com"
DOMAIN_CLASSES = ("compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com")
DRA_LABEL = "nvidia.com/gpu.deploy.dra-driver"


def gpucluster_doc() -> dict[str, Any]:
    """NVIDIA's sample when it sits beside the checkout, else ours (the unit tests check both)."""
    sample = REFERENCE / "nvidia" / "gpucluster-sample.yaml"
    path = sample if sample.exists() else REPO / "examples" / "gpucluster.yaml"
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    status = (obj or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


@pytest.fixture(scope="module")
def env(testenv_bin_dir: Path) -> Iterator[tuple[testenv.Cluster, Kube]]:
    with private_cluster(testenv_bin_dir, gpu_nodes=2) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        kube.apply(manifests.namespace_object(NS))
        for obj in manifests.rbac_objects(NS):
            kube.apply(obj)
        operator = start_operator(service_account_config(cluster, NS, "gpu-operator", ""), NS)
        try:
            wait_for(
                "the GPUCluster API served",
                lambda: api_served(kube, "GPUCluster"),
                timeout=60,
            )
            yield cluster, kube
        finally:
            operator.stop()


def _plugin_status(kube: Kube) -> dict[str, Any]:
    return ((kube.get("DaemonSet", PLUGIN, NS) or {}).get("status")) or {}


def test_an_invalid_gpucluster_is_refused_naming_the_field(
    env: tuple[testenv.Cluster, Kube],
) -> None:
    _, kube = env
    bad = copy.deepcopy(gpucluster_doc())
    bad["spec"]["daemonsets"]["updateStrategy"] = "Sometimes"
    with pytest.raises(ApiException) as err:
        kube.create(bad)
    assert err.value.status == 422
    assert "spec.daemonsets.updateStrategy" in str(err.value.body)
    named = copy.deepcopy(gpucluster_doc())
    named["metadata"]["name"] = "my-cluster"
    with pytest.raises(ApiException) as err:
        kube.create(named)
    assert "singleton" in str(err.value.body)


def test_the_sample_renders_the_dra_stack_and_then_a_device_plugin_conflict_is_reported(
    env: tuple[testenv.Cluster, Kube],
) -> None:
    _, kube = env
    created = kube.create(gpucluster_doc())  # accepted unchanged
    assert created["metadata"]["name"] == "gpu-cluster"

    def plugin_everywhere() -> dict[str, Any] | NotYet:
        ds = kube.get("DaemonSet", PLUGIN, NS)
        status = (ds or {}).get("status") or {}
        return ds if status.get("desiredNumberScheduled") == len(NODES) else NotYet(status)

    ds = wait_for("the DRA plugin DaemonSet on both GPU nodes", plugin_everywhere, timeout=90)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    assert ds["metadata"]["ownerReferences"][0]["kind"] == "GPUCluster"
    for name in ("gpu.nvidia.com", "mig.nvidia.com"):
        assert kube.get("DeviceClass", name)
    assert not [
        d for d in kube.list_objects("DaemonSet", NS) if "device-plugin" in d["metadata"]["name"]
    ]

    # NVIDIA's sample enables computeDomains: the controller, its RBAC (granted with the
    # operator's least privilege) and NVIDIA's CRD come with it; the project's example, used
    # where the sample is absent (a user's clone), leaves them off.
    domains = parse_gpucluster_spec(created["spec"]).compute_domains_enabled

    def reported() -> dict[str, Any] | NotYet:
        obj = kube.get("GPUCluster", "gpu-cluster")
        ready = conditions(obj).get("Ready", {}).get("status") == "True"
        controller = kube.get("Deployment", CONTROLLER, NS)
        crd = kube.get("CustomResourceDefinition", DOMAIN_CRD)
        if obj is not None and ready and (controller is not None) == (crd is not None) == domains:
            return obj
        return NotYet({"status": (obj or {}).get("status"), "plugin": _plugin_status(kube),
                       "controller": controller is not None, "crd": crd is not None})  # fmt: skip

    obj = wait_for(
        f"GPUCluster ready, the ComputeDomain controller {'there' if domains else 'absent'}",
        reported,
        timeout=90,
    )
    assert obj["status"]["state"] == "ready"
    assert obj["status"]["namespace"] == NS
    assert "NotImplemented" not in conditions(obj)
    if domains:
        for name in DOMAIN_CLASSES:
            assert kube.get("DeviceClass", name)
        crd = kube.get("CustomResourceDefinition", DOMAIN_CRD) or {}
        assert "ownerReferences" not in crd["metadata"]  # users' domains outlive the GPUCluster

    # A ClusterPolicy with the device plugin (its default) on the same nodes.
    policy = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
    kube.create(policy)
    name = policy["metadata"]["name"]

    def conflict() -> dict[str, Any] | NotYet:
        found = conditions(kube.get("GPUCluster", "gpu-cluster"))
        cond = found.get("DevicePluginConflict")
        return cond if cond and all(n in cond["message"] for n in NODES) else NotYet(found)

    cond = wait_for("the conflict in the GPUCluster status", conflict, timeout=90)
    assert cond["status"] == "True"

    def policy_conflict() -> bool | NotYet:
        found = policy_status(kube, name).get("conditions") or []
        return "DRAConflict" in {c["type"] for c in found} or NotYet(found)

    wait_for("the conflict in the ClusterPolicy status", policy_conflict, timeout=90)

    def conflict_event(node: str) -> list[dict[str, Any]] | NotYet:
        found = node_events(kube, node)
        return [e for e in found if e["reason"] == "DevicePluginAndDRA"] or NotYet(
            [e["reason"] for e in found]
        )

    for node in NODES:
        wait_for(
            f"a DevicePluginAndDRA Event on {node}",
            lambda n=node: conflict_event(n),
            timeout=60,
        )
        labels = (kube.get("Node", node) or {})["metadata"]["labels"]
        assert labels[DRA_LABEL] == "false"  # no DRA where the device plugin runs
    wait_for(
        "the DRA plugin off the device plugin's nodes",
        lambda: (got := _plugin_status(kube)).get("desiredNumberScheduled") == 0 or NotYet(got),
        timeout=60,
    )
    kube.delete("ClusterPolicy", name)


def test_a_deleted_gpucluster_waits_for_the_compute_domains_first(
    env: tuple[testenv.Cluster, Kube],
) -> None:
    """A ComputeDomain's finalizer is its controller's, and the controller goes with the
    GPUCluster: a deleted GPUCluster waits, naming the domains left, and goes once they have."""
    _, kube = env
    doc = copy.deepcopy(gpucluster_doc())
    doc["spec"]["draDriver"]["computeDomains"] = {"enabled": True}
    if kube.get("GPUCluster", "gpu-cluster") is None:
        kube.create(doc)
    else:  # the other test's, left for the module
        kube.merge_patch("GPUCluster", "gpu-cluster", {"spec": {"draDriver": {
            "computeDomains": {"enabled": True}}}})  # fmt: skip
    wait_for("the ComputeDomain API served", lambda: api_served(kube, "ComputeDomain"), timeout=90)

    def held() -> bool | NotYet:  # deleted before the operator's first pass, it would just go
        found = (kube.get("GPUCluster", "gpu-cluster") or {}).get("metadata") or {}
        return DRA_TEARDOWN_FINALIZER in (found.get("finalizers") or ()) or NotYet(found)

    wait_for("the GPUCluster under the operator's finalizer", held, timeout=90)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "imex"}})
    kube.create({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        # kwok runs no controller process: this finalizer stands for its
        "metadata": {"name": "job", "namespace": "imex", "finalizers": ["e2e.test/hold"]},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "job-channel"}}},
    })  # fmt: skip
    kube.delete("GPUCluster", "gpu-cluster")

    def waiting() -> str | NotYet:
        ready = conditions(kube.get("GPUCluster", "gpu-cluster")).get("Ready") or {}
        message = str(ready.get("message") or "")
        return message if "ComputeDomains imex/job" in message else NotYet(ready)

    wait_for("the GPUCluster waiting for the domain", waiting, timeout=90)
    assert kube.get("DaemonSet", PLUGIN, NS) is not None  # the plugin stays meanwhile
    kube.delete("ComputeDomain", "job", "imex")
    kube.merge_patch("ComputeDomain", "job", {"metadata": {"finalizers": None}}, namespace="imex")
    wait_for(
        "the GPUCluster gone once the domain is",
        lambda: (left := kube.get("GPUCluster", "gpu-cluster")) is None or NotYet(left["status"]),
        timeout=120,
    )
