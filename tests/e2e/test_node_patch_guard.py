"""The operator's node patches against a real kube-apiserver: a label is set where the plan's read
found it absent only if it is still absent, and a patch refused for that is told apart from one
the API server finds invalid."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_operator.controller.runtime.execute import unapplied
from gpu_operator.kube import Kube
from gpu_operator.labels import MIG_CONFIG
from gpu_operator.node_labels import NodePolicy, Owned, plan_node
from gpu_operator.views import NodeView

NFD = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "nvidia.com/mig.capable": "true",
}
POLICY = NodePolicy(deploy=("driver", "mig-manager"))


@pytest.fixture
def node(api_client: client.ApiClient) -> Iterator[str]:
    name = f"guard-{uuid.uuid4().hex[:6]}"
    Kube(api_client).create(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": NFD}}
    )
    yield name
    Kube(api_client).delete("Node", name)


def test_a_layout_chosen_after_the_operators_read_is_kept(
    api_client: client.ApiClient, node: str
) -> None:
    kube = Kube(api_client)
    stale = NodeView.from_k8s(kube.get("Node", node))  # the operator's read: no layout yet
    kube.merge_patch("Node", node, {"metadata": {"labels": {MIG_CONFIG: "all-1g.5gb"}}})
    planned = plan_node(stale, POLICY)
    assert planned is not None and planned.labels[MIG_CONFIG] == "all-disabled"
    with pytest.raises(ApiException) as refused:
        kube.json_patch("Node", node, planned.to_json_patch())
    assert refused.value.status == 422 and unapplied(refused.value)
    assert kube.get("Node", node)["metadata"]["labels"][MIG_CONFIG] == "all-1g.5gb"
    # The next plan, from a read that shows the layout, labels the node and leaves it.
    fresh = plan_node(NodeView.from_k8s(kube.get("Node", node)), POLICY)
    assert fresh is not None
    kube.json_patch("Node", node, fresh.to_json_patch())
    meta = kube.get("Node", node)["metadata"]
    assert meta["labels"][MIG_CONFIG] == "all-1g.5gb"
    assert meta["labels"]["nvidia.com/gpu.deploy.mig-manager"] == "true"
    assert MIG_CONFIG not in Owned.parse(meta["annotations"]).labels


def test_an_invalid_value_is_not_taken_for_a_change(
    api_client: client.ApiClient, node: str
) -> None:
    with pytest.raises(ApiException) as refused:
        Kube(api_client).json_patch(
            "Node", node, [{"op": "add", "path": "/metadata/labels/bad", "value": "a b"}]
        )
    assert refused.value.status == 422 and not unapplied(refused.value)
