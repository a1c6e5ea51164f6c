"""GPUs that pods get on a real node: ``gpu-operator agent device-plugin`` on simulated A100 x8
registers with the node's real kubelet, the real scheduler places GPU pods by the allocatable
it reports, and the container sees its two GPUs through NVIDIA_VISIBLE_DEVICES and through the
CDI spec containerd v2 injects; the exporter on the node labels those GPUs' metrics with the
pod, from the kubelet's PodResources API. The agents run as a process beside the node (in the node's
plugin and pod-resources directories) until the project's image can run them as the rendered
DaemonSets there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.agent.deviceplugin import cdi
from gpu_operator.agent.deviceplugin.agent import DevicePluginAgent, HealthOptions, Paths
from gpu_operator.agent.deviceplugin.config_file import parse_device_plugin_config
from gpu_operator.agent.nvml import Nvml
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml
from gpu_operator.testenv.processes import free_ports

from .support import NotYet, wait_for

pytestmark = pytest.mark.real_nodes

SHELL = testenv.binaries.node_image_name("shell")
GPU = "nvidia.com/gpu"


def _gpu_pod(name: str, node: str, count: int) -> dict[str, Any]:
    """Placed by the scheduler (nodeSelector, not nodeName), so too large a request waits."""
    script = (
        'echo "visible=$NVIDIA_VISIBLE_DEVICES"; env | grep ^NVIDIA_GPU_ | sort; echo end; '
        "sleep 3600"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "cuda",
                    "image": SHELL,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "resources": {"limits": {GPU: str(count)}},
                }
            ],
        },
    }


@pytest.fixture
def rkube(real_cluster: testenv.Cluster) -> Iterator[testenv.Clients]:
    """Clients for the real-node cluster, bound to a fresh namespace (deleted afterwards)."""
    with real_cluster.api_client() as api:
        kube = testenv.Clients.for_api(api, f"gpus-{uuid.uuid4().hex[:8]}")
        kube.core.create_namespace({"metadata": {"name": kube.namespace}})
        try:
            yield kube
        finally:
            kube.core.delete_namespace(kube.namespace)


def _wait_released(cluster: testenv.Cluster, node: str) -> None:
    """The kubelet has seen the plugin go (no GPU allocatable): a later plugin's "8" is then
    its own, not this one's, still in the node status."""
    with cluster.api_client() as api:
        core = testenv.Clients.for_api(api, "default").core

        def released() -> bool | NotYet:
            status = core.read_node(node).status
            got = (status.allocatable or {}).get(GPU)
            return got in (None, "0") or NotYet({GPU: got})

        wait_for(f"{node} to stop advertising {GPU}", released, timeout=90)


def _allocatable(kube: testenv.Clients, node: str) -> str | None:
    status = kube.core.read_node(node).status
    return (status.allocatable or {}).get(GPU)


def _output(kube: testenv.Clients, pod_name: str) -> list[str] | NotYet:
    """The lines the pod printed up to ``end`` once it runs; before, its phase or its lines."""
    pod = kube.core.read_namespaced_pod(pod_name, kube.namespace)
    if (phase := pod.status.phase if pod.status else None) != "Running":
        return NotYet({"phase": phase})
    lines = str(kube.core.read_namespaced_pod_log(pod_name, kube.namespace)).splitlines()
    return lines if "end" in lines else NotYet({"log": lines[-5:]})


