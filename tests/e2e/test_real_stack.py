"""The stack in real containers on real kubelets: the project's image built from its Dockerfile
(`make image`) and the SIMULATED stand-ins for NVIDIA's images (`make standins`) loaded into the
real nodes, the operator reconciling examples/clusterpolicy.yaml (the project's defaults, whose
agents run the project's image; NVIDIA's Helm defaults name NVIDIA's agent images, which have
no stand-ins yet). Every agent runs from the rendered DaemonSet (its probes, hostPaths,
securityContext, ServiceAccount token, the `nvidia` RuntimeClass): discovery labels its node
from inside its container, the validator's readiness probe passes only once its checks have,
the exporter reads the kubelet's real PodResources socket, and a driver upgrade evicts, restarts
and validates for real."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.stream import stream

from gpu_operator import testenv
from gpu_operator.controller.runner import OperatorThread
from gpu_operator.kube import Kube
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.testenv.standins import UPGRADE_DRIVER_VERSION
from tests.e2e.support import (
    audit_writes,
    policy_status,
    service_account_config,
    start_operator,
    wait_for,
)
from tests.paths import REPO

# The first run builds the image and the stand-ins (minutes; a changed tree rebuilds them).
pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]

NS = "gpu-operator"
POLICY = "cluster-policy"
OPERATOR_USER = f"system:serviceaccount:{NS}:gpu-operator"
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
# The agents the project's own image runs, and the stand-ins' operands, on each real node.
ON_EACH_REAL_NODE = (
    "nvidia-driver-daemonset-ubuntu22.04",
    "nvidia-container-toolkit-daemonset",
    "nvidia-device-plugin-daemonset",
    "nvidia-operator-validator",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-mig-manager",
)
PRODUCTS = {"a100-40gb:8": "NVIDIA-A100-SXM4-40GB", "h100-80gb:8": "NVIDIA-H100-80GB-HBM3"}


@dataclass
class Stack:
    cluster: testenv.Cluster
    kube: Kube
    core: k8s.CoreV1Api
    operator: OperatorThread
    started: float


def _example_policy() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
    return doc


def _real_labels(kube: Kube, name: str) -> dict[str, str]:
    node = kube.get("Node", name) or {}
    return dict((node.get("metadata") or {}).get("labels") or {})


def _operator_left(kube: Kube, names: list[str]) -> list[str]:
    """What the operator still has on the real nodes (labels it owns, its taint)."""
    left = []
    for name in names:
        node = kube.get("Node", name) or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        left += [f"{name}:{k}" for k in labels if k.startswith("nvidia.com/gpu.deploy.")]
        taints = (node.get("spec") or {}).get("taints") or []
        left += [f"{name}:taint" for t in taints if t.get("key") == "nvidia.com/gpu"]
    return left


@pytest.fixture(scope="module")
def stack(
    real_cluster: testenv.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log_path = tmp_path_factory.mktemp("images") / "build.log"
    with log_path.open("w") as log:
        try:
            archives = testenv.binaries.ensure_project_images(log)
        except testenv.binaries.BinariesError as exc:
            pytest.fail(f"the project's image could not be built: {exc} (log {log_path})")
    for archive in archives:
        real_cluster.load_image(archive)
    policy = _example_policy()
    with real_cluster.api_client() as api:
        kube = Kube(api)
        operator = start_operator(service_account_config(real_cluster, NS, "gpu-operator"), NS)
        stack = Stack(real_cluster, kube, k8s.CoreV1Api(api), operator, time.monotonic())
        try:
            kube.create(policy)
            yield stack
        finally:
            try:
                kube.delete("ClusterPolicy", POLICY)
                # The finalizer takes the operator's labels and taint off every node: the other
                # real-node tests share these nodes.
                wait_for(
                    "the operator's labels and taint off the real nodes",
                    lambda: not _operator_left(kube, real_cluster.real_nodes),
                    timeout=120,
                )
                wait_for(
                    "the operands gone",
                    lambda: not kube.list_objects("Pod", NS),
                    timeout=180,
                )
            finally:
                operator.stop()


def _pods(stack: Stack, app: str, node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in stack.kube.list_objects("Pod", NS)
        if p["spec"].get("nodeName") == node and p["metadata"]["name"].startswith(app)
    ]


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _diagnose(stack: Stack) -> str:
    """Why pods are not Ready: their phases, container states and log tails."""
    lines = []
    for pod in stack.kube.list_objects("Pod", NS):
        if pod["spec"].get("nodeName") not in stack.cluster.real_nodes or _ready(pod):
            continue
        name = pod["metadata"]["name"]
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        states = [json.dumps(s.get("state")) for s in statuses]
        lines.append(f"{name} {pod['status'].get('phase')}: {'; '.join(states)}")
        for c in pod["spec"]["containers"]:
            try:
                tail = stack.core.read_namespaced_pod_log(
                    name, NS, container=c["name"], tail_lines=8
                )
            except k8s.ApiException as exc:
                tail = f"(no log: {exc.reason})"
            lines.append(f"  {c['name']}: {tail}")
    return "\n".join(lines)


def test_every_operand_is_ready_on_the_real_nodes_through_its_real_probes(stack: Stack) -> None:
    nodes = stack.cluster.real_nodes

    def all_ready() -> bool:
        return all(
            (pods := _pods(stack, ds, node)) and all(_ready(p) for p in pods)
            for ds in ON_EACH_REAL_NODE
            for node in nodes
        )

    try:
        wait_for("every operand Ready on both real nodes", all_ready, timeout=420)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(stack)}") from None
    print(f"\nreal stack: every operand Ready in {time.monotonic() - stack.started:.0f}s")
    status = wait_for(
        "ClusterPolicy ready",
        lambda: (s := policy_status(stack.kube, POLICY)).get("state") == "ready" and s,
        timeout=180,
    )
    assert status["namespace"] == NS
    # The driver stand-in says what it is.
    driver = _pods(stack, "nvidia-driver-daemonset", nodes[0])[0]
    log = stack.core.read_namespaced_pod_log(driver["metadata"]["name"], NS)
    assert log.startswith("SIMULATED: NVIDIA driver stand-in"), log


def test_discovery_labels_each_real_node_from_inside_its_container(stack: Stack) -> None:
    for planned in stack.cluster.real.nodes:  # type: ignore[union-attr]
        labels = wait_for(
            f"{planned.name} labelled by discovery",
            lambda n=planned.name: (
                (got := _real_labels(stack.kube, n)).get("nvidia.com/gpu.product") and got
            ),
            timeout=300,
        )
        assert labels["nvidia.com/gpu.product"] == PRODUCTS[planned.gpus]
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/mig.capable"] == "true"
        # The device plugin (the project's agent in the stand-in image) registers with the
        # real kubelet, in its own time: the node comes to advertise the GPUs.
        wait_for(
            f"{planned.name} advertising 8 GPUs",
            lambda n=planned.name: _allocatable(stack, n) == "8",
            timeout=300,
        )


def _exec(stack: Stack, pod: str, container: str, command: list[str]) -> str:
    out: str = stream(
        stack.core.connect_get_namespaced_pod_exec, pod, NS, container=container,
        command=command, stderr=True, stdin=False, stdout=True, tty=False,
    )  # fmt: skip
    return out


def _gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod on ``node`` asking the device plugin for ``gpus`` nvidia.com/gpu."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": testenv.binaries.node_image_name("shell"),
                    "imagePullPolicy": "Never",
                    "command": [
                        "sh",
                        "-c",
                        "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; sleep 3600",
                    ],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def _allocatable(stack: Stack, node: str) -> str | None:
    status = (stack.kube.get("Node", node) or {}).get("status") or {}
    value: str | None = status.get("allocatable", {}).get("nvidia.com/gpu")
    return value


def test_exporter_serves_metrics_naming_the_pod_that_holds_a_gpu(stack: Stack) -> None:
    """A pod gets a GPU from the device plugin through the real kubelet; the exporter on that
    node reads the kubelet's PodResources socket and labels the GPU's series with the pod."""
    node = stack.cluster.real_nodes[0]
    pod = _gpu_pod("gpu-user", node, 1)
    wait_for(f"{node} advertising nvidia.com/gpu", lambda: _allocatable(stack, node), timeout=300)
    stack.kube.create(pod)
    try:
        wait_for("gpu-user Running", lambda: _ready(stack.kube.get("Pod", "gpu-user", NS) or {}))
        exporter = wait_for(
            "the exporter Ready",
            lambda: [p for p in _pods(stack, "nvidia-dcgm-exporter", node) if _ready(p)],
            timeout=300,
        )[0]["metadata"]["name"]
        fetch = [
            "python3", "-c",
            "import urllib.request; print(urllib.request.urlopen("
            "'http://127.0.0.1:9400/metrics', timeout=10).read().decode())",
        ]  # fmt: skip

        def pod_series() -> list[str]:
            text = _exec(stack, exporter, "nvidia-dcgm-exporter", fetch)
            return [line for line in text.splitlines() if 'pod="gpu-user"' in line]

        series = wait_for("a series labelled with pod gpu-user", pod_series, timeout=120)
        assert any(f'namespace="{NS}"' in s and 'container="main"' in s for s in series), series
    finally:
        stack.kube.delete("Pod", "gpu-user", NS)


def test_agents_run_as_rendered(stack: Stack) -> None:
    """The pods are the rendered ones: the `nvidia` RuntimeClass, the project's image for the
    agents, the stand-ins' names for NVIDIA's, and tokens from their own ServiceAccounts."""
    node = stack.cluster.real_nodes[1]

    def one_pod(ds: str) -> dict[str, Any] | None:
        """The node's pod of ``ds`` once there is exactly one (none yet, or a rollout, waits)."""
        pods = _pods(stack, ds, node)
        return pods[0] if len(pods) == 1 else None

    for ds in ("gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-operator-validator"):
        pod = wait_for(f"one {ds} pod on {node}", lambda ds=ds: one_pod(ds), timeout=300)
        assert pod["spec"]["runtimeClassName"] == "nvidia"
        assert pod["spec"]["containers"][0]["image"] == DEFAULT_OPERATOR_IMAGE
    plugin = wait_for("one device plugin pod", lambda: one_pod("nvidia-device-plugin-daemonset"))
    assert plugin["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"


def test_mig_reconfiguration_on_a_real_node_pauses_and_resumes_the_operands(
    stack: Stack,
) -> None:
    """The MIG manager in its container changes the layout through the node's shared simulated
    NVML state: discovery and the device plugin, in their own containers, see the MIG devices."""
    node = stack.cluster.real_nodes[0]  # A100 40GB x8
    seen: list[dict[str, str]] = []

    def state() -> str | None:
        labels = _real_labels(stack.kube, node)
        seen.append(labels)
        return labels.get("nvidia.com/mig.config.state")

    stack.kube.merge_patch(
        "Node", node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.5gb"}}}
    )
    try:
        wait_for(
            "the new layout applied after a pause",
            lambda: (
                state() == "success"
                and any(s.get("nvidia.com/mig.config.state") == "pending" for s in seen)
            ),
            timeout=300,
        )
        paused = [s for s in seen if s.get("nvidia.com/mig.config.state") == "pending"]
        assert any(
            s.get("nvidia.com/gpu.deploy.device-plugin") == "paused-for-mig-change" for s in paused
        )
        labels = wait_for(
            "discovery in its container sees the MIG devices",
            lambda: (
                (got := _real_labels(stack.kube, node))
                .get("nvidia.com/gpu.product", "")
                .endswith("-MIG-1g.5gb")
                and got
            ),
            timeout=300,
        )
        assert labels["nvidia.com/gpu.count"] == "56"
        wait_for(
            "the device plugin in its container advertises 56 MIG GPUs",
            lambda: _allocatable(stack, node) == "56",
            timeout=300,
        )
    finally:
        stack.kube.merge_patch(
            "Node", node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-disabled"}}}
        )
        wait_for(
            "MIG disabled again",
            lambda: (
                _real_labels(stack.kube, node).get("nvidia.com/gpu.count") == "8"
                and _real_labels(stack.kube, node).get("nvidia.com/mig.config.state") == "success"
            ),
            timeout=300,
        )


MPS_CONFIGS = {
    "default": "version: v1\n",
    "mps": (
        "version: v1\nsharing:\n  mps:\n    failRequestsGreaterThanOne: true\n"
        "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    ),
}


def test_mps_on_a_real_node_runs_the_control_daemon_and_shares_each_gpu_four_ways(
    stack: Stack,
) -> None:
    """The node label picks an MPS config: discovery in its container labels the node
    mps.capable, so the control daemon's DaemonSet schedules there and runs (simulated, from the
    project's image); the plugin then advertises 4 replicas per GPU and refuses a 2-replica
    request through the real kubelet, naming failRequestsGreaterThanOne. Everything is put back
    (the other tests share these nodes and this policy)."""
    node = stack.cluster.real_nodes[1]
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "dp-configs", "namespace": NS}, "data": MPS_CONFIGS}  # fmt: skip
    stack.kube.apply(config)
    # The project's image runs the plugin (its agent follows the label itself) and provides the
    # simulated MPS control daemon; NVIDIA's would need its config-manager, which has no stand-in.
    repository, _, tagged = DEFAULT_OPERATOR_IMAGE.rpartition("/")
    image, _, version = tagged.partition(":")
    device_plugin = {
        "repository": repository,
        "image": image,
        "version": version,
        "config": {"name": "dp-configs", "default": "default"},
    }
    stack.kube.merge_patch("ClusterPolicy", POLICY, {"spec": {"devicePlugin": device_plugin}})
    stack.kube.merge_patch(
        "Node", node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "mps"}}}
    )
    try:
        wait_for(
            f"{node} labelled mps.capable by discovery",
            lambda: _real_labels(stack.kube, node).get("nvidia.com/mps.capable") == "true",
            timeout=300,
        )
        daemon = wait_for(
            "the MPS control daemon Ready on the node",
            lambda: [
                p for p in _pods(stack, "nvidia-device-plugin-mps-control-daemon", node)
                if _ready(p)
            ],
            timeout=300,
        )[0]  # fmt: skip
        assert daemon["metadata"]["labels"]["app"] == "nvidia-device-plugin-mps-control-daemon"
        # Ready as soon as it runs (NVIDIA's daemon has no probe either); it logs once laid out.
        wait_for(
            "the daemon saying it is the simulated one, for nvidia.com/gpu",
            lambda: (
                "SIMULATED MPS control daemon for nvidia.com/gpu"
                in stack.core.read_namespaced_pod_log(daemon["metadata"]["name"], NS)
            ),
            timeout=120,
        )
        other = stack.cluster.real_nodes[0]  # its config is not MPS: no daemon there
        assert not _pods(stack, "nvidia-device-plugin-mps-control-daemon", other)
        wait_for("32 MPS replicas advertised", lambda: _allocatable(stack, node) == "32", 300)
        stack.kube.create(_gpu_pod("two-replicas", node, 2))
        refused = wait_for(
            "the 2-replica pod refused at admission",
            lambda: (
                (s := (stack.kube.get("Pod", "two-replicas", NS) or {}).get("status") or {})
                .get("phase") == "Failed" and s
            ),
            timeout=120,
        )  # fmt: skip
        assert refused.get("reason") == "UnexpectedAdmissionError", refused
        assert "failRequestsGreaterThanOne" in refused.get("message", ""), refused
    finally:
        stack.kube.delete("Pod", "two-replicas", NS)
        stack.kube.merge_patch(
            "Node", node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": None}}}
        )
        stack.kube.merge_patch(
            "ClusterPolicy", POLICY, {"spec": {"devicePlugin": dict.fromkeys(device_plugin)}}
        )
        stack.kube.delete("ConfigMap", "dp-configs", NS)
        wait_for(
            "8 whole GPUs advertised again, no MPS",
            lambda: (
                _allocatable(stack, node) == "8"
                and _real_labels(stack.kube, node).get("nvidia.com/mps.capable") == "false"
            ),
            timeout=300,
        )
        wait_for(
            "the device plugin back on NVIDIA's image (its stand-in), one Ready pod per node",
            lambda: all(
                len(pods := _pods(stack, "nvidia-device-plugin-daemonset", n)) == 1
                and pods[0]["spec"]["containers"][0]["image"] != DEFAULT_OPERATOR_IMAGE
                and _ready(pods[0])
                for n in stack.cluster.real_nodes
            ),
            timeout=300,
        )


