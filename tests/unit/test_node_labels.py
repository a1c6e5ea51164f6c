"""Node labels and taint: only the operator's own keys, exactly undone on removal."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_operator.labels import OWNED_ANNOTATION
from gpu_operator.node_labels import NodePolicy, Owned, Taint, is_gpu_node, plan_node
from gpu_operator.views import NodeView
from tests.fakes.kube import FakeKube
from tests.unit.controller.builders import node_object

TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
POLICY = NodePolicy(
    deploy=("driver", "container-toolkit", "device-plugin", "mig-manager"), taint=TAINT
)
NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}


def node(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    capacity: dict[str, str] | None = None,
) -> NodeView:
    return NodeView(
        "n1",
        labels=labels or {},
        annotations=annotations or {},
        taints=tuple(taints or ()),
        capacity=capacity or {},
        resource_version="7",
    )


def _view(labels: dict[str, str], like: NodeView) -> NodeView:
    """``like`` with other labels, as the next observation of the same node."""
    return NodeView(
        "n1",
        labels=labels,
        annotations=like.annotations,
        taints=like.taints,
        resource_version="9",
    )


def apply(view: NodeView, policy: NodePolicy | None, uninstall: bool = False) -> NodeView:
    """What the node looks like after the planned patch (a merge patch, applied by hand)."""
    patch = plan_node(view, policy, uninstall=uninstall)
    if patch is None:
        return view
    labels = dict(view.labels)
    for k, v in patch.labels.items():
        if v is None:
            labels.pop(k, None)
        else:
            labels[k] = v
    annotations = dict(view.annotations)
    for k, v in patch.annotations.items():
        if v is None:
            annotations.pop(k, None)
        else:
            annotations[k] = v
    taints = view.taints if patch.taints is None else tuple(patch.taints)
    return NodeView(
        view.name,
        labels=labels,
        annotations=annotations,
        taints=taints,
        capacity=dict(view.capacity),
        resource_version="8",
    )


def test_detection_sources() -> None:
    assert is_gpu_node(node(NFD))
    assert is_gpu_node(node({"feature.node.kubernetes.io/pci-0302_10de.present": "true"}))
    assert is_gpu_node(node({"cloud.google.com/gke-accelerator": "nvidia-l4"}))
    assert is_gpu_node(node({"nvidia.com/gpu.present": "true"}))
    assert is_gpu_node(node(capacity={"nvidia.com/gpu": "8"}))
    assert not is_gpu_node(node({"feature.node.kubernetes.io/pci-10de.present": "false"}))
    assert not is_gpu_node(node({"kubernetes.io/os": "linux"}, capacity={"nvidia.com/gpu": "0"}))
    # Our own gpu.present label is not evidence of a GPU.
    owned = Owned(frozenset({"nvidia.com/gpu.present"})).dump() or ""
    assert not is_gpu_node(node({"nvidia.com/gpu.present": "true"}, {OWNED_ANNOTATION: owned}))


def test_gpu_node_gets_labels_and_taint_then_nothing_more() -> None:
    before = node({**NFD, "team": "ml"}, taints=[{"key": "dedicated", "effect": "NoExecute"}])
    after = apply(before, POLICY)
    assert after.labels == {
        **NFD,
        "team": "ml",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.deploy.container-toolkit": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
    }
    assert list(after.taints) == [
        {"key": "dedicated", "effect": "NoExecute"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    ]
    assert plan_node(after, POLICY) is None  # idempotent: a second pass writes nothing


def test_mig_manager_and_default_layout_only_on_mig_capable_nodes() -> None:
    after = apply(node({**NFD, "nvidia.com/mig.capable": "true"}), POLICY)
    assert after.labels["nvidia.com/gpu.deploy.mig-manager"] == "true"
    assert after.labels["nvidia.com/mig.config"] == "all-disabled"
    chosen = apply(
        node({**NFD, "nvidia.com/mig.capable": "true", "nvidia.com/mig.config": "x"}), POLICY
    )
    assert chosen.labels["nvidia.com/mig.config"] == "x"


def test_cpu_node_is_left_alone() -> None:
    assert plan_node(node({"kubernetes.io/os": "linux"}), POLICY) is None


def test_paused_and_false_deploy_labels_are_left_alone() -> None:
    labels = {
        **NFD,
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change",
        "nvidia.com/gpu.deploy.driver": "false",
    }
    after = apply(node(labels), POLICY)
    assert after.labels["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"
    assert after.labels["nvidia.com/gpu.deploy.driver"] == "false"


def test_operands_false_removes_every_deploy_label() -> None:
    labelled = apply(node(NFD), POLICY)
    off = apply(
        _view({**labelled.labels, "nvidia.com/gpu.deploy.operands": "false"}, labelled),
        POLICY,
    )
    assert not [
        k
        for k in off.labels
        if k.startswith("nvidia.com/gpu.deploy.") and k != "nvidia.com/gpu.deploy.operands"
    ]
    assert off.labels["nvidia.com/gpu.present"] == "true"


def test_disabling_a_component_removes_its_label() -> None:
    labelled = apply(node(NFD), POLICY)
    fewer = NodePolicy(deploy=("driver",), taint=TAINT)
    after = apply(labelled, fewer)
    assert "nvidia.com/gpu.deploy.device-plugin" not in after.labels
    assert after.labels["nvidia.com/gpu.deploy.driver"] == "true"


def test_removal_restores_exactly_what_was_there() -> None:
    gke_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    original = node(
        {**NFD, "nvidia.com/gpu.deploy.driver": "true", "team": "ml"},
        {"note": "x"},
        [gke_taint],
    )
    labelled = apply(original, POLICY)
    # Feature discovery adds its labels meanwhile.
    with_gfd = _view(
        {
            **labelled.labels,
            "nvidia.com/gpu.product": "Tesla-T4",
            "nvidia.com/cuda.driver-version.major": "580",
        },
        labelled,
    )
    gone = apply(with_gfd, None, uninstall=True)
    assert gone.labels == original.labels  # the user's deploy.driver=true label survives
    assert gone.annotations == original.annotations
    assert list(gone.taints) == [gke_taint]  # GKE's taint was there before: not ours to remove


def test_node_losing_its_gpu_loses_our_labels_and_taint() -> None:
    labelled = apply(node({**NFD, "team": "ml"}), POLICY)
    labels = {k: v for k, v in labelled.labels.items() if k not in NFD}
    lost = apply(_view(labels, labelled), POLICY)
    assert lost.labels == {"team": "ml"}
    assert lost.taints == ()
    assert OWNED_ANNOTATION not in lost.annotations


def test_taint_can_be_disabled_and_is_then_removed() -> None:
    labelled = apply(node(NFD), POLICY)
    untainted = apply(labelled, NodePolicy(deploy=POLICY.deploy, taint=None))
    assert untainted.taints == ()
    patch = plan_node(labelled, NodePolicy(deploy=POLICY.deploy, taint=None))
    assert patch is not None
    ops = patch.to_json_patch()
    # Removed in place, checked to still be there: no resourceVersion, no whole-list replace.
    assert ops[-2:] == [
        {"op": "test", "path": "/spec/taints/0", "value": TAINT.to_k8s()},
        {"op": "remove", "path": "/spec/taints/0"},
    ]
    assert [op["path"] for op in ops[:-2]] == [
        "/metadata/annotations/nvidia.com~1gpu-operator.owned"
    ]


def test_node_patch_never_carries_a_resource_version() -> None:
    """A JSON patch that tests only what it changes: each label it sets or removes, absent maps
    and lists it creates, the taint it removes; never the object's resourceVersion."""
    ops = plan_node(node(NFD), POLICY).to_json_patch()  # type: ignore[union-attr]
    assert not [op for op in ops if "resourceVersion" in op["path"]]
    assert ops[:2] == [
        {"op": "test", "path": "/metadata/labels/nvidia.com~1gpu.present", "value": None},
        {"op": "add", "path": "/metadata/labels/nvidia.com~1gpu.present", "value": "true"},
    ]
    assert {"op": "test", "path": "/metadata/annotations", "value": None} in ops
    assert ops[-2:] == [
        {"op": "test", "path": "/spec/taints", "value": None},
        {"op": "add", "path": "/spec/taints", "value": [TAINT.to_k8s()]},
    ]
    # Labels alone: the taint list is not touched.
    labelled = apply(node(NFD), POLICY)
    ops = plan_node(labelled, NodePolicy(deploy=(), taint=TAINT)).to_json_patch()  # type: ignore[union-attr]
    assert ops and not [op for op in ops if op["path"].startswith("/spec")]
    # Someone else's taint (the node lifecycle controller's not-ready) is left where it is.
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    ops = plan_node(node(NFD, taints=[not_ready]), POLICY).to_json_patch()  # type: ignore[union-attr]
    assert ops[-1] == {"op": "add", "path": "/spec/taints/-", "value": TAINT.to_k8s()}
    assert not [op for op in ops if op["path"] == "/spec/taints"]


