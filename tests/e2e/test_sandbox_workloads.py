"""Sandbox workloads on a real control plane: with ``sandboxWorkloads.enabled`` each GPU node
runs the stack its ``nvidia.com/gpu.workload.config`` label names (``container``,
``vm-passthrough``, ``vm-vgpu``), with NVIDIA's deploy labels, and exactly that stack's
DaemonSets put pods there (kwok runs them: the operands are NVIDIA's images, which nothing
here pulls). Relabelling a node moves it to the other stack, cordoned and drained of the pods
holding its NVIDIA devices first; a label naming no workload config leaves the node as it was
and is told on the Node and in the policy's status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.kube import Kube
from gpu_operator.labels import DEPLOY_PREFIX, WORKLOAD_CONFIG, WORKLOAD_MOVE
from tests.e2e.support import (
    NotYet,
    events_with,
    node_events,
    policy_api_served,
    policy_ready,
    policy_status,
    private_cluster,
    service_account_config,
    start_operator,
    wait_for,
)

NS = "gpu-operator"
CONTAINER_NODE, PASSTHROUGH_NODE, VGPU_NODE = "gpu-container", "gpu-passthrough", "gpu-vgpu"
POLICY = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "spec": {
        "sandboxWorkloads": {"enabled": True},
        "dcgm": {"enabled": True},
        "sandboxDevicePlugin": {"enabled": True},
        "vfioManager": {"enabled": True},
        "vgpuManager": {"enabled": True, "repository": "registry.example.com/nvidia"},
        "vgpuDeviceManager": {"enabled": True},
        "kataManager": {"enabled": True},
        "ccManager": {"enabled": True},
    },
}
# NVIDIA's operator's deploy labels per workload config (the container stack as this operator
# sets it: node-status-exporter has no operand here, mig-manager needs a MIG-capable GPU; no
# cc-manager: in kubevirt mode neither operator deploys the CC manager, and this one labels only
# what it deploys)
LABELS = {
    "container": {
        "driver",
        "gpu-feature-discovery",
        "container-toolkit",
        "device-plugin",
        "dcgm",
        "dcgm-exporter",
        "operator-validator",
    },
    "vm-passthrough": {
        "sandbox-device-plugin",
        "sandbox-validator",
        "vfio-manager",
        "kata-manager",
    },
    "vm-vgpu": {
        "sandbox-device-plugin",
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
    },
}
DAEMONSETS = {
    "container": {
        "nvidia-driver-daemonset-ubuntu22.04",
        "gpu-feature-discovery",
        "nvidia-container-toolkit-daemonset",
        "nvidia-device-plugin-daemonset",
        "nvidia-dcgm",
        "nvidia-dcgm-exporter",
        "nvidia-operator-validator",
    },
    "vm-passthrough": {
        "nvidia-sandbox-device-plugin-daemonset",
        "nvidia-sandbox-validator",
        "nvidia-vfio-manager",
        "nvidia-kata-manager",
    },
    "vm-vgpu": {
        "nvidia-sandbox-device-plugin-daemonset",
        "nvidia-vgpu-manager-daemonset",
        "nvidia-vgpu-device-manager",
        "nvidia-sandbox-validator",
    },
}


@pytest.fixture
def kube(testenv_bin_dir: Path) -> Iterator[Kube]:
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        cluster.create_nodes(
            [
                testenv.node_manifest(
                    name,
                    gpu=True,
                    # NFD's confidential-computing rule marks these GPUs (cc-manager needs it)
                    extra_labels={WORKLOAD_CONFIG: config, "nvidia.com/cc.capable": "true"},
                )
                for name, config in (
                    (CONTAINER_NODE, "container"),
                    (PASSTHROUGH_NODE, "vm-passthrough"),
                    (VGPU_NODE, "vm-vgpu"),
                )
            ]
        )
        kube = Kube(api)
        operator = start_operator(service_account_config(cluster, NS, "gpu-operator"), NS)
        try:
            yield kube
        finally:
            operator.stop()


def deploy_labels(kube: Kube, name: str) -> set[str]:
    node = kube.get("Node", name) or {}
    labels = node.get("metadata", {}).get("labels") or {}
    return {
        k.removeprefix(DEPLOY_PREFIX)
        for k, v in labels.items()
        if k.startswith(DEPLOY_PREFIX) and v == "true"
    }


def labelled(kube: Kube, expected: dict[str, str]) -> dict[str, set[str]] | NotYet:
    """Each node's deploy labels once they are its workload config's; else what they are."""
    seen = {name: deploy_labels(kube, name) for name in expected}
    want = {name: LABELS[config] for name, config in expected.items()}
    return seen if seen == want else NotYet(seen)


def daemonset_pods(kube: Kube) -> dict[str, set[str]]:
    """The DaemonSets with a live pod on each node."""
    out: dict[str, set[str]] = {}
    for pod in kube.list_objects("Pod", NS):
        meta = pod["metadata"]
        node = (pod.get("spec") or {}).get("nodeName")
        if meta.get("deletionTimestamp") or not node:
            continue
        for owner in meta.get("ownerReferences") or []:
            if owner["kind"] == "DaemonSet":
                out.setdefault(node, set()).add(owner["name"])
    return out


def scheduled(kube: Kube, expected: dict[str, str]) -> dict[str, set[str]] | NotYet:
    """The DaemonSets with pods on each node once they are exactly its stack's."""
    pods = daemonset_pods(kube)
    seen = {name: pods.get(name, set()) for name in expected}
    want = {name: DAEMONSETS[config] for name, config in expected.items()}
    return seen if seen == want else NotYet(seen)


