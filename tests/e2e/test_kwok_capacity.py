"""Simulated capacity on the real local control plane: ``gpu-operator agent device-plugin
--kwok-capacity`` gives kwok nodes the ``nvidia.com/*`` resources the device plugin would
advertise, and the real kube-scheduler places GPU pods by them. The agents run as their own
processes with a ServiceAccount limited to reading Nodes and patching their status."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent import migparted
from gpu_operator.agent.nvml import Nvml
from gpu_operator.kube import Kube
from gpu_operator.labels import KWOK_NODE
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml
from gpu_operator.testenv import nodes
from tests.e2e.support import (
    NotYet,
    private_cluster,
    service_account_config,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"
WORKLOADS = "default"
LABEL = "nvidia.com/device-plugin.config"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
    "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)
RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
]
PLAIN, SHARED_NODE, MIG, REAL = "kwok-a100", "kwok-a100-shared", "kwok-a100-mig", "not-kwok"


def _gpu_pod(name: str, node: str, resource: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu22.04",
                    "resources": {"limits": {resource: str(count)}},
                }
            ],
        },
    }


def _allocatable(kube: Kube, node: str) -> dict[str, str]:
    status = (kube.get("Node", node) or {}).get("status") or {}
    return {k: v for k, v in (status.get("allocatable") or {}).items() if k.startswith("nvidia.")}


def _allocatable_is(kube: Kube, node: str, want: dict[str, str]) -> bool | NotYet:
    return (got := _allocatable(kube, node)) == want or NotYet(got)


def _scheduled(kube: Kube, name: str) -> str | None:
    pod = kube.get("Pod", name, WORKLOADS) or {}
    return (pod.get("spec") or {}).get("nodeName")


def _bound(kube: Kube, name: str) -> str | NotYet:
    """The node pod ``name`` is bound to; else its conditions (the scheduler's word)."""
    pod = kube.get("Pod", name, WORKLOADS) or {}
    node: str | None = (pod.get("spec") or {}).get("nodeName")
    return node or NotYet({"conditions": (pod.get("status") or {}).get("conditions")})


def _unschedulable(kube: Kube, name: str) -> dict[str, Any] | NotYet:
    pod = kube.get("Pod", name, WORKLOADS) or {}
    conditions = (pod.get("status") or {}).get("conditions") or []
    for condition in conditions:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return dict(condition)
    return NotYet({"conditions": conditions})


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default").write_text("version: v1\n")
    (tmp_path / "configs" / "shared").write_text(SHARED)
    return tmp_path


@pytest.fixture
def mig_state(work: Path) -> Path:
    """A simulated A100 x8 with NVIDIA's all-balanced layout applied (2x 1g.5gb, 1x 2g.10gb,
    1x 3g.20gb per GPU), shared with the agent through the state file."""
    state = work / "mig.nvml.json"
    install_simulated_nvml("a100-40gb:8", state_file=state)
    try:
        with Nvml() as nvml:
            layouts = migparted.standard_configs(nvml.inventory())
            migparted.apply_config(nvml, layouts, "all-balanced")
    finally:
        uninstall_simulated_nvml()
    return state


@pytest.fixture
def cluster_with_agents(testenv_bin_dir: Path, work: Path, mig_state: Path) -> Iterator[Any]:
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as client:
        kube = Kube(client)
        cluster.create_nodes([nodes.node_manifest(n, gpu=True) for n in (PLAIN, SHARED_NODE, MIG)])
        real = nodes.node_manifest(REAL, gpu=True)
        del real["metadata"]["annotations"][KWOK_NODE]  # a node some kubelet would own
        kube.create(real)
        kube.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "kwok-capacity-test"},
                "rules": RULES,
            }
        )
        identity = service_account_config(
            cluster, NS, "nvidia-device-plugin", cluster_role="kwok-capacity-test"
        )
        kubeconfig = token_kubeconfig(cluster, identity, work / "kubeconfig")
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPU_OPERATOR_SIMULATE", "CONFIG_FILE", "MIG_STRATEGY"))
        }
        base |= {"KUBECONFIG": str(kubeconfig), "CONFIG_FILE_SRCDIR": str(work / "configs")}
        agents: dict[str, subprocess.Popen[bytes]] = {}
        runs = {
            PLAIN: {"GPU_OPERATOR_SIMULATE": "a100-40gb:8"},
            SHARED_NODE: {"GPU_OPERATOR_SIMULATE": "a100-40gb:8"},
            MIG: {
                "GPU_OPERATOR_SIMULATE": "a100-40gb:8",
                "GPU_OPERATOR_SIMULATE_STATE": str(mig_state),
                "MIG_STRATEGY": "mixed",
            },
            REAL: {"GPU_OPERATOR_SIMULATE": "a100-40gb:8"},
        }
        try:
            for node, env in runs.items():
                with (work / f"{node}.log").open("w") as log:
                    agents[node] = subprocess.Popen(
                        [sys.executable, "-m", "gpu_operator", "agent", "device-plugin",
                         "--kwok-capacity"],
                        env={**base, **env, "NODE_NAME": node},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )  # fmt: skip
            yield kube, agents, work
        finally:
            for agent in agents.values():
                if agent.poll() is None:
                    agent.terminate()
            for agent in agents.values():
                agent.wait(30)