MIG_NODE = {**NFD, "nvidia.com/mig.capable": "true"}


@pytest.mark.parametrize(
    ("key", "theirs"),
    [
        ("nvidia.com/mig.config", "all-1g.5gb"),  # a layout chosen as discovery said mig.capable
        ("nvidia.com/gpu.deploy.device-plugin", "false"),  # NVIDIA issue 2288's choice
    ],
)
def test_a_label_written_after_the_operators_read_is_not_overwritten(key: str, theirs: str) -> None:
    """The operator sets these labels only where absent. Planned from a read that predates a
    person's write of the same key (the watch is a few hundred ms behind), its patch is refused
    whole and the person's value stays; the next plan, from a read that shows it, keeps it."""
    stale = node(MIG_NODE)
    kube = FakeKube().add(node_object(node({**MIG_NODE, key: theirs})))
    ops = plan_node(stale, POLICY).to_json_patch()  # type: ignore[union-attr]
    with pytest.raises(ApiException) as refused:
        kube.json_patch("Node", "n1", ops)
    assert refused.value.status == 422
    assert kube.obj("Node", "n1")["metadata"]["labels"][key] == theirs  # type: ignore[index]
    fresh = node({**MIG_NODE, key: theirs})
    kube.json_patch("Node", "n1", plan_node(fresh, POLICY).to_json_patch())  # type: ignore[union-attr]
    stored = kube.obj("Node", "n1")["metadata"]  # type: ignore[index]
    assert stored["labels"][key] == theirs
    assert key not in Owned.parse(stored["annotations"]).labels


