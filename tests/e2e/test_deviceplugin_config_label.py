"""The device-plugin agent follows its Node's ``nvidia.com/device-plugin.config`` label on the
real API server: the agent runs as its own process with a ServiceAccount token limited to
what it needs, a local kubelet endpoint receives its registrations, and a label change switches
the advertised resources without a restart. (Real kubelets and pods come in a later test.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.deviceplugin.kubelet import LocalKubelet
from gpu_operator.kube import Kube
from tests.e2e.support import (
    NotYet,
    node_events,
    private_cluster,
    service_account_config,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"
NODE = "gpu-node-0"
LABEL = "nvidia.com/device-plugin.config"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
    "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)
# What the agent asks of the API: its Node (get, watch) and Events about it.
RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpuop-dpe-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def events_of(kube: Kube, reason: str) -> list[dict[str, Any]] | NotYet:
    """``NODE``'s Events of ``reason``; else the reasons of those it has."""
    events = node_events(kube, NODE)
    return [e for e in events if e["reason"] == reason] or NotYet([e["reason"] for e in events])


def test_the_config_label_switches_resources_without_a_restart(
    testenv_bin_dir: Path, short_tmp: Path
) -> None:
    configs = short_tmp / "configs"
    configs.mkdir()
    (configs / "default").write_text("version: v1\n")
    (configs / "shared").write_text(SHARED)
    with (
        private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster,
        cluster.api_client() as client,
        LocalKubelet(short_tmp / "device-plugins") as kubelet,
    ):
        kube = Kube(client)
        kube.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "device-plugin-test"},
                "rules": RULES,
            }
        )
        identity = service_account_config(
            cluster, NS, "nvidia-device-plugin", cluster_role="device-plugin-test"
        )
        env = {
            **os.environ,
            "KUBECONFIG": str(token_kubeconfig(cluster, identity, short_tmp / "kubeconfig")),
            "NODE_NAME": NODE,
            "GPU_OPERATOR_SIMULATE": "a100-40gb:8",
            "KUBELET_SOCKET": str(kubelet.socket_path),
            "CONFIG_FILE_SRCDIR": str(configs),
            "DEFAULT_CONFIG": "default",
        }
        for key in ("GPU_OPERATOR_SIMULATE_STATE", "CONFIG_FILE", "MIG_STRATEGY"):
            env.pop(key, None)
        log = (short_tmp / "agent.log").open("w")
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpu_operator", "agent", "device-plugin"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            kubelet.wait_for_registration("nvidia.com/gpu", timeout_s=60)
            before = len(kubelet.registrations)
            kube.merge_patch("Node", NODE, {"metadata": {"labels": {LABEL: "shared"}}})
            kubelet.wait_for_registration("nvidia.com/gpu.shared", after=before, timeout_s=30)
            with kubelet.client("nvidia.com/gpu.shared") as plugin:
                stream = plugin.list_and_watch(30)
                assert len(next(stream).devices) == 32
                stream.cancel()  # type: ignore[attr-defined]
            wait_for(
                "the DevicePluginConfigApplied Event",
                lambda: events_of(kube, "DevicePluginConfigApplied"),
            )
            # a label naming no config: a Warning on the Node, the resources stay as they are
            registrations = len(kubelet.registrations)
            kube.merge_patch("Node", NODE, {"metadata": {"labels": {LABEL: "h100"}}})
            failed = wait_for(
                "the DevicePluginConfigFailed Event",
                lambda: events_of(kube, "DevicePluginConfigFailed"),
            )
            assert failed[0]["type"] == "Warning"
            assert f"{LABEL}=h100 names no config" in failed[0]["message"]
            assert len(kubelet.registrations) == registrations
            assert (kubelet.directory / "nvidia-gpu.shared.sock").exists()
            assert agent.poll() is None  # no restart needed, none happened
        finally:
            agent.terminate()
            agent.wait(30)
            log.close()
    assert agent.returncode == 0, (short_tmp / "agent.log").read_text()