def test_kwok_nodes_get_the_plugins_resources_and_the_scheduler_uses_them(
    cluster_with_agents: Any,
) -> None:
    kube, agents, work = cluster_with_agents
    wait_for("A100 x8 allocatable", lambda: _allocatable_is(kube, PLAIN, {"nvidia.com/gpu": "8"}))
    capacity = (kube.get("Node", PLAIN) or {})["status"]["capacity"]
    assert capacity["nvidia.com/gpu"] == "8" and capacity["cpu"] == "32"  # the rest untouched

    kube.create(_gpu_pod("two-gpus", PLAIN, "nvidia.com/gpu", 2))
    kube.create(_gpu_pod("nine-gpus", PLAIN, "nvidia.com/gpu", 9))
    assert wait_for("the 2-GPU pod bound", lambda: _bound(kube, "two-gpus")) == PLAIN
    refused = wait_for("the 9-GPU pod unschedulable", lambda: _unschedulable(kube, "nine-gpus"))
    assert refused["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in refused["message"]
    assert _scheduled(kube, "nine-gpus") is None

    # time-slicing, replicas 4, renamed: the config label switches what the node offers
    kube.merge_patch("Node", SHARED_NODE, {"metadata": {"labels": {LABEL: "shared"}}})
    wait_for(
        "nvidia.com/gpu.shared 32 in place of nvidia.com/gpu",
        lambda: _allocatable_is(kube, SHARED_NODE, {"nvidia.com/gpu.shared": "32"}),
        timeout=30,
    )
    kube.create(_gpu_pod("one-replica", SHARED_NODE, "nvidia.com/gpu.shared", 1))
    assert wait_for("the shared pod bound", lambda: _bound(kube, "one-replica"))

    # MIG mixed: one resource per profile, counted from the layout (8 GPUs, all-balanced)
    profiles = {"nvidia.com/mig-1g.5gb": "16", "nvidia.com/mig-2g.10gb": "8",
                "nvidia.com/mig-3g.20gb": "8"}  # fmt: skip
    wait_for("per-profile MIG resources", lambda: _allocatable_is(kube, MIG, profiles))
    kube.create(_gpu_pod("a-slice", MIG, "nvidia.com/mig-3g.20gb", 1))
    assert wait_for("the MIG pod bound", lambda: _bound(kube, "a-slice")) == MIG

    # a node without the kwok annotation: refused, nothing written
    assert agents[REAL].wait(60) == 2
    assert "not a kwok node" in (work / f"{REAL}.log").read_text()
    assert _allocatable(kube, REAL) == {}
    assert all(agents[n].poll() is None for n in (PLAIN, SHARED_NODE, MIG))