def test_writes_to_other_labels_after_the_read_do_not_refuse_the_patch() -> None:
    """Discovery labels the node while the operator plans: different keys, no conflict."""
    kube = FakeKube().add(node_object(node({**MIG_NODE, "nvidia.com/gpu.product": "A100"})))
    kube.json_patch("Node", "n1", plan_node(node(MIG_NODE), POLICY).to_json_patch())  # type: ignore[union-attr]
    labels = kube.obj("Node", "n1")["metadata"]["labels"]  # type: ignore[index]
    assert labels["nvidia.com/gpu.product"] == "A100"
    assert labels["nvidia.com/mig.config"] == "all-disabled"


def test_an_owned_label_changed_after_the_read_is_not_removed() -> None:
    """Removing a label the operator owns checks it still holds the value the plan read."""
    labelled = apply(node(NFD), POLICY)
    kube = FakeKube().add(
        node_object(_view({**labelled.labels, "nvidia.com/gpu.deploy.driver": "false"}, labelled))
    )
    gone = plan_node(labelled, None)
    assert gone is not None and gone.labels["nvidia.com/gpu.deploy.driver"] is None
    with pytest.raises(ApiException):
        kube.json_patch("Node", "n1", gone.to_json_patch())
    assert kube.obj("Node", "n1")["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] == "false"  # type: ignore[index]


def test_mangled_ownership_annotation_owns_nothing() -> None:
    view = node({**NFD, "nvidia.com/gpu.present": "true"}, {OWNED_ANNOTATION: "{not json"})
    gone = apply(view, None)
    assert gone.labels["nvidia.com/gpu.present"] == "true"


def test_uninstall_removes_what_the_upgrade_and_mig_manager_left_on_the_node() -> None:
    labelled = apply(node(NFD), POLICY)
    worked_on = NodeView(
        "n1",
        labels={**labelled.labels, "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
        annotations={
            **labelled.annotations,
            "nvidia.com/gpu-driver-upgrade-state.since": "1700000000",
            "nvidia.com/mig.config.state.reason": "",
            "team.example.com/owner": "ml",
        },
        taints=labelled.taints,
        resource_version="9",
    )
    gone = apply(worked_on, None, uninstall=True)
    assert "nvidia.com/gpu-driver-upgrade-state" not in gone.labels
    assert dict(gone.annotations) == {"team.example.com/owner": "ml"}


def test_a_deploy_label_a_person_set_to_false_is_never_overwritten() -> None:
    """NVIDIA issue 2288: ``gpu.deploy.<c>=false`` set on a labelled node survives everything."""
    labelled = apply(node(NFD), POLICY)
    key = "nvidia.com/gpu.deploy.device-plugin"
    chosen = _view({**labelled.labels, key: "false"}, labelled)
    steps = [
        POLICY,  # the next pass
        NodePolicy(deploy=("driver",), taint=TAINT),  # the component disabled ...
        POLICY,  # ... and enabled again
    ]
    view = chosen
    for policy in steps:
        view = apply(view, policy)
        assert view.labels[key] == "false"
    operands_off = apply(
        _view({**view.labels, "nvidia.com/gpu.deploy.operands": "false"}, view), POLICY
    )
    assert operands_off.labels[key] == "false"
    back_on = apply(
        _view(
            {k: v for k, v in operands_off.labels.items() if k != "nvidia.com/gpu.deploy.operands"},
            operands_off,
        ),
        POLICY,
    )
    assert back_on.labels[key] == "false"
    gone = apply(back_on, None, uninstall=True)
    assert gone.labels[key] == "false"
    assert "nvidia.com/gpu.deploy.driver" not in gone.labels  # ours still goes
    assert plan_node(apply(chosen, POLICY), POLICY) is None  # and a converged node writes nothing
