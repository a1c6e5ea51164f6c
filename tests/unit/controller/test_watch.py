"""What is watched, what its stores keep, which objects are the operator's (the informer's
stores: tests/unit/test_informer.py)."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import API_VERSION, KIND
from gpu_operator.controller.plan import Observed
from gpu_operator.controller.watch import (
    INDEXES,
    WATCHED,
    index_value,
    owned_children,
    trim,
)
from gpu_operator.labels import APPLIED_HASH, MANAGED_BY, MANAGED_SELECTOR, OPERATOR_NAME
from gpu_operator.render import config_hash
from gpu_operator.views import NodeView
from tests.unit.controller.builders import gpu_node, node_object, pod, policy

OURS = {"apiVersion": API_VERSION, "kind": KIND, "name": "cluster-policy", "uid": "u"}


def child(
    name: str, *, managed: bool = True, owners: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    labels = {MANAGED_BY: OPERATOR_NAME} if managed else {MANAGED_BY: "Helm"}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels, "generation": 2,
                         "annotations": {APPLIED_HASH: "h"},
                         "ownerReferences": [OURS] if owners is None else owners}}  # fmt: skip


def test_only_objects_owned_by_a_clusterpolicy_and_labelled_ours_are_children() -> None:
    objects = {
        "ServiceAccount": [
            child("mine"),
            child("helms", managed=False),  # managed-by alone is not ours to delete
            child("orphan", owners=[]),
            child("other-owner", owners=[{**OURS, "kind": "Deployment", "apiVersion": "apps/v1"}]),
            {"metadata": {"name": "bare"}},
        ],
        "ClusterRole": [child("cluster-wide")],
    }
    assert owned_children(objects) == [
        Observed(("ServiceAccount", "ns", "mine"), "h", 2),
        Observed(("ClusterRole", "ns", "cluster-wide"), "h", 2),
    ]


def test_nodes_are_indexed_as_views_and_policies_whole() -> None:
    node = node_object(gpu_node())
    assert index_value("nodes", node) == NodeView.from_k8s(node)
    cp = policy(status={"state": "ready"})
    assert index_value("clusterpolicies", cp) == cp


def test_configmaps_keep_a_content_hash_and_revisions_their_number() -> None:
    cm = {"metadata": {"name": "c", "namespace": "ns", "annotations": {"big": "x" * 100}},
          "data": {"config.yaml": "a: 1"}}  # fmt: skip
    kept = trim("configmaps", cm)
    assert kept == {"metadata": {"name": "c", "namespace": "ns"}, "hash": config_hash(cm)}
    edited = {**cm, "data": {"config.yaml": "a: 2"}}
    assert trim("configmaps", edited)["hash"] != kept["hash"]
    rev = {"metadata": {"name": "r", "annotations": {APPLIED_HASH: "h"}}, "revision": 4,
           "data": {"spec": {"template": {"huge": True}}}}  # fmt: skip
    assert trim("controllerrevisions", rev) == {
        "metadata": {"name": "r", "annotations": {APPLIED_HASH: "h"}}, "revision": 4,
    }  # fmt: skip


def test_an_unscheduled_daemonset_pod_keeps_its_node_affinity() -> None:
    pinned = {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}
    terms = {"nodeSelectorTerms": [{"matchFields": [pinned]}]}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": terms}
    body = pod("p", node="")
    body["spec"] = {"affinity": {"nodeAffinity": affinity, "podAntiAffinity": {"x": 1}}}
    body["status"] = {"phase": "Pending", "initContainerStatuses": [{"restartCount": 3, "x": 1}]}
    kept = trim("pods", body)
    assert kept["spec"] == {"nodeName": None, "affinity": {"nodeAffinity": affinity}}
    assert kept["status"]["initContainerStatuses"] == [{"restartCount": 3}]
    assert kept["status"]["conditions"] == [] and kept["status"]["containerStatuses"] == []


def test_what_is_watched() -> None:
    kinds = {w.kind.kind: w for w in WATCHED}
    # the operator's own objects by label; policies, nodes and (user) ConfigMaps all
    assert kinds["DaemonSet"].selector == MANAGED_SELECTOR
    assert kinds["Node"].selector is None and kinds["ConfigMap"].selector is None
    assert not kinds["ControllerRevision"].wakes
    assert kinds["Node"].kind.collection() == "/api/v1/nodes"
    assert kinds[KIND].kind.collection() == "/apis/nvidia.com/v1/clusterpolicies"
    assert {w.index for w in WATCHED} == INDEXES
