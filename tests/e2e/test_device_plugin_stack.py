"""The operator deploys the project's device plugin and, for an MPS config, NVIDIA's MPS control
daemon DaemonSet: learnt from the watched ConfigMap on the real API server, so editing the
config from MPS to time-slicing removes the daemon again. (The pods themselves run on real
nodes once the project's image is loaded there; kwok only plays them here.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.controller.runner import OperatorThread
from gpu_operator.kube import Kube
from tests.e2e.support import (
    policy_api_served,
    private_cluster,
    service_account_config,
    start_operator,
    still_there,
    wait_for,
)

NS = "gpu-operator"
MPS_DS = "nvidia-device-plugin-mps-control-daemon"
PLUGIN_DS = "nvidia-device-plugin-daemonset"
MPS = (
    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)
TIME_SLICED = MPS.replace("mps:", "timeSlicing:")


def _configs(mps: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "dp-configs", "namespace": NS},
        "data": {"default": "version: v1\n", "shared": mps},
    }


POLICY = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "spec": {
        "devicePlugin": {
            "repository": "ghcr.io/gpu-operator",
            "image": "gpu-operator",
            "config": {"name": "dp-configs", "default": "default"},
        },
    },
}


@pytest.fixture
def operator(testenv_bin_dir: Path) -> Iterator[tuple[Kube, OperatorThread]]:
    with private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        identity = service_account_config(cluster, NS, "gpu-operator")
        thread = start_operator(identity, NS, simulate_gpus="a100-40gb:8")
        try:
            yield kube, thread
        finally:
            thread.stop()


def _daemonset(kube: Kube, name: str) -> dict[str, Any] | None:
    return kube.get("DaemonSet", name, NS)


def test_mps_config_brings_the_control_daemon_and_time_slicing_removes_it(
    operator: tuple[Kube, OperatorThread],
) -> None:
    kube, _ = operator
    kube.create(_configs(MPS))
    wait_for("the ClusterPolicy API", lambda: policy_api_served(kube))
    kube.create(POLICY)

    daemon = wait_for("the MPS control daemon DaemonSet", lambda: _daemonset(kube, MPS_DS))
    assert daemon["metadata"]["labels"]["app"] == MPS_DS
    template = daemon["spec"]["template"]
    assert template["metadata"]["labels"]["app"] == MPS_DS
    assert template["spec"]["nodeSelector"]["nvidia.com/mps.capable"] == "true"
    (container,) = template["spec"]["containers"]
    assert container["command"] == ["gpu-operator", "agent", "mps-control-daemon", "--simulated"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in template["spec"]["volumes"]
               if "hostPath" in v}  # fmt: skip
    # The project's image loads NVML from the driver root, which it mounts (no runtime hook).
    assert volumes == {
        "mps-root": "/run/nvidia/mps",
        "mps-shm": "/run/nvidia/mps/shm",
        "driver-root": "/run/nvidia/driver",
    }

    plugin = wait_for("the device plugin DaemonSet", lambda: _daemonset(kube, PLUGIN_DS))
    (main,) = plugin["spec"]["template"]["spec"]["containers"]
    assert main["command"] == ["gpu-operator", "agent", "device-plugin"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["GPU_OPERATOR_SIMULATE"] == "a100-40gb:8"
    assert env["CONFIG_FILE_SRCDIR"] == "/available-configs"

    kube.merge_patch("ConfigMap", "dp-configs", {"data": {"shared": TIME_SLICED}}, NS)
    wait_for(
        "the MPS control daemon pruned",
        lambda: (ds := _daemonset(kube, MPS_DS)) is None or still_there(ds),
    )
    assert _daemonset(kube, PLUGIN_DS) is not None