def test_a_driver_upgrade_rolls_across_the_real_nodes(stack: Stack) -> None:
    """A new driver version (the stand-in's other tag): node by node, cordoned, its GPU pod
    evicted through the real eviction API, its driver pod replaced by one of the new image (the
    real kubelet starts it through its init container and startup probe), validated and
    uncordoned; never more than maxParallelUpgrades (2) nodes cordoned at once."""
    nodes = stack.cluster.real_nodes
    policy = stack.kube.get("ClusterPolicy", POLICY) or {}
    current = policy["spec"]["driver"]["version"]
    first = _example_policy()["spec"]["driver"]["version"]
    target = UPGRADE_DRIVER_VERSION if current != UPGRADE_DRIVER_VERSION else first

    def driver(node: str) -> dict[str, Any] | None:
        pods = [p for p in _pods(stack, "nvidia-driver-daemonset", node) if _ready(p)]
        return pods[0] if len(pods) == 1 else None

    wait_for("a Ready driver on each real node", lambda: all(map(driver, nodes)), timeout=420)
    before = {n: driver(n)["metadata"]["uid"] for n in nodes}  # type: ignore[index]
    node = nodes[0]
    wait_for(f"{node} advertising nvidia.com/gpu", lambda: _allocatable(stack, node), timeout=300)
    stack.kube.create(_gpu_pod("gpu-job", node, 1))
    wait_for("gpu-job Running", lambda: _ready(stack.kube.get("Pod", "gpu-job", NS) or {}))
    since = datetime.now(UTC)
    # Two at a time (of the 3 GPU nodes: the real two and the kwok one), to keep the test short;
    # one at a time is what the kwok upgrade e2e (test_upgrade.py) holds to on 8 nodes.
    upgrade_policy = {"maxParallelUpgrades": 2, "maxUnavailable": "100%"}
    stack.kube.merge_patch(
        "ClusterPolicy",
        POLICY,
        {"spec": {"driver": {"version": target, "upgradePolicy": upgrade_policy}}},
    )
    unavailable: list[int] = []

    def upgraded(name: str) -> bool:
        pod = driver(name)
        state = _real_labels(stack.kube, name).get(UPGRADE_STATE, "")
        spec = (stack.kube.get("Node", name) or {}).get("spec") or {}
        return bool(
            pod
            and pod["metadata"]["uid"] != before[name]
            and target in pod["spec"]["containers"][0]["image"]
            and state == "upgrade-done"
            and not spec.get("unschedulable")
        )

    def done() -> bool:
        cordoned = [n for n in stack.kube.list_objects("Node") if n["spec"].get("unschedulable")]
        unavailable.append(len(cordoned))
        return all(upgraded(n) for n in nodes)

    try:
        wait_for(f"driver {target} on every real node", done, timeout=600, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(stack)}") from None
    finally:
        stack.kube.delete("Pod", "gpu-job", NS)
    assert 1 <= max(unavailable) <= 2, f"cordoned nodes per sample: {sorted(set(unavailable))}"
    evictions = [
        e
        for e in audit_writes(stack.cluster, OPERATOR_USER, since)
        if (e.get("objectRef") or {}).get("subresource") == "eviction"
        and e["objectRef"].get("name") == "gpu-job"
    ]
    assert evictions, "the GPU pod was not evicted through the eviction API"
    wait_for("ClusterPolicy ready again", lambda: policy_status(stack.kube, POLICY).get(
        "state") == "ready", timeout=300)  # fmt: skip
