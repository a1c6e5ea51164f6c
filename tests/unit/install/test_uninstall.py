"""`gpu-operator uninstall`: each step decided from one look (pure), and the loop that leaves
nothing of the project behind, on the in-memory API server."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Mapping
from typing import Any

import pytest

from gpu_operator.install.uninstall import UninstallError, uninstall
from gpu_operator.install.uninstall_plan import (
    CRDS,
    Delete,
    Observed,
    Patch,
    plan_uninstall,
    waiting_on,
)
from gpu_operator.labels import (
    DRA_TEARDOWN_FINALIZER,
    DRIVER_POOL,
    GPU_PRESENT,
    HEALTH_STATE,
    HEALTH_TAINTED,
    HEALTH_WAS_CORDONED,
    NODE_CLEANUP_FINALIZER,
    OWNED_ANNOTATION,
    UNHEALTHY_TAINT,
    WORKLOAD_MOVE,
)
from gpu_operator.node_labels import Move, MovePhase
from gpu_operator.views import NodeView
from tests.fakes.kube import FakeKube
from tests.unit.controller.builders import gpu_node, node_object

NS = "gpu-operator"
OURS = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
USERS = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
OWNED = json.dumps({"labels": [GPU_PRESENT], "taints": ["nvidia.com/gpu:NoSchedule"]})


def resource(
    kind: str, name: str, *finalizers: str, deleting: bool = False
) -> tuple[str, dict[str, Any]]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "7", "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    api = "nvidia.com/v1" if kind == "ClusterPolicy" else "nvidia.com/v1alpha1"
    return kind, {"apiVersion": api, "kind": kind, "metadata": meta}


def labelled_node(name: str = "gpu-1", **extra: str) -> NodeView:
    """A GPU node as the operator left it: its label and taint (recorded as its own), a pool
    label, and a user's label and taint."""
    return gpu_node(
        name,
        labels={GPU_PRESENT: "true", DRIVER_POOL: "h100", "team": "ml", **extra},
        annotations={OWNED_ANNOTATION: OWNED},
        taints=[OURS, USERS],
    )


def crd(name: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"kind": "CustomResourceDefinition", "metadata": meta}


def owned_by(
    kind: str, owner: str, owner_kind: str = "ClusterPolicy"
) -> tuple[str, dict[str, Any]]:
    ref = {"apiVersion": "nvidia.com/v1", "kind": owner_kind, "name": owner, "uid": "u"}
    return kind, {"metadata": {"name": f"{owner}-{kind.lower()}", "ownerReferences": [ref]}}


def test_every_resource_of_the_three_kinds_is_deleted_first() -> None:
    found = (
        resource("ClusterPolicy", "cluster-policy", NODE_CLEANUP_FINALIZER),
        resource("NVIDIADriver", "h100"),
        resource("GPUCluster", "gpu-cluster", DRA_TEARDOWN_FINALIZER),
    )
    step = plan_uninstall(Observed(found, nodes=(labelled_node(),)), delete_crds=True)
    assert step.actions == (
        Delete("ClusterPolicy", "cluster-policy"),
        Delete("NVIDIADriver", "h100"),
        Delete("GPUCluster", "gpu-cluster"),
    )
    assert step.waiting.startswith(
        f"ClusterPolicy cluster-policy ({NODE_CLEANUP_FINALIZER}); NVIDIADriver h100 (no "
        "finalizer); GPUCluster gpu-cluster"
    )


def test_while_the_operator_runs_its_finalizers_are_left_to_it() -> None:
    held = (resource("ClusterPolicy", "p", NODE_CLEANUP_FINALIZER, deleting=True),)
    step = plan_uninstall(Observed(held, nodes=(labelled_node(),)), delete_crds=True)
    assert step.actions == ()
    assert step.waiting == waiting_on(held, operator_running=True)
    assert "the operator removes its node labels and taint" in step.waiting


def test_once_the_operator_is_gone_uninstall_removes_its_finalizers_and_only_those() -> None:
    held = (
        resource("ClusterPolicy", "p", "example.com/audit", NODE_CLEANUP_FINALIZER, deleting=True),
        resource("GPUCluster", "gpu-cluster", DRA_TEARDOWN_FINALIZER, deleting=True),
        resource("NVIDIADriver", "other", "example.com/keep", deleting=True),
    )
    step = plan_uninstall(Observed(held, operator_running=False), delete_crds=False)
    bodies = {a.name: a.body for a in step.actions if isinstance(a, Patch)}
    assert bodies == {
        "p": {"metadata": {"finalizers": ["example.com/audit"], "resourceVersion": "7"}},
        "gpu-cluster": {"metadata": {"finalizers": [], "resourceVersion": "7"}},
    }
    assert "the operator is gone" in step.waiting


