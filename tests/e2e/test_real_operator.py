"""The operator itself in a container, on a cluster of two real GPU nodes and no other node,
installed both ways a user installs it. deploy/ applied unchanged (its image reference is the
project's image, built from the Dockerfile and loaded into the real nodes): its two replicas
run under deploy/'s securityContext (non-root, read-only root filesystem) with deploy/'s
ServiceAccount, exactly one holds the Lease and says so on /healthz, and it converges the
example ClusterPolicy with every operand in a real container. The Helm chart with its defaults:
`helm install`, then `helm uninstall`, whose pre-delete hook runs in a real container on a node
the operator tainted, leave the nodes as they were."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.stream import stream

from gpu_operator import testenv
from gpu_operator.kube import Kube
from tests.e2e.helm_support import NS, Helm
from tests.e2e.stack_support import phases, project_images
from tests.e2e.support import NotYet, policy_ready, wait_for
from tests.paths import REPO

# The first run builds the image and the stand-ins (minutes; a changed tree rebuilds them).
pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]

LEASE = "gpu-operator-leader"


@pytest.fixture(scope="module")
def cluster(
    real_nodes_runtime: Path, testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[testenv.Cluster]:
    """Two real nodes and no kwok node: every operator replica really runs."""
    archives = project_images(tmp_path_factory)
    state = testenv.default_state_dir() / f"oper-{uuid.uuid4().hex[:8]}"
    cluster = testenv.start(state, real_nodes=2, bin_dir=testenv_bin_dir)
    try:
        for archive in archives:
            cluster.load_image(archive)
        yield cluster
    finally:
        cluster.stop(remove_state=True)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _healthz(core: k8s.CoreV1Api, pod: str) -> dict[str, Any]:
    fetch = (
        "import urllib.request; print(urllib.request.urlopen("
        "'http://127.0.0.1:8080/healthz', timeout=10).read().decode())"
    )
    out: str = stream(
        core.connect_get_namespaced_pod_exec, pod, NS, command=["python3", "-c", fetch],
        stderr=True, stdin=False, stdout=True, tty=False,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_deploy_runs_two_replicas_one_leader_and_converges_the_example(
    cluster: testenv.Cluster,
) -> None:
    """...and the Helm chart's pre-delete hook command then leaves the real nodes as they were
    before the install: no CRD, custom resource or DaemonSet of the project, no label or taint;
    then deleting deploy/'s objects leaves no operator pod."""
    with cluster.api_client() as api:
        kube = Kube(api)
        core = k8s.CoreV1Api(api)
        before = {name: _marks(kube, name) for name in cluster.real_nodes}
        paths = sorted((REPO / "deploy").glob("*.yaml"))
        docs = [d for path in paths for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            if doc["kind"] == "Deployment":  # not a kind the operator handles
                k8s.AppsV1Api(api).create_namespaced_deployment(NS, doc)
            else:
                kube.apply(doc)

        def operators() -> list[dict[str, Any]]:
            return kube.list_objects(
                "Pod", NS, label_selector="app.kubernetes.io/name=gpu-operator"
            )

        def both_ready() -> list[dict[str, Any]] | NotYet:
            pods = operators()
            ready = [p for p in pods if _ready(p)]
            if len(ready) == 2:
                return ready
            return NotYet({"Ready": len(ready), "phases": phases(pods)})

        pods = wait_for("both operator replicas Ready", both_ready, timeout=300)
        assert {p["spec"]["nodeName"] for p in pods} <= set(cluster.real_nodes)
        names = sorted(p["metadata"]["name"] for p in pods)
        lease = wait_for(
            "the leader Lease held",
            lambda: ((kube.get("Lease", LEASE, NS) or {}).get("spec") or {}).get("holderIdentity"),
            timeout=120,
        )
        leader = [n for n in names if lease.startswith(f"{n}-")]
        assert len(leader) == 1, (lease, names)
        roles = {n: _healthz(core, n)["role"] for n in names}
        assert sorted(roles.values()) == ["leader", "standby"], roles
        assert roles[leader[0]] == "leader"

        kube.apply(yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text()))

        status = wait_for(
            "the example ClusterPolicy ready", lambda: policy_ready(kube), timeout=600
        )
        assert status["namespace"] == NS
        # Discovery, in its pod, labels the node: its own write, which `ready` does not wait for
        # (its pod is Ready once it runs).
        for name in cluster.real_nodes:
            wait_for(f"{name} labelled by discovery", lambda n=name: _gpu_count_8(kube, n))
        assert all(_marks(kube, n) != before[n] for n in cluster.real_nodes)

        # What `helm uninstall` runs first (its pre-delete hook), while the operator still runs.
        hook = ["uninstall", "--wait", "--delete-crd", "--namespace", NS, "--timeout", "5m"]
        done = subprocess.run(
            [sys.executable, "-m", "gpu_operator", *hook, "--kubeconfig", str(cluster.kubeconfig)],
            capture_output=True, text=True, timeout=360, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert_nothing_left(kube, cluster, before)

        # Then the rest of `kubectl delete -f deploy/`, the namespace aside (Helm installs there),
        # and the leader Lease the replicas made, which deleting the namespace would take.
        for doc in reversed(docs):
            if doc["kind"] != "Namespace":
                meta = doc["metadata"]
                kube.delete(doc["kind"], meta["name"], meta.get("namespace"))
        wait_for("the operator's pods gone", lambda: not operators() or NotYet(phases(operators())))
        kube.delete("Lease", LEASE, NS)


def test_helm_install_and_uninstall_leave_the_real_gpu_nodes_as_they_were(
    cluster: testenv.Cluster, testenv_bin_dir: Path, tmp_path: Path
) -> None:
    """Every node here is a GPU node the operator taints, so the uninstall hook's pod starts
    only because it tolerates that taint; the CRDs going is the hook's work (Helm never deletes
    a chart's CRDs)."""
    helm_ = Helm(testenv_bin_dir, tmp_path, cluster.kubeconfig)
    with cluster.api_client() as api:
        kube = Kube(api)
        before = {name: _marks(kube, name) for name in cluster.real_nodes}
        helm_.install(timeout="5m")
        wait_for("the chart's ClusterPolicy ready", lambda: policy_ready(kube), timeout=600)
        for name in cluster.real_nodes:
            wait_for(f"{name} labelled by discovery", lambda n=name: _gpu_count_8(kube, n))
            assert _marks(kube, name)["taints"], name
        helm_.uninstall(timeout="5m")
        assert_nothing_left(kube, cluster, before)


def assert_nothing_left(
    kube: Kube, cluster: testenv.Cluster, before: dict[str, dict[str, Any]]
) -> None:
    """No CRD or DaemonSet of the project, and each node's marks as they were before."""
    assert not [c for c in CRDS if kube.get("CustomResourceDefinition", c)]
    assert kube.list_objects("DaemonSet", NS) == []
    assert {n: _marks(kube, n) for n in cluster.real_nodes} == before


CRDS = ("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "gpuclusters.nvidia.com")


def _marks(kube: Kube, node: str) -> dict[str, Any]:
    """What anyone wrote on the node: its labels, annotations of nvidia.com and its taints."""
    obj = kube.get("Node", node) or {}
    meta = obj.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if "nvidia.com" in k}
    taints = (obj.get("spec") or {}).get("taints") or []
    return {"labels": meta.get("labels") or {}, "annotations": annotations, "taints": taints}


def _gpu_count_8(kube: Kube, node: str) -> bool | NotYet:
    labels = ((kube.get("Node", node) or {}).get("metadata") or {}).get("labels") or {}
    got = labels.get("nvidia.com/gpu.count")
    return got == "8" or NotYet({"nvidia.com/gpu.count": got})