def test_each_node_runs_its_workload_configs_stack_and_moves_when_relabelled(
    kube: Kube,
) -> None:
    wait_for("the ClusterPolicy API", lambda: policy_api_served(kube))
    kube.create(POLICY)
    stacks = {CONTAINER_NODE: "container", PASSTHROUGH_NODE: "vm-passthrough", VGPU_NODE: "vm-vgpu"}
    wait_for("NVIDIA's deploy labels on each node", lambda: labelled(kube, stacks))
    wait_for("each stack's pods on its node", lambda: scheduled(kube, stacks), timeout=120)
    status = wait_for("the policy ready", lambda: policy_ready(kube), timeout=120)
    components = {c["name"]: c for c in status["components"]}
    for name in ("vfio-manager", "vgpu-manager", "sandbox-device-plugin", "sandbox-validator"):
        assert components[name]["ready"] and components[name]["desired"] >= 1, components[name]

    # container -> vm-passthrough: the container stack leaves the node, the VM stack comes
    kube.merge_patch(
        "Node", CONTAINER_NODE, {"metadata": {"labels": {WORKLOAD_CONFIG: "vm-passthrough"}}}
    )
    moved = {**stacks, CONTAINER_NODE: "vm-passthrough"}
    wait_for("the relabelled node's new deploy labels", lambda: labelled(kube, moved))
    wait_for("the relabelled node's new pods", lambda: scheduled(kube, moved), timeout=120)

    # a workload config that does not exist: the node keeps what it runs, and is told
    kube.merge_patch("Node", VGPU_NODE, {"metadata": {"labels": {WORKLOAD_CONFIG: "vgpu"}}})

    def reported() -> dict[str, Any] | NotYet:
        conditions = {c["type"]: c for c in policy_status(kube, "cluster-policy")["conditions"]}
        found = conditions.get("WorkloadConfigInvalid")
        return found if found and VGPU_NODE in found["message"] else NotYet(sorted(conditions))

    condition = wait_for("the WorkloadConfigInvalid condition", reported)
    assert "'vgpu'" in condition["message"]
    (event,) = [
        e
        for e in events_with(
            "the node told", lambda: node_events(kube, VGPU_NODE), "InvalidWorkloadConfig"
        )
        if e["reason"] == "InvalidWorkloadConfig"
    ]
    assert event["type"] == "Warning"
    assert deploy_labels(kube, VGPU_NODE) == LABELS["vm-vgpu"]
    assert scheduled(kube, moved)


