"""What is watched, what its indexes keep, which objects are the operator's, kopf wiring."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from kubernetes import client as k8s

from gpu_operator.api import API_VERSION, KIND
from gpu_operator.controller.runtime.plan import Observed
from gpu_operator.controller.runtime.watch import (
    INDEXES,
    INFORMED,
    KOPF_WATCHED,
    WATCHED,
    Stores,
    build_registry,
    configure,
    connection_info,
    index_value,
    not_yet_stored,
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
    assert kept == {
        "metadata": {"name": "c", "namespace": "ns"},
        "hash": config_hash(cm),
        "keys": ["config.yaml"],  # driver config ConfigMaps mount one file per key
    }
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
    assert kinds["DaemonSet"].selector == kinds["ControllerRevision"].selector == MANAGED_SELECTOR
    assert kinds["Node"].selector is None and kinds["ConfigMap"].selector is None
    assert kinds["Node"].resource == ("v1", "nodes")
    assert kinds[KIND].resource == ("nvidia.com", "v1", "clusterpolicies")
    assert {w.index for w in WATCHED} == INDEXES


def test_the_rule_kopf_for_our_crds_the_informer_for_built_in_kinds() -> None:
    assert {w.kind.kind for w in KOPF_WATCHED} == {KIND, "NVIDIADriver"}
    assert {w.kind.kind for w in INFORMED} >= {"Node", "Pod", "DaemonSet", "ConfigMap"}
    assert set(KOPF_WATCHED) | set(INFORMED) == set(WATCHED)
    assert not set(KOPF_WATCHED) & set(INFORMED)


def test_kopf_events_fill_the_stores_and_report_the_change() -> None:
    got: list[tuple[str, tuple[str, str]]] = []
    stores: Stores = {}
    registry = build_registry(stores, lambda w, key: got.append((w.kind.kind, key)))
    handlers = {h.id: h for h in registry._watching.get_all_handlers()}
    assert set(handlers) == {f"store-{w.index}" for w in KOPF_WATCHED}
    assert list(registry._indexing.get_all_handlers()) == []  # no kopf index: one store

    cp = policy(status={"state": "ready"})
    on_event = handlers["store-clusterpolicies"].fn
    asyncio.run(on_event(event={"type": None}, body=cp, name="cluster-policy", namespace=None))
    assert stores["clusterpolicies"] == {("", "cluster-policy"): cp}
    asyncio.run(on_event(event={"type": "DELETED"}, body=cp, name="cluster-policy", namespace=None))
    assert stores["clusterpolicies"] == {}
    assert got == [(KIND, ("", "cluster-policy"))] * 2


def test_kopf_is_caught_up_once_it_holds_what_a_list_returns() -> None:
    assert not_yet_stored([("", "a"), ("", "b")], {("", "a"): 1}) == {("", "b")}
    assert not_yet_stored([], {}) == set()  # an empty listing: nothing to wait for
    assert not_yet_stored([("", "a")], {("", "a"): 1, ("", "gone"): 2}) == set()


def test_configure_quiets_kopf_and_selects_on_the_server() -> None:
    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.posting.enabled is False
    assert settings.scanning.disabled is True
    assert settings.watching.server_timeout < settings.watching.client_timeout
    assert dict(settings.watching.label_selectors.items()) == {}  # the CRDs: every object


@pytest.mark.parametrize(
    ("api_key", "token", "scheme"),
    [
        ({"authorization": "Bearer abc"}, "abc", "Bearer"),
        ({"authorization": "bearer abc"}, "abc", "Bearer"),
        ({"BearerToken": "xyz"}, "xyz", "Bearer"),
        ({}, None, None),  # client certificates instead
    ],
)
def test_connection_info_uses_the_clients_credentials(
    api_key: dict[str, str], token: str | None, scheme: str | None
) -> None:
    config = k8s.Configuration(host="https://api:6443", api_key=api_key)
    config.ssl_ca_cert = "/ca.crt"
    config.cert_file, config.key_file = "/c.crt", "/c.key"
    info = connection_info(config)
    assert (info.server, info.token, info.scheme) == ("https://api:6443", token, scheme)
    assert (info.ca_path, info.certificate_path, info.private_key_path) == (
        "/ca.crt",
        "/c.crt",
        "/c.key",
    )
    assert info.insecure is False


def test_what_passes_derive_from_a_kept_pod_is_derived_once() -> None:
    from gpu_operator.upgrade.fleet import POD_VIEW
    from gpu_operator.views import daemonset_owners, derived

    body = {
        "metadata": {
            "name": "p",
            "namespace": "gpu-operator",
            "ownerReferences": [{"kind": "DaemonSet", "name": "d", "uid": "u1"}],
        },
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running"},
    }
    kept = trim("pods", body)
    calls: list[Any] = []

    def counted(obj: Any) -> str:
        calls.append(obj)
        return "view"

    assert derived(kept, counted) == derived(kept, counted) == "view"
    assert len(calls) == 1  # remembered on the kept object
    assert derived(dict(kept), counted) == "view" and len(calls) == 2  # a plain dict: not
    assert daemonset_owners(kept) == ("u1",)
    assert derived(kept, POD_VIEW) is derived(kept, POD_VIEW)
    assert derived(kept, POD_VIEW).node == "n"
    assert kept == dict(kept)  # compared as what it keeps (the informer drops equal events)


def test_pods_of_one_daemonset_share_their_equal_parts_and_nothing_else() -> None:
    from gpu_operator.views import shared_tree

    def body(name: str, ready: bool, revision: str) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "namespace": "gpu-operator",
                "labels": {"app": "d", "controller-revision-hash": revision},
                "ownerReferences": [{"kind": "DaemonSet", "name": "d", "uid": "u1"}],
            },
            "spec": {"nodeName": name},
            "status": {"containerStatuses": [{"restartCount": 0, "ready": ready}]},
        }

    a, b = trim("pods", body("a", True, "r1")), trim("pods", body("b", True, "r1"))
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    assert a["metadata"]["ownerReferences"] is b["metadata"]["ownerReferences"]
    assert a["status"]["containerStatuses"] is b["status"]["containerStatuses"]
    assert a["spec"] is not b["spec"] and a["metadata"]["name"] != b["metadata"]["name"]
    c = trim("pods", body("c", False, "r2"))
    assert c["metadata"]["labels"] == {"app": "d", "controller-revision-hash": "r2"}
    assert c["status"]["containerStatuses"] == [{"restartCount": 0, "ready": False}]
    assert shared_tree([1]) is not shared_tree([True])  # equal in Python, not the same value


def test_what_passes_ask_of_a_node_view_is_answered_once_per_view() -> None:
    from dataclasses import replace

    from gpu_operator.node_labels import is_gpu_node
    from gpu_operator.views import derived

    view = NodeView("n", capacity={"nvidia.com/gpu": "8"})
    calls: list[NodeView] = []

    def counted(node: NodeView) -> bool:
        calls.append(node)
        return True

    assert derived(view, counted) and derived(view, counted) and len(calls) == 1
    assert is_gpu_node(view) and is_gpu_node(view)
    # A changed node is a new view, asked again; the memo is no part of equality.
    changed = replace(view, capacity={})
    assert not is_gpu_node(changed)
    assert view == NodeView("n", capacity={"nvidia.com/gpu": "8"})


def test_index_values_keep_only_what_decisions_read() -> None:
    pod = {
        "metadata": {
            "name": "p", "namespace": "n", "uid": "u", "labels": {"a": "b"},
            "annotations": {"big": "x" * 1000}, "ownerReferences": [{"uid": "ds"}],
            "managedFields": [{"manager": "kcm"}],
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": None,
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "PodScheduled", "status": "True",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
            "containerStatuses": [{"restartCount": 2, "ready": True, "image": "i"}],
        },
    }  # fmt: skip
    assert trim("pods", pod) == {
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"a": "b"},
                     "ownerReferences": [{"uid": "ds"}]},
        "spec": {"nodeName": "n1"},
        # Ready's transition time tells whether a validator re-validated a new driver; no
        # other condition is read.
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                   "containerStatuses": [{"restartCount": 2, "ready": True}],
                   "initContainerStatuses": []},
    }  # fmt: skip
    revision = {"metadata": {"name": "r"}, "revision": 3, "data": {"spec": {"template": {}}}}
    assert trim("controllerrevisions", revision) == {"metadata": {"name": "r"}, "revision": 3}
    a = trim("configmaps", {"metadata": {"name": "c"}, "data": {"k": "1"}})
    b = trim("configmaps", {"metadata": {"name": "c"}, "data": {"k": "2"}})
    assert "data" not in a and a["hash"] != b["hash"]
