"""Readiness counts the nodes a DaemonSet's pods should run on, not only the DaemonSet's own
numbers: before its controller has seen the labels, a DaemonSet says 0 of 0 ready."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_operator.controller.clusterpolicy.decide import FINALIZER, decide
from gpu_operator.controller.clusterpolicy.memory import Memory
from gpu_operator.controller.readiness import (
    NodeKinds,
    component_readiness,
    eligible_nodes,
    should_run,
)
from gpu_operator.controller.runtime.actions import Apply, Patch
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.labels import COMPONENT
from gpu_operator.views import NodeView

DEPLOY = "nvidia.com/gpu.deploy.device-plugin"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
UBUNTU_2204 = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "os", "operator": "In", "values": ["ubuntu"]},
                        {"key": "version", "operator": "In", "values": ["22.04"]},
                    ]
                }
            ]
        }
    }
}


def daemonset(
    desired: int, ready: int | None = None, *, pod_spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    ready = desired if ready is None else ready
    return {
        "metadata": {
            "name": "nvidia-device-plugin-daemonset",
            "uid": "ds-uid",
            "generation": 1,
            "labels": {COMPONENT: "device-plugin"},
        },
        "spec": {
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "spec": pod_spec
                if pod_spec is not None
                else {
                    "nodeSelector": {DEPLOY: "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                }
            },
        },
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "numberAvailable": ready,
            "updatedNumberScheduled": ready,
        },
    }


def gpu_node(name: str, labelled: bool = True, **kwargs: Any) -> NodeView:
    labels = {DEPLOY: "true"} if labelled else {}
    return NodeView(name, labels={**labels, **kwargs.pop("labels", {})}, **kwargs)


@pytest.mark.parametrize(
    ("ds", "nodes", "ready", "message"),
    [
        # The bug: the DaemonSet controller has not seen the labels yet, 0 of 0 is not ready.
        (daemonset(0), [gpu_node("a"), gpu_node("b")], False, "0/2 labelled nodes scheduled"),
        (daemonset(1), [gpu_node("a"), gpu_node("b")], False, "1/2 labelled nodes scheduled"),
        (daemonset(2), [gpu_node("a"), gpu_node("b")], True, None),
        (daemonset(2, 1), [gpu_node("a"), gpu_node("b")], False, "1/2 ready, 1/2 updated"),
        # Nodes not labelled for the component do not count; nor does no node at all.
        (daemonset(0), [gpu_node("a", labelled=False)], True, None),
        (daemonset(0), [], True, None),
        # A node whose taint the pods do not tolerate gets no pod, so it is not waited for.
        (
            daemonset(1),
            [gpu_node("a"), gpu_node("b", taints=({"key": "x", "effect": "NoSchedule"},))],
            True,
            None,
        ),
    ],
)
def test_component_waits_for_a_pod_on_every_labelled_node(
    ds: dict[str, Any], nodes: list[NodeView], ready: bool, message: str | None
) -> None:
    (got,) = component_readiness("device-plugin", [ds], {}, {}, nodes)
    assert (got.ready, got.message) == (ready, message)


TOLERATES_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists"}]


@pytest.mark.parametrize(
    ("pod_spec", "node", "runs"),
    [
        ({"nodeSelector": {DEPLOY: "true"}}, gpu_node("a"), True),
        ({"nodeSelector": {DEPLOY: "true"}}, gpu_node("a", labelled=False), False),
        ({"nodeSelector": {DEPLOY: "true"}}, gpu_node("a", labels={DEPLOY: "false"}), False),
        # required node affinity: the per-OS driver DaemonSets
        (
            {"affinity": UBUNTU_2204},
            gpu_node("a", labels={"os": "ubuntu", "version": "22.04"}),
            True,
        ),
        ({"affinity": UBUNTU_2204}, gpu_node("a", labels={"os": "rhel", "version": "9.4"}), False),
        ({"affinity": UBUNTU_2204}, gpu_node("a", labels={"os": "ubuntu"}), False),
        # taints: the GPU taint is tolerated, PreferNoSchedule never blocks, and the
        # DaemonSet controller's own tolerations (not-ready, unschedulable...) always apply
        ({"tolerations": TOLERATES_GPU}, gpu_node("a", taints=(GPU_TAINT,)), True),
        ({}, gpu_node("a", taints=(GPU_TAINT,)), False),
        ({}, gpu_node("a", taints=({"key": "k", "effect": "PreferNoSchedule"},)), True),
        (
            {},
            gpu_node("a", taints=({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},)),
            True,
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]},
            gpu_node("a", taints=({"key": "k", "value": "w", "effect": "NoSchedule"},)),
            False,
        ),
        (
            {"tolerations": [{"operator": "Exists"}]},
            gpu_node("a", taints=({"key": "any", "effect": "NoExecute"},)),
            True,
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]},
            gpu_node("a", taints=({"key": "k", "effect": "NoExecute"},)),
            False,
        ),
    ],
)
def test_should_run(pod_spec: dict[str, Any], node: NodeView, runs: bool) -> None:
    assert should_run(pod_spec, node) is runs


LABEL_VALUES = st.sampled_from([None, "true", "false", "ubuntu", "rhel", "22.04", "9.4"])
TAINTS = st.sampled_from([
    GPU_TAINT,
    {"key": "k", "value": "v", "effect": "NoSchedule"},
    {"key": "k", "value": "w", "effect": "NoExecute"},
    {"key": "k", "effect": "PreferNoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
])  # fmt: skip
SPECS = st.sampled_from(
    [
        {},
        {"nodeSelector": {DEPLOY: "true"}},
        {"affinity": UBUNTU_2204, "tolerations": TOLERATES_GPU},
        {"nodeSelector": {DEPLOY: "true"}, "tolerations": [{"operator": "Exists"}]},
        {"tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]},
    ]
)


@st.composite
def fleets(draw: st.DrawFn) -> list[NodeView]:
    nodes = []
    for i in range(draw(st.integers(0, 12))):
        labels = {
            k: v for k in (DEPLOY, "os", "version", "team") if (v := draw(LABEL_VALUES)) is not None
        }
        taints = tuple(draw(st.lists(TAINTS, max_size=2)))
        nodes.append(NodeView(f"n{i}", labels=labels, taints=taints))
    return nodes


@settings(max_examples=200, deadline=None)
@given(SPECS, fleets())
def test_eligible_nodes_counts_what_should_run_says_node_by_node(
    pod_spec: dict[str, Any], nodes: list[NodeView]
) -> None:
    assert eligible_nodes(pod_spec, nodes) == sum(should_run(pod_spec, n) for n in nodes)


@settings(max_examples=200, deadline=None)
@given(st.lists(SPECS, min_size=1, max_size=4), fleets())
def test_nodes_grouped_once_for_several_specs_answer_each_as_node_by_node(
    pod_specs: list[dict[str, Any]], nodes: list[NodeView]
) -> None:
    """One grouping for every operand of a pass: grouping by the union of the labels they
    select on must not merge two nodes that one of them tells apart."""
    kinds = NodeKinds(nodes, pod_specs)
    for spec in pod_specs:
        assert kinds.eligible(spec) == sum(should_run(spec, n) for n in nodes)


def test_a_spec_selecting_on_a_label_the_grouping_ignored_is_still_answered_node_by_node() -> None:
    nodes = [
        NodeView("a", labels={DEPLOY: "true", "team": "x"}),
        NodeView("b", labels={DEPLOY: "true", "team": "y"}),
    ]
    kinds = NodeKinds(nodes, [{"nodeSelector": {DEPLOY: "true"}}])  # both nodes one kind
    assert kinds.eligible({"nodeSelector": {DEPLOY: "true"}}) == 2
    assert kinds.eligible({"nodeSelector": {"team": "x"}}) == 1


# -- decide: the nodes it labels in the same pass count ------------------------------------------

NFD_GPU = "feature.node.kubernetes.io/pci-10de.present"
OS = {
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
}


def policy() -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": "cluster-policy",
            "uid": "policy-uid",
            "generation": 1,
            "resourceVersion": "1",
            "finalizers": [FINALIZER],
        },
        "spec": {},
    }


def status_after(nodes: tuple[NodeView, ...]) -> dict[str, Any]:
    """The status decide writes when every DaemonSet exists, observed, with 0 of 0 pods."""
    config = OperatorConfig(namespace="gpu-operator")
    first = decide(Snapshot(0.0, "t", (policy(),), nodes), Memory(), config)
    daemonsets = tuple(
        {
            **a.obj,
            "metadata": {**a.obj["metadata"], "uid": f"uid-{i}", "generation": 1},
            "status": {"observedGeneration": 1, "desiredNumberScheduled": 0},
        }
        for i, a in enumerate(first.actions)
        if isinstance(a, Apply) and a.obj["kind"] == "DaemonSet"
    )
    assert daemonsets
    second = decide(Snapshot(1.0, "t", (policy(),), nodes, daemonsets=daemonsets), Memory(), config)
    (patch,) = [a for a in second.actions if isinstance(a, Patch) and a.subresource == "status"]
    status: dict[str, Any] = patch.body["status"]
    return status


def components(status: dict[str, Any]) -> dict[str, tuple[bool, str | None]]:
    return {c["name"]: (c["ready"], c.get("message")) for c in status["components"]}


def test_a_node_labelled_in_this_pass_keeps_0_of_0_from_being_ready() -> None:
    # The snapshot's node has none of the operator's labels yet: this pass adds them.
    status = status_after((NodeView("gpu-node-0", labels={NFD_GPU: "true", **OS}),))
    assert status["state"] == "notReady"
    assert components(status)["device-plugin"] == (
        False,
        "nvidia-device-plugin-daemonset: 0/1 labelled nodes scheduled",
    )


def test_a_gpu_node_without_operands_waits_for_no_pod() -> None:
    labels = {NFD_GPU: "true", "nvidia.com/gpu.deploy.operands": "false", **OS}
    status = status_after((NodeView("gpu-node-0", labels=labels),))
    assert all(ready for ready, _ in components(status).values()), components(status)
    assert status["state"] == "ready"