def device_pod(name: str, node: str, resource: str) -> dict[str, Any]:
    """A bare pod holding one of ``node``'s NVIDIA devices (placed there, as kwok runs it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "work",
                    "image": "registry.example.com/cuda:12",
                    "resources": {"limits": {resource: "1"}},
                }
            ],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def protect(kube: Kube, app: str) -> None:
    kube.create({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    })  # fmt: skip

    def counted() -> bool | NotYet:
        pdb = kube.get("PodDisruptionBudget", app, "default") or {}
        status = pdb.get("status") or {}
        return status.get("currentHealthy", 0) >= 1 or NotYet(status)

    wait_for(f"the {app} PodDisruptionBudget counting its pod", counted)


def move_state(kube: Kube, name: str) -> dict[str, Any]:
    """What a move test reads of a node: cordon, move record, the live pods on it."""
    node = kube.get("Node", name) or {}
    meta = node.get("metadata") or {}
    return {
        "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
        "move": (meta.get("annotations") or {}).get(WORKLOAD_MOVE),
        "daemonsets": daemonset_pods(kube).get(name, set()),
    }


def test_a_relabelled_node_is_drained_before_its_new_stack_lands_and_back(kube: Kube) -> None:
    wait_for("the ClusterPolicy API", lambda: policy_api_served(kube))
    drain = {"enable": False, "timeoutSeconds": 5}
    spec = {**POLICY["spec"], "driver": {"upgradePolicy": {"drain": drain}}}
    kube.create({**POLICY, "spec": spec})
    stacks = {CONTAINER_NODE: "container", PASSTHROUGH_NODE: "vm-passthrough", VGPU_NODE: "vm-vgpu"}
    wait_for("each stack's pods on its node", lambda: scheduled(kube, stacks), timeout=120)
    kube.create(device_pod("train", CONTAINER_NODE, "nvidia.com/gpu"))
    kube.create(device_pod("web", CONTAINER_NODE, "cpu"))  # no NVIDIA device: it stays
    protect(kube, "train")

    # container -> vm-passthrough: cordoned, and the container stack stays while a CUDA pod
    # the PodDisruptionBudget protects is there (the drain's 5 s pass and it is told)
    kube.merge_patch(
        "Node", CONTAINER_NODE, {"metadata": {"labels": {WORKLOAD_CONFIG: "vm-passthrough"}}}
    )
    (blocked,) = [
        e
        for e in events_with(
            "the move held by the drain",
            lambda: node_events(kube, CONTAINER_NODE),
            "WorkloadMoveStarted",
            "WorkloadMoveBlocked",
        )
        if e["reason"] == "WorkloadMoveBlocked"
    ]
    assert "train" in blocked["message"] and blocked["type"] == "Warning", blocked
    held = move_state(kube, CONTAINER_NODE)
    assert held["unschedulable"] and held["move"], held
    assert held["daemonsets"] == DAEMONSETS["container"], held
    assert deploy_labels(kube, CONTAINER_NODE) == LABELS["container"]
    assert kube.get("Pod", "train", "default") is not None

    # the PDB lets it go: evicted, the container stack leaves, the VM stack lands, uncordoned
    kube.delete("PodDisruptionBudget", "train", "default")
    moved = {**stacks, CONTAINER_NODE: "vm-passthrough"}
    wait_for("the relabelled node's new pods", lambda: scheduled(kube, moved), timeout=120)
    assert kube.get("Pod", "train", "default") is None, "the VFIO manager came before the drain"

    def settled(name: str) -> dict[str, Any] | NotYet:
        state = move_state(kube, name)
        return state if not state["unschedulable"] and not state["move"] else NotYet(state)

    wait_for("the move done and the node uncordoned", lambda: settled(CONTAINER_NODE))
    events_with("the move told", lambda: node_events(kube, CONTAINER_NODE), "WorkloadMoveComplete")
    assert kube.get("Pod", "web", "default") is not None  # the drain took only device pods

    # and back: the VM holding a passthrough GPU is drained before the container stack returns
    kube.create(device_pod("vm", CONTAINER_NODE, "nvidia.com/GA100_A100_PCIE_40GB"))
    kube.merge_patch(
        "Node", CONTAINER_NODE, {"metadata": {"labels": {WORKLOAD_CONFIG: "container"}}}
    )
    wait_for("the container stack back", lambda: scheduled(kube, stacks), timeout=120)
    assert kube.get("Pod", "vm", "default") is None, "the driver came before the VM left"
    wait_for("the move back done and the node uncordoned", lambda: settled(CONTAINER_NODE))
