"""What the operator asks of each Kubernetes release it claims, on the default (newest) one and
the oldest (conftest's OLDEST_RELEASE_MODULES): NVIDIA's Helm-default ClusterPolicy and a
GPUCluster with ComputeDomains converge through requests that draw no API warning (no
deprecated API or field), and where the release has no DRA (``resource.k8s.io/v1``) the
GPUCluster is told so by a condition, with nothing applied.

One scenario per release, in the module's fixture, with deploy/'s least-privilege RBAC; each
test judges one side of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator import kube as kube_module
from gpu_operator import testenv
from gpu_operator.api.gpucluster import example_document
from gpu_operator.controller.gpucluster.decide import TOO_OLD
from gpu_operator.install import manifests
from gpu_operator.kube import Kube
from gpu_operator.testenv import releases
from tests import prerequisites
from tests.e2e.support import (
    OPERATOR_USER,
    NotYet,
    OperatorProcess,
    api_served,
    audit_requests,
    policy_api_served,
    policy_ready,
    private_cluster,
    service_account_config,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"
PLUGIN = "nvidia-dra-driver-kubelet-plugin"
WARNED = "the API server warns about"  # how the client logs a Warning header


@dataclass
class Scenario:
    cluster: testenv.Cluster
    kube: Kube
    log: Path
    started: datetime
    dra: bool  # the release serves resource.k8s.io/v1


def gpucluster_status(kube: Kube) -> dict[str, Any]:
    status: dict[str, Any] = (kube.get("GPUCluster", "gpu-cluster") or {}).get("status") or {}
    return status


@pytest.fixture(scope="module")
def scenario(testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    policy = yaml.safe_load(prerequisites.nvidia("clusterpolicy-helm-default.yaml").read_text())
    cluster_doc = example_document()
    cluster_doc["spec"]["draDriver"]["computeDomains"] = {"enabled": True}
    dra = releases.serves_dra(releases.release_of(testenv_bin_dir))
    tmp = tmp_path_factory.mktemp("releases")
    with private_cluster(testenv_bin_dir, gpu_nodes=2) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        kube.apply(manifests.namespace_object(NS))
        for obj in manifests.rbac_objects(NS):  # deploy/'s least privilege, as users install it
            kube.apply(obj)
        identity = service_account_config(cluster, NS, "gpu-operator", cluster_role="")
        started = datetime.now(UTC)
        operator = OperatorProcess(
            token_kubeconfig(cluster, identity, tmp / "kc"), tmp / "op.log", NS
        )
        operator.start()
        try:
            wait_for("ClusterPolicy API served", lambda: policy_api_served(kube))
            wait_for("GPUCluster API served", lambda: api_served(kube, "GPUCluster"))
            kube.create(policy)
            kube.create(cluster_doc)
            wait_for("ClusterPolicy ready", lambda: policy_ready(kube), timeout=120)

            def gpucluster_judged() -> bool | NotYet:
                status = gpucluster_status(kube)
                if dra:  # its stack applied: the plugin's DaemonSet is there
                    return bool(kube.get("DaemonSet", PLUGIN, NS)) or NotYet(status)
                return bool(status.get("conditions")) or NotYet(status)

            wait_for("the GPUCluster acted on", gpucluster_judged, timeout=120)
            yield Scenario(cluster, kube, tmp / "op.log", started, dra)
        finally:
            operator.kill()


def test_the_operators_requests_draw_no_api_warning(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Warning header came back to the operator (its client logs each) and the API server
    marked none of its requests deprecated; a request that does draw one is logged so."""
    warned = [line for line in scenario.log.read_text().splitlines() if WARNED in line]
    assert warned == [], "\n".join(warned)
    deprecated = [
        f"{e['verb']} {e.get('requestURI')}"
        for e in audit_requests(scenario.cluster, OPERATOR_USER, scenario.started)
        if (e.get("annotations") or {}).get("k8s.io/deprecated") == "true"
    ]
    assert deprecated == [], deprecated

    # The same client, asked for something deprecated on every release claimed: it says so
    # (once per process: this worker may have been told already, on another release).
    monkeypatch.setattr(kube_module, "_warned", set())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "seccomp-annotated",
            "namespace": "default",
            "annotations": {"seccomp.security.alpha.kubernetes.io/pod": "runtime/default"},
        },
        "spec": {"containers": [{"name": "c", "image": "registry.example/c:1"}]},
    }
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("gpu_operator.kube").addHandler(handler)
    try:
        scenario.kube.apply(pod)
    finally:
        logging.getLogger("gpu_operator.kube").removeHandler(handler)
    said = [r.getMessage() for r in records]
    assert any(WARNED in m and "seccomp" in m for m in said), said


def test_a_gpucluster_gets_dra_where_the_release_serves_it_and_a_condition_where_not(
    scenario: Scenario,
) -> None:
    kube = scenario.kube
    ready = {c["type"]: c for c in gpucluster_status(kube).get("conditions") or []}["Ready"]
    if scenario.dra:
        assert ready["reason"] != TOO_OLD
        assert kube.get("DaemonSet", PLUGIN, NS) is not None
        return
    assert (ready["status"], ready["reason"]) == ("False", TOO_OLD)
    release = releases.release_of(scenario.cluster.bin_dir)
    assert f"Kubernetes {release} does not serve resource.k8s.io/v1" in ready["message"]
    assert kube.get("DaemonSet", PLUGIN, NS) is None
    assert not kube.get("GPUCluster", "gpu-cluster")["metadata"].get("finalizers")
