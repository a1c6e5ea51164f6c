"""Bad ClusterPolicies against the real apiserver and operator: refused at `kubectl apply` by
the CRD schema, or reported in status and Events with the field named, never half-applied."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpu_operator import testenv
from gpu_operator.api import parse_document
from gpu_operator.kube import Kube
from gpu_operator.render import render_components
from gpu_operator.render.facts import Facts
from tests import prerequisites
from tests.e2e.support import (
    NotYet,
    policy_ready,
    policy_status,
    private_cluster,
    service_account_config,
    start_operator,
    wait_for,
)

NS = "gpu-operator"


@pytest.fixture(scope="module")
def cluster(testenv_bin_dir: Path) -> Iterator[testenv.Cluster]:
    with private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kube(cluster: testenv.Cluster) -> Iterator[Kube]:
    with cluster.api_client() as api:
        yield Kube(api)


@pytest.fixture(scope="module")
def operator(cluster: testenv.Cluster, kube: Kube) -> Iterator[None]:
    op = start_operator(service_account_config(cluster, NS, "gpu-operator"), NS)
    try:
        yield None
    finally:
        op.stop()


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def strict_dry_run(kube: Kube, obj: dict[str, Any]) -> Any:
    """What `kubectl apply --dry-run=server` does, with kubectl's default strict validation."""
    return kube.request(
        "POST",
        "/apis/nvidia.com/v1/clusterpolicies",
        query={"dryRun": "All", "fieldValidation": "Strict"},
        body=obj,
    )


@pytest.mark.parametrize("name", ["clusterpolicy-helm-default.yaml", "clusterpolicy-sample.yaml"])
def test_nvidia_documents_pass_our_crd_unchanged(operator: None, kube: Kube, name: str) -> None:
    doc = yaml.safe_load(prerequisites.nvidia(name).read_text())
    created = strict_dry_run(kube, doc)
    assert created["spec"]["driver"]["enabled"] is True


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"mig": {"strategy": "bogus"}}, "spec.mig.strategy"),
        (
            {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}},
            "spec.driver.upgradePolicy.maxParallelUpgrades",
        ),
        (
            {"driver": {"upgradePolicy": {"maxUnavailable": "25 percent"}}},
            "spec.driver.upgradePolicy.maxUnavailable",
        ),
        ({"toolkit": {"enabled": "maybe"}}, "spec.toolkit.enabled"),
        (
            {"driver": {"resources": {"limits": {"memory": "-5Gi"}}}},
            "spec.driver.resources.limits.memory",
        ),
        (
            {"driver": {"resources": {"requests": {"cpu": "512ki"}}}},
            "spec.driver.resources.requests.cpu",
        ),
        ({"devicePlugn": {"enabled": True}}, "spec.devicePlugn"),
    ],
)
def test_apiserver_refuses_with_the_field_named(
    operator: None, kube: Kube, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(ApiException) as info:
        strict_dry_run(kube, policy("bad", spec))
    assert info.value.status in (400, 422)
    assert field.removeprefix("spec.").split(".")[-1] in str(info.value.body)
    assert kube.get("ClusterPolicy", "bad") is None


def test_a_quantity_kubernetes_takes_is_taken_and_rendered(operator: None, kube: Kube) -> None:
    """``512Ki`` (a hand-written pattern once refused it) passes the CRD as Kubernetes writes
    it, and the operator's models take what the API server stored and render it as given."""
    spec = {"driver": {"resources": {"limits": {"memory": "512Ki"}, "requests": {"cpu": "0.5"}}}}
    stored = strict_dry_run(kube, policy("quantities", spec))
    resources = stored["spec"]["driver"]["resources"]
    assert resources == {"limits": {"memory": "512Ki"}, "requests": {"cpu": "0.5"}}, resources
    (driver,) = [
        obj
        for component in render_components(parse_document(stored), Facts())
        for obj in component.objects
        if obj["kind"] == "DaemonSet"
        and obj["metadata"]["name"].startswith("nvidia-driver-daemonset")
    ]
    container = driver["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == "512Ki", container["resources"]


def test_invalid_policy_is_reported_and_nothing_applied(operator: None, kube: Kube) -> None:
    # The CRD cannot express label-key syntax; the models can. Nothing may be applied from it.
    kube.create(policy("invalid", {"daemonsets": {"labels": {"bad key!": "x"}}}))

    def reported() -> dict[str, Any] | NotYet:
        status = policy_status(kube, "invalid")
        return status if status.get("state") == "notReady" else NotYet(status)

    def event_recorded() -> bool | NotYet:
        events = kube.list_objects("Event", "default", field_selector="involvedObject.name=invalid")
        if any(
            e["reason"] == "ReconcileFailed" and "spec.daemonsets.labels" in e["message"]
            for e in events
        ):
            return True
        return NotYet([(e["reason"], e["message"]) for e in events])

    status = wait_for("invalid policy reported", reported)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    error = next(c for c in status["conditions"] if c["type"] == "Error")
    assert ready["reason"] == error["reason"] == "ReconcileFailed"
    assert error["status"] == "True"
    assert "spec.daemonsets.labels['bad key!']" in error["message"]
    # The Event is recorded after the status in the same pass: wait for it.
    wait_for("a ReconcileFailed Event naming the field", event_recorded)
    assert kube.list_objects("DaemonSet", NS) == []
    assert (
        kube.list_objects("ServiceAccount", NS, label_selector="app.kubernetes.io/managed-by") == []
    )

    # Fixing it applies the stack.
    kube.merge_patch("ClusterPolicy", "invalid", {"spec": {"daemonsets": {"labels": None}}})
    wait_for(
        "fixed policy ready",
        lambda: policy_ready(kube, "invalid"),
    )
    assert kube.list_objects("DaemonSet", NS)