@pytest.fixture(params=["envvar", "cdi-cri"])
def plugin_on_node(
    real_cluster: testenv.Cluster, request: pytest.FixtureRequest
) -> Iterator[tuple[str, list[str], str]]:
    """The agent serving the first real node's kubelet with one device list strategy; yields
    the node, its GPU UUIDs and the strategy."""
    planned = real_cluster.real.nodes[0]  # type: ignore[union-attr]
    node_dir = real_cluster.real_node_dir(planned.name)
    sim = install_simulated_nvml(planned.gpus, seed=planned.name)  # the UUIDs the agent will see
    uuids = [g.uuid for g in sim.gpus]
    uninstall_simulated_nvml()
    with tempfile.TemporaryDirectory(prefix="rn", dir="/tmp") as tmp:
        plugins = Path(tmp) / "dp"  # unix socket paths must stay short
        os.symlink(node_dir / "kubelet" / "device-plugins", plugins)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_OPERATOR_SIMULATE")}
        env |= {
            "NODE_NAME": planned.name,
            "GPU_OPERATOR_SIMULATE": planned.gpus,
            "KUBELET_SOCKET": str(plugins / "kubelet.sock"),
            "CDI_ROOT": str(node_dir / "cdi"),
            "DEVICE_LIST_STRATEGY": request.param,
        }
        for key in ("CONFIG_FILE", "CONFIG_FILE_SRCDIR", "MIG_STRATEGY", "KUBECONFIG"):
            env.pop(key, None)
        log = Path(tmp) / "agent.log"
        with log.open("w") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "gpu_operator", "agent", "device-plugin"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            yield planned.name, uuids, request.param
            assert agent.poll() is None, log.read_text()  # it served the whole test
        finally:
            agent.terminate()
            agent.wait(30)
            (node_dir / "cdi" / cdi.SPEC_FILE).unlink(missing_ok=True)
            _wait_released(real_cluster, planned.name)


