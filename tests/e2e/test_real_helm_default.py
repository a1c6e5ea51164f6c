"""NVIDIA's Helm-default ClusterPolicy (`../shared/reference/nvidia/clusterpolicy-helm-default.
yaml`), reconciled unchanged on real kubelets: drop-in means NVIDIA's own policy works, not only
the project's example. Its rendering names NVIDIA's images for every operand but the validator
(NVIDIA's validator image is the project's, see render.components); each runs here as its
SIMULATED stand-in (testenv/standins.py), the project's agent behind NVIDIA's command and env,
with the simulated NVML handed over by the testenv's `nvidia` runtime as NVIDIA's hands over
the driver's. Every operand pod on each real node must reach Ready through its rendered probes,
feature discovery must label the nodes, the exporter serve metrics and the MIG manager apply a
layout from NVIDIA's rendered config."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpu_operator import testenv
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.testenv import standins
from tests.e2e.stack_support import (
    NS,
    ON_EACH_REAL_NODE,
    POLICY,
    Stack,
    check_discovery_labels,
    check_exporter_names_the_gpu_pod,
    check_mig_reconfiguration,
    exporter_metrics,
    node_labels,
    phases,
    pods_on,
    ready,
    real_stack,
    wait_all_operands_ready,
)
from tests.e2e.support import NotYet, policy_ready, wait_for
from tests.prerequisites import nvidia

pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]

FAMILIES = {"a100-40gb:8": "ampere", "h100-80gb:8": "hopper"}
# The DaemonSets whose container runs a stand-in, and the line it logs first.
STAND_IN_LINES = {
    "nvidia-driver-daemonset-ubuntu22.04": "SIMULATED: NVIDIA driver stand-in",
    "nvidia-device-plugin-daemonset": "SIMULATED: NVIDIA device plugin stand-in",
    "gpu-feature-discovery": "SIMULATED: NVIDIA GPU feature discovery stand-in",
    "nvidia-mig-manager": "SIMULATED: NVIDIA MIG manager stand-in",
    "nvidia-dcgm-exporter": "SIMULATED: NVIDIA DCGM exporter stand-in",
}


@pytest.fixture(scope="module")
def stack(
    real_cluster: testenv.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with real_stack(real_cluster, _helm_default(), tmp_path_factory) as running:
        yield running


def _helm_default() -> dict[str, Any]:
    policy: dict[str, Any] = yaml.safe_load(nvidia("clusterpolicy-helm-default.yaml").read_text())
    return policy


def _images(pod: dict[str, Any]) -> set[str]:
    spec = pod["spec"]
    return {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}


def _ready_pod(stack: Stack, ds: str, node: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | NotYet:
        pods = pods_on(stack, ds, node)
        return next((p for p in pods if ready(p)), None) or NotYet(phases(pods))

    return wait_for(f"a Ready {ds} pod on {node}", found, timeout=300)


def test_every_operand_is_ready_on_the_real_nodes_through_its_real_probes(stack: Stack) -> None:
    print(f"\nhelm-default stack: every operand Ready in {wait_all_operands_ready(stack):.0f}s")
    wait_for(
        "ClusterPolicy ready",
        lambda: policy_ready(stack.kube, POLICY),
        timeout=180,
    )
    # The pods run NVIDIA's images (their stand-ins) as the Helm defaults name them.
    helm = {s.reference for s in standins.standins() if s.rendering == "helm-default"}
    for node in stack.cluster.real_nodes:
        pods = [p for ds in ON_EACH_REAL_NODE for p in pods_on(stack, ds, node)]
        running = set().union(*map(_images, pods))
        assert running == helm | {DEFAULT_OPERATOR_IMAGE}, (node, running)
    node = stack.cluster.real_nodes[0]
    for ds, line in STAND_IN_LINES.items():
        pod = _ready_pod(stack, ds, node)
        main = pod["spec"]["containers"][0]["name"]
        log = stack.core.read_namespaced_pod_log(pod["metadata"]["name"], NS, container=main)
        assert log.startswith(line), (ds, log[:300])


def test_gpu_feature_discovery_labels_each_real_node(stack: Stack) -> None:
    """NVIDIA's gpu-feature-discovery command (the stand-in) labels each node as gpu-facts.md
    says GFD does, for the node's simulated GPUs, the policy's MIG strategy and the driver
    version the policy installed."""
    check_discovery_labels(stack)
    version = _helm_default()["spec"]["driver"]["version"]
    for planned in stack.cluster.real.nodes:  # type: ignore[union-attr]
        labels = node_labels(stack.kube, planned.name)
        assert labels["nvidia.com/gpu.family"] == FAMILIES[planned.gpus], labels
        assert labels["nvidia.com/gpu.memory"].isdigit(), labels
        assert labels["nvidia.com/mig.strategy"] == "single", labels
        assert labels["nvidia.com/cuda.driver-version.full"] == version, labels
        assert labels["nvidia.com/cuda.driver.major"] == version.split(".")[0], labels
        assert labels["nvidia.com/gfd.timestamp"].isdigit(), labels


def test_exporter_serves_the_policys_counters_and_names_the_pod_that_holds_a_gpu(
    stack: Stack,
) -> None:
    """NVIDIA's dcgm-exporter (the stand-in) serves what DCGM_EXPORTER_COLLECTORS lists (the
    rendered ConfigMap) on DCGM_EXPORTER_LISTEN, and maps GPUs to pods through the mounted
    PodResources socket (DCGM_EXPORTER_KUBERNETES)."""
    node = stack.cluster.real_nodes[1]
    check_exporter_names_the_gpu_pod(stack, node)
    config = stack.kube.get("ConfigMap", "nvidia-dcgm-exporter-metrics", NS) or {}
    listed = {
        line.split(",", 1)[0].strip()
        for line in config["data"]["dcgm-metrics.csv"].splitlines()
        if line.strip() and not line.startswith("#")
    }
    exporter = _ready_pod(stack, "nvidia-dcgm-exporter", node)
    served = {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in exporter_metrics(stack, exporter["metadata"]["name"]).splitlines()
        if line.startswith("DCGM_FI_")
    }
    assert "DCGM_FI_DEV_GPU_TEMP" in served and served <= listed, (served, listed)


def test_mig_manager_applies_a_layout_from_the_rendered_config(stack: Stack) -> None:
    """NVIDIA's k8s-mig-manager (the stand-in) reads CONFIG_FILE (the rendered
    default-mig-parted-config) and changes the layout, pausing and resuming the operands."""
    check_mig_reconfiguration(stack, stack.cluster.real_nodes[0])
