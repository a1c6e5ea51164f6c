"""Sandbox workloads on a real control plane: with ``sandboxWorkloads.enabled`` each GPU node
runs the stack its ``nvidia.com/gpu.workload.config`` label names (``container``,
``vm-passthrough``, ``vm-vgpu``), with NVIDIA's deploy labels, and exactly that stack's
DaemonSets put pods there (kwok runs them: the operands are NVIDIA's images, which nothing
here pulls). Relabelling a node moves it to the other stack; a label naming no workload config
leaves the node as it was and is told on the Node and in the policy's status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.kube import Kube
from gpu_operator.labels import DEPLOY_PREFIX, WORKLOAD_CONFIG
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
# sets it: node-status-exporter has no operand here, mig-manager needs a MIG-capable GPU)
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
        "cc-manager",
    },
    "vm-vgpu": {
        "sandbox-device-plugin",
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
        "cc-manager",
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
    # (kata-manager: labelled as NVIDIA does, no operand here yet)
    "vm-passthrough": {
        "nvidia-sandbox-device-plugin-daemonset",
        "nvidia-sandbox-validator",
        "nvidia-vfio-manager",
        "nvidia-cc-manager",
    },
    "vm-vgpu": {
        "nvidia-sandbox-device-plugin-daemonset",
        "nvidia-vgpu-manager-daemonset",
        "nvidia-vgpu-device-manager",
        "nvidia-sandbox-validator",
        "nvidia-cc-manager",
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