def _exporter_holders(url: str, kube: testenv.Clients) -> set[tuple[str, str, str, str]] | NotYet:
    """(UUID, pod, namespace, container) of the GPU samples labelled with this test's pods;
    else why none (the exporter unreachable, the pods its samples name)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError as exc:
        return NotYet(f"{url}: {exc}")
    found = set()
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_GPU_TEMP{") and f'namespace="{kube.namespace}"' in line:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            found.add((labels["UUID"], labels["pod"], labels["namespace"], labels["container"]))
    return found or NotYet({"pods in its samples": sorted(set(re.findall(r'pod="([^"]*)"', text)))})


@pytest.fixture
def exporter_url(real_cluster: testenv.Cluster) -> Iterator[str]:
    """``gpu-operator agent exporter`` for the first real node, reading its kubelet's
    PodResources socket, on a free local port."""
    planned = real_cluster.real.nodes[0]  # type: ignore[union-attr]
    socket_path = real_cluster.real_node_dir(planned.name) / "kubelet" / "pod-resources"
    port = free_ports(1)[0]
    with tempfile.TemporaryDirectory(prefix="rx", dir="/tmp") as tmp:
        os.symlink(socket_path / "kubelet.sock", f"{tmp}/pr.sock")  # short socket path
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_OPERATOR_SIMULATE")}
        env |= {"NODE_NAME": planned.name, "GPU_OPERATOR_SIMULATE": planned.gpus}
        exporter = subprocess.Popen(
            [sys.executable, "-m", "gpu_operator", "agent", "exporter",
             "--address", f"127.0.0.1:{port}", "--interval-ms", "500",
             "--pod-resources-socket", f"{tmp}/pr.sock"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            yield f"http://127.0.0.1:{port}/metrics"
        finally:
            exporter.terminate()
            exporter.wait(30)


def test_pods_get_exactly_their_gpus_on_a_real_node(
    plugin_on_node: tuple[str, list[str], str], exporter_url: str, rkube: testenv.Clients
) -> None:
    node, uuids, strategy = plugin_on_node

    assert wait_for(
        f"{node} to advertise {GPU}",
        lambda: (got := _allocatable(rkube, node)) == "8" or NotYet({GPU: got}),
    )

    rkube.core.create_namespaced_pod(rkube.namespace, _gpu_pod("two", node, 2))
    rkube.core.create_namespaced_pod(rkube.namespace, _gpu_pod("nine", node, 9))

    output = wait_for("the 2-GPU pod's output", lambda: _output(rkube, "two"), timeout=120)
    visible, *cdi_env, _ = output
    if strategy == "envvar":  # the Allocate response's env
        gpus = visible.removeprefix("visible=").split(",")
        assert cdi_env == [], cdi_env
    else:  # through the CDI spec the agent wrote, injected by containerd (the CRI's CDI field)
        assert (
            visible == "visible=void"
        )  # NVIDIA's legacy hook is told to stay out, as nvidia-ctk does
        gpus = [line.split("=", 1)[1] for line in cdi_env]
    assert len(gpus) == 2 and len(set(gpus)) == 2, (visible, cdi_env)
    assert set(gpus) <= set(uuids), (gpus, uuids)

    # the exporter on that node attributes those two GPUs to the pod, from the real PodResources
    held = wait_for("the exporter's pod labels", lambda: _exporter_holders(exporter_url, rkube))
    assert held == {(uuid_, "two", rkube.namespace, "cuda") for uuid_ in gpus}

    def refused() -> str | NotYet:
        pod = rkube.core.read_namespaced_pod("nine", rkube.namespace)
        conditions = (pod.status.conditions if pod.status else None) or []
        for condition in conditions:
            if condition.type == "PodScheduled" and condition.status == "False":
                return str(condition.message)
        return NotYet({"conditions": [(c.type, c.status, c.reason) for c in conditions]})

    message = wait_for("the 9-GPU pod unschedulable", refused)
    assert f"Insufficient {GPU}" in message
    assert rkube.core.read_namespaced_pod("nine", rkube.namespace).spec.node_name is None


def test_an_xid_drops_allocatable_by_one_and_names_the_pod_holding_that_gpu(
    real_cluster: testenv.Cluster, rkube: testenv.Clients
) -> None:
    """The agent in this process (so NVML can be told of an XID) serving the real kubelet: the
    GPU turns Unhealthy, the kubelet's allocatable drops from 8 to 7, and the agent names the
    pod that holds it, from the kubelet's PodResources API."""
    planned = real_cluster.real.nodes[0]  # type: ignore[union-attr]
    node, node_dir = planned.name, real_cluster.real_node_dir(planned.name)
    reports: list[tuple[str, str, str]] = []
    sim = install_simulated_nvml(planned.gpus, seed=planned.name)
    try:
        with tempfile.TemporaryDirectory(prefix="rx", dir="/tmp") as tmp, Nvml() as nvml:
            os.symlink(node_dir / "kubelet" / "device-plugins", f"{tmp}/dp")
            os.symlink(node_dir / "kubelet" / "pod-resources" / "kubelet.sock", f"{tmp}/pr.sock")
            paths = Paths(
                Path(tmp) / "dp" / "kubelet.sock",
                node_dir / "cdi",
                Path(tmp) / "sys",
                pod_resources_socket=Path(tmp) / "pr.sock",
            )
            agent = DevicePluginAgent(
                nvml,
                paths=paths,
                health_options=HealthOptions(poll_s=0.1),
                report=lambda *event: reports.append(event),
            )
            agent.apply(parse_device_plugin_config("version: v1\n"))
            agent.start()
            try:
                wait_for(
                    f"{node} to advertise {GPU}",
                    lambda: (got := _allocatable(rkube, node)) == "8" or NotYet({GPU: got}),
                )
                rkube.core.create_namespaced_pod(rkube.namespace, _gpu_pod("one", node, 1))
                output = wait_for("the pod's GPU", lambda: _output(rkube, "one"), timeout=120)
                held = output[0].removeprefix("visible=")
                index = next(g.index for g in sim.gpus if g.uuid == held)

                sim.inject_xid(index, 79)  # fallen off the bus
                wait_for(
                    f"{node} allocatable 7",
                    lambda: (got := _allocatable(rkube, node)) == "7" or NotYet({GPU: got}),
                )
                (etype, reason, message), *_ = wait_for("the report", lambda: list(reports))
                assert (etype, reason) == ("Warning", "GPUUnhealthyInUse")
                assert f"XID 79 on GPU {index} ({held})" in message
                assert f"pod {rkube.namespace}/one container cuda" in message
            finally:
                agent.stop()
    finally:
        uninstall_simulated_nvml()
        _wait_released(real_cluster, node)
