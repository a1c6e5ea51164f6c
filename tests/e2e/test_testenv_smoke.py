"""The local control plane behaves like a real cluster in the ways the operator relies on:
CRD validation, DaemonSet scheduling onto kwok GPU nodes, and ownerReference GC."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpu_operator import testenv
from tests.e2e.support import NotYet, wait_for

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "clusterpolicy.yaml"
GPU_SELECTOR = f"{testenv.GPU_PRESENT_LABEL}=true"


def _crd_version(crd: dict[str, Any]) -> str:
    return next(str(v["name"]) for v in crd["spec"]["versions"] if v.get("storage"))


@pytest.fixture(scope="module")
def clusterpolicy_crd(cluster: testenv.Cluster) -> dict[str, Any]:
    """Install crds/clusterpolicy.yaml (create or replace) and wait until it is Established."""
    doc: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    name = doc["metadata"]["name"]
    with cluster.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        try:
            ext.create_custom_resource_definition(
                body=client.V1CustomResourceDefinition.model_validate(doc)
            )
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(name)
            assert current.metadata is not None
            doc["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(
                name, body=client.V1CustomResourceDefinition.model_validate(doc)
            )

        def established() -> bool | NotYet:
            crd = ext.read_custom_resource_definition(name)
            conditions = (crd.status.conditions if crd.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                return True
            return NotYet([(c.type, c.status, c.reason) for c in conditions])

        wait_for(f"CRD {name} to become Established", established, timeout=30)
    return doc


def test_clusterpolicy_crd_installs_and_is_served(
    clusterpolicy_crd: dict[str, Any], custom_objects: client.CustomObjectsApi
) -> None:
    spec = clusterpolicy_crd["spec"]
    assert (spec["group"], spec["names"]["kind"], spec["scope"]) == (
        "nvidia.com",
        "ClusterPolicy",
        "Cluster",
    )
    listed = custom_objects.list_cluster_custom_object(
        "nvidia.com", _crd_version(clusterpolicy_crd), "clusterpolicies"
    )
    assert isinstance(listed, dict) and listed["kind"] == "ClusterPolicyList"


def _create_clusterpolicy(
    custom: client.CustomObjectsApi, version: str, strategy: str, dry_run: bool
) -> None:
    body = {
        "apiVersion": f"nvidia.com/{version}",
        "kind": "ClusterPolicy",
        "metadata": {"name": f"smoke-{uuid.uuid4().hex[:6]}"},
        "spec": {"mig": {"strategy": strategy}},
    }
    custom.create_cluster_custom_object(
        "nvidia.com", version, "clusterpolicies", body, dry_run="All" if dry_run else None
    )


def test_bogus_mig_strategy_is_rejected_naming_the_field(
    clusterpolicy_crd: dict[str, Any], custom_objects: client.CustomObjectsApi
) -> None:
    version = _crd_version(clusterpolicy_crd)
    with pytest.raises(client.ApiException) as info:
        _create_clusterpolicy(custom_objects, version, "bogus", dry_run=False)
    assert info.value.status == 422
    status = json.loads(info.value.body or "{}")
    assert "spec.mig.strategy" in status["message"]
    causes = status.get("details", {}).get("causes", [])
    assert any(c.get("field") == "spec.mig.strategy" for c in causes), causes


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_valid_mig_strategies_pass_schema_validation(
    clusterpolicy_crd: dict[str, Any], custom_objects: client.CustomObjectsApi, strategy: str
) -> None:
    """Control for the rejection test: the enum itself admits the documented values."""
    try:
        _create_clusterpolicy(custom_objects, _crd_version(clusterpolicy_crd), strategy, True)
    except client.ApiException as exc:
        assert "spec.mig.strategy" not in str(exc.body), exc.body


def _daemonset(name: str, owner: client.V1ConfigMap | None = None) -> client.V1DaemonSet:
    labels = {"app": name}
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None and owner.metadata is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": owner.metadata.name,
                "uid": owner.metadata.uid,
            }
        ]
    return client.V1DaemonSet.model_validate(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": metadata,
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {testenv.GPU_PRESENT_LABEL: "true"},
                        "containers": [
                            {
                                "name": "device-plugin",
                                "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                                # privileged also proves --allow-privileged=true
                                "securityContext": {"privileged": True},
                            }
                        ],
                    },
                },
            },
        }
    )


def _ready(pod: client.V1Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_gpu_daemonset_runs_one_ready_pod_per_gpu_node_only(kube: testenv.Clients) -> None:
    core, apps = kube.core, kube.apps
    gpu_nodes = {
        testenv.nodes.node_name(n) for n in core.list_node(label_selector=GPU_SELECTOR).items
    }
    all_nodes = {testenv.nodes.node_name(n) for n in core.list_node().items}
    cpu_nodes = all_nodes - gpu_nodes
    assert gpu_nodes and cpu_nodes, "the session cluster has both GPU and CPU nodes"

    apps.create_namespaced_daemon_set(kube.namespace, _daemonset("gpu-agent"))

    def rolled_out() -> client.V1DaemonSetStatus | NotYet:
        ds = apps.read_namespaced_daemon_set("gpu-agent", kube.namespace)
        st = ds.status
        ok = (
            st is not None
            and st.desired_number_scheduled == len(gpu_nodes)
            and st.number_ready == st.desired_number_scheduled
        )
        return st if ok and st is not None else NotYet(st)

    status = wait_for(
        f"DaemonSet numberReady == desired == {len(gpu_nodes)}", rolled_out, timeout=60
    )
    assert status.current_number_scheduled == len(gpu_nodes)
    assert status.number_misscheduled == 0

    pods = core.list_namespaced_pod(kube.namespace, label_selector="app=gpu-agent").items
    placed = sorted(p.spec.node_name for p in pods if p.spec and p.spec.node_name)
    assert placed == sorted(gpu_nodes), "exactly one pod on every GPU node, none elsewhere"
    assert not set(placed) & cpu_nodes
    for pod in pods:
        assert pod.status is not None
        assert pod.status.phase == "Running" and _ready(pod), pod.metadata
        assert pod.status.pod_ip and pod.status.host_ip, "kwok assigns pod and host IPs"


def test_owner_deletion_garbage_collects_daemonset_and_pods(kube: testenv.Clients) -> None:
    core, apps = kube.core, kube.apps
    ns = kube.namespace
    owner = core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    apps.create_namespaced_daemon_set(ns, _daemonset("owned", owner))
    wait_for(
        "the owned DaemonSet's pods",
        lambda: core.list_namespaced_pod(ns, label_selector="app=owned").items,
        timeout=60,
    )

    core.delete_namespaced_config_map("owner", ns)

    def daemonset_gone() -> bool | NotYet:
        try:
            ds = apps.read_namespaced_daemon_set("owned", ns)
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return NotYet(ds.metadata)  # its finalizers and owners: what holds it

    wait_for("kube-controller-manager GC to delete the DaemonSet", daemonset_gone, timeout=60)

    def pods_gone() -> bool | NotYet:
        left = core.list_namespaced_pod(ns, label_selector="app=owned").items
        return not left or NotYet([p.metadata.name for p in left if p.metadata])

    wait_for("GC to delete the DaemonSet's pods", pods_gone, timeout=60)


@pytest.mark.parametrize("os_id,os_version", [("ubuntu", "24.04"), ("rhel", "9.4")])
def test_gpu_nodes_of_other_os_releases(
    cluster: testenv.Cluster, os_id: str, os_version: str
) -> None:
    """Later tests need GPU nodes of several OS releases; kwok keeps their reported nodeInfo."""
    name = f"gpu-{os_id}-{os_version.replace('.', '-')}"
    cluster.create_gpu_node(name, os_id=os_id, os_version=os_version, extra_labels={"x": "y"})
    try:
        with cluster.api_client() as api:
            node = testenv.Clients.for_api(api).core.read_node(name)
        assert node.metadata is not None and node.status is not None
        labels = node.metadata.labels or {}
        assert labels["feature.node.kubernetes.io/system-os_release.ID"] == os_id
        assert labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"] == os_version
        assert labels[testenv.GPU_PRESENT_LABEL] == "true" and labels["x"] == "y"
        info = node.status.node_info
        assert info is not None
        assert info.container_runtime_version == "containerd://1.7.27"
        assert info.os_image == testenv.nodes.OS_RELEASES[(os_id, os_version)][0]
        assert info.kernel_version == labels["feature.node.kubernetes.io/kernel-version.full"]
        assert "nvidia.com/gpu" not in (node.status.capacity or {})
    finally:
        with cluster.api_client() as api:
            testenv.nodes.delete_node(api, name)


def test_audit_log_and_metrics_count_requests_per_client(cluster: testenv.Cluster) -> None:
    """Later tests and benchmarks count API calls per client from these two sources."""
    agent = f"smoke-audit/{uuid.uuid4().hex[:8]}"
    with cluster.api_client() as api:
        api.user_agent = agent
        core = client.CoreV1Api(api)
        for _ in range(3):
            core.list_namespace()
    events = [json.loads(line) for line in cluster.audit_log.read_text().splitlines()]
    mine = [e for e in events if e.get("userAgent") == agent]
    assert len(mine) == 3
    assert {e["user"]["username"] for e in mine} == {"testenv-admin"}
    assert {(e["verb"], e["objectRef"]["resource"]) for e in mine} == {("list", "namespaces")}
    assert {e["level"] for e in mine} == {"Metadata"}
    users = {e["user"]["username"] for e in events}
    assert {"system:kube-scheduler", "kwok-controller"} <= users
    assert any(u.startswith("system:serviceaccount:kube-system:") for u in users), (
        "kube-controller-manager uses per-controller service-account credentials"
    )
    metrics = cluster.apiserver_metrics()
    assert "apiserver_request_total{" in metrics and 'resource="namespaces"' in metrics