def apply_json_patch(node: NodeView, patch: Patch) -> dict[str, Any]:
    fake = FakeKube().add(node_object(node))
    return fake.json_patch("Node", node.name, patch.body)


def test_with_no_resource_left_each_node_loses_what_the_operator_owns_and_nothing_else() -> None:
    node = labelled_node(**{"nvidia.com/gpu.product": "NVIDIA-H100"})
    step = plan_uninstall(Observed(nodes=(node, gpu_node("clean"))), delete_crds=False)
    (patch,) = step.actions
    assert isinstance(patch, Patch) and patch.name == "gpu-1" and patch.patch_type == "json"
    after = apply_json_patch(node, patch)
    labels = after["metadata"]["labels"]
    assert GPU_PRESENT not in labels and DRIVER_POOL not in labels
    assert "nvidia.com/gpu.product" not in labels and labels["team"] == "ml"
    assert after["spec"]["taints"] == [USERS]
    assert OWNED_ANNOTATION not in (after["metadata"].get("annotations") or {})


def test_a_quarantine_is_lifted_taking_only_the_taint_it_added() -> None:
    quarantined = gpu_node(
        labels={HEALTH_STATE: "quarantined"},
        annotations={HEALTH_TAINTED: "true", HEALTH_WAS_CORDONED: "false"},
        taints=[{"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}, USERS],
        unschedulable=True,
    )
    (patch,) = plan_uninstall(Observed(nodes=(quarantined,)), delete_crds=False).actions
    assert isinstance(patch, Patch)
    after = apply_json_patch(quarantined, patch)
    assert HEALTH_STATE not in after["metadata"]["labels"]
    assert after["spec"]["taints"] == [USERS]
    assert "unschedulable" not in after["spec"]


def test_a_workload_move_is_stopped_and_its_cordon_lifted_before_the_labels_go() -> None:
    record = Move("container", "vm-passthrough", MovePhase.DRAINING, 1.0, False).dump()
    moving = gpu_node(annotations={WORKLOAD_MOVE: record}, unschedulable=True)
    (patch,) = plan_uninstall(Observed(nodes=(moving,)), delete_crds=False).actions
    assert isinstance(patch, Patch) and "uncordoned" in patch.says
    after = apply_json_patch(moving, patch)
    assert WORKLOAD_MOVE not in (after["metadata"].get("annotations") or {})
    assert not after["spec"].get("unschedulable")
    record = Move("container", "vm-passthrough", MovePhase.DRAINING, 1.0, True).dump()
    theirs = gpu_node(annotations={WORKLOAD_MOVE: record}, unschedulable=True)
    (patch,) = plan_uninstall(Observed(nodes=(theirs,)), delete_crds=False).actions
    assert apply_json_patch(theirs, patch)["spec"]["unschedulable"] is True  # cordoned before


def test_the_crds_wait_for_garbage_collection_then_go() -> None:
    crds = tuple(crd(name) for name in CRDS)
    children = (
        owned_by("DaemonSet", "cluster-policy"),
        owned_by("DaemonSet", "h100", "NVIDIADriver"),
        ("Pod", {"metadata": {"name": "x", "ownerReferences": [{"kind": "DaemonSet"}]}}),
    )
    waiting = plan_uninstall(Observed(children=children, crds=crds), delete_crds=True)
    assert waiting.actions == ()
    assert waiting.waiting == (
        "waiting for garbage collection: DaemonSet cluster-policy-daemonset, "
        "DaemonSet h100-daemonset"
    )
    step = plan_uninstall(Observed(crds=crds), delete_crds=True)
    assert step.actions == tuple(Delete("CustomResourceDefinition", n) for n in CRDS)
    going = plan_uninstall(Observed(crds=(crd(CRDS[0], deleting=True),)), delete_crds=True)
    assert going.actions == () and CRDS[0] in going.waiting
    assert plan_uninstall(Observed(), delete_crds=True).done


def test_without_wait_only_the_deletions() -> None:
    found = (resource("ClusterPolicy", "p", NODE_CLEANUP_FINALIZER),)
    step = plan_uninstall(
        Observed(found, nodes=(labelled_node(),), crds=(crd(CRDS[0]),)),
        delete_crds=True,
        wait=False,
    )
    assert step.actions == (
        Delete("ClusterPolicy", "p"),
        Delete("CustomResourceDefinition", CRDS[0]),
    )
    assert step.done is False and step.waiting == ""


class FinalizingKube(FakeKube):
    """Deleting an object with finalizers marks it deleting; it goes once they are gone; GC
    takes what a deleted resource owned (as the real server and controller do)."""

    def delete(self, kind: str, name: str, namespace: str | None = None, **kw: Any) -> bool:
        obj = self.obj(kind, name, namespace)
        if obj is not None and obj["metadata"].get("finalizers"):
            self.writes.append(("delete", kind, name))
            obj["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
            return True
        gone = super().delete(kind, name, namespace)
        for key, child in list(self.objects.items()):
            refs = child["metadata"].get("ownerReferences") or ()
            if any(r.get("name") == name and r.get("kind") == kind for r in refs):
                del self.objects[key]
        return gone

    def merge_patch(
        self, kind: str, name: str, patch: Mapping[str, Any], *args: Any, **kw: Any
    ) -> dict[str, Any]:
        result = super().merge_patch(kind, name, patch, *args, **kw)
        if result["metadata"].get("deletionTimestamp") and not result["metadata"]["finalizers"]:
            self.delete(kind, name)
        return result


def cluster(operator_ready: int) -> FinalizingKube:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-operator", "namespace": NS},
        "status": {"readyReplicas": operator_ready},
    }
    daemonset = {"apiVersion": "apps/v1", "kind": "DaemonSet", **owned_by("DaemonSet", "h100")[1]}
    daemonset["metadata"] |= {"namespace": NS}
    daemonset["metadata"]["ownerReferences"][0] |= {"kind": "NVIDIADriver"}
    objects = [
        resource("ClusterPolicy", "cluster-policy", NODE_CLEANUP_FINALIZER)[1],
        resource("NVIDIADriver", "h100")[1],
        resource("GPUCluster", "gpu-cluster", DRA_TEARDOWN_FINALIZER)[1],
        node_object(labelled_node()),
        deployment,
        daemonset,
        *({"apiVersion": "apiextensions.k8s.io/v1", **crd(name)} for name in CRDS),
    ]
    return FinalizingKube().add(*copy.deepcopy(objects))


def test_with_the_operator_gone_nothing_of_the_project_is_left() -> None:
    kube, out = cluster(operator_ready=0), io.StringIO()
    uninstall(kube, out, wait=True, timeout=30, delete_crd=True, namespace=NS, sleep=lambda _: None)
    kinds = {kind for kind, _, _ in kube.objects}
    assert kinds == {"Node", "Deployment"}, sorted(kube.objects)
    (node,) = kube.of_kind("Node")
    assert (
        node["metadata"]["labels"].get("team") == "ml"
        and GPU_PRESENT not in node["metadata"]["labels"]
    )
    assert node["spec"]["taints"] == [USERS]
    lines = out.getvalue().splitlines()
    assert (
        f"removed the finalizer {NODE_CLEANUP_FINALIZER} of ClusterPolicy cluster-policy: "
        "the operator is gone" in lines
    )
    assert lines[-1] == (
        "uninstalled: no ClusterPolicy, NVIDIADriver or GPUCluster is left, nor their CRDs; the "
        "nodes are clean"
    )


def test_a_stuck_uninstall_says_what_holds_each_resource() -> None:
    kube = cluster(operator_ready=1)  # an operator that never lets go
    with pytest.raises(UninstallError) as stuck:
        uninstall(kube, io.StringIO(), wait=True, timeout=0, delete_crd=False, namespace=NS)
    assert str(stuck.value).startswith(
        f"after 0s still ClusterPolicy cluster-policy ({NODE_CLEANUP_FINALIZER}); "
    )


def test_a_write_refused_for_a_conflict_is_tried_again_at_the_next_look() -> None:
    kube = cluster(operator_ready=0)
    kube.refuse("patch", "Node", "gpu-1", status=422, times=1)
    uninstall(kube, io.StringIO(), wait=True, timeout=30, delete_crd=False, namespace=NS,
              sleep=lambda _: None)  # fmt: skip
    (node,) = kube.of_kind("Node")
    assert GPU_PRESENT not in node["metadata"]["labels"]


def test_an_unexpected_refusal_stops_it() -> None:
    kube = cluster(operator_ready=0)
    kube.refuse("delete", "NVIDIADriver", status=403)
    with pytest.raises(Exception) as refused:
        uninstall(kube, io.StringIO(), wait=True, timeout=30, delete_crd=False, namespace=NS)
    assert getattr(refused.value, "status", None) == 403
