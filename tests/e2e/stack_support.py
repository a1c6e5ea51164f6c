"""The operator reconciling a ClusterPolicy on the real nodes, and the checks made there: shared
by the real-node modules that reconcile a policy (test_real_stack.py: examples/
clusterpolicy.yaml; test_real_helm_default.py: NVIDIA's Helm-default policy), so each thing is
done one way."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.stream import stream

from gpu_operator import testenv
from gpu_operator.controller.runner import OperatorThread
from gpu_operator.kube import Kube
from tests.e2e.support import (
    NotYet,
    policy_status,
    service_account_config,
    start_operator,
    wait_for,
)
from tests.paths import REPO

NS = "gpu-operator"
POLICY = "cluster-policy"
# The DaemonSets with a pod on each real GPU node, whichever image each runs.
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
POD_LABEL = re.compile(r'pod="([^"]*)"')


@dataclass
class Stack:
    cluster: testenv.Cluster
    kube: Kube
    core: k8s.CoreV1Api
    operator: OperatorThread
    started: float


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


def project_images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The project's image and the stand-ins as archives (built once; a changed tree rebuilds
    them); a test fails, naming the build log, when they cannot be built."""
    log_path = tmp_path_factory.mktemp("images") / "build.log"
    with log_path.open("w") as log:
        try:
            return testenv.binaries.ensure_project_images(log)
        except testenv.binaries.BinariesError as exc:
            pytest.fail(f"the project's image could not be built: {exc} (log {log_path})")


@contextmanager
def real_stack(
    cluster: testenv.Cluster, policy: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The project's image and the SIMULATED stand-ins loaded into the real nodes (the first
    run builds them: minutes), the operator running as its ServiceAccount and ``policy``
    created. On exit the policy is deleted and its finalizer's work awaited: the operator's
    labels and taint off the nodes, the operands gone (the real-node modules share the nodes)."""
    assert policy["metadata"]["name"] == POLICY
    archives = project_images(tmp_path_factory)
    for archive in archives:
        cluster.load_image(archive)
    with cluster.api_client() as api:
        kube = Kube(api)
        operator = start_operator(service_account_config(cluster, NS, "gpu-operator"), NS)
        stack = Stack(cluster, kube, k8s.CoreV1Api(api), operator, time.monotonic())
        try:
            # A module before this one whose teardown timed out leaves its policy being deleted:
            # this operator finishes that deletion first (a create would be refused meanwhile).
            wait_for(
                f"the previous {POLICY} gone",
                lambda: (
                    (old := kube.get("ClusterPolicy", POLICY)) is None
                    or NotYet({"deletionTimestamp": old["metadata"].get("deletionTimestamp")})
                ),
                timeout=180,
            )
            kube.create(policy)
            yield stack
        finally:
            try:
                # A test that failed may leave its own pods behind; they are not the operator's
                # to remove, and would keep the next module's wait for "operands gone" waiting.
                for pod in kube.list_objects("Pod", NS):
                    if not pod["metadata"].get("ownerReferences"):
                        kube.delete("Pod", pod["metadata"]["name"], NS)
                kube.delete("ClusterPolicy", POLICY)
                wait_for(
                    "the operator's labels and taint off the real nodes",
                    lambda: not (left := _operator_left(kube, cluster.real_nodes)) or NotYet(left),
                    timeout=120,
                )
                wait_for(
                    "the operands gone",
                    lambda: not (pods := kube.list_objects("Pod", NS)) or NotYet(phases(pods)),
                    timeout=180,
                )
            finally:
                operator.stop()


def node_labels(kube: Kube, name: str) -> dict[str, str]:
    node = kube.get("Node", name) or {}
    return dict((node.get("metadata") or {}).get("labels") or {})


def pods_on(stack: Stack, app: str, node: str) -> list[dict[str, Any]]:
    """The operand pods of ``app`` (a DaemonSet's name) on ``node``."""
    return [
        p
        for p in stack.kube.list_objects("Pod", NS)
        if p["spec"].get("nodeName") == node and p["metadata"]["name"].startswith(app)
    ]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def phases(pods: list[dict[str, Any]]) -> dict[str, str | None]:
    """Each pod's phase by name: what a wait on pods reports when it times out."""
    return {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in pods}


def allocatable(stack: Stack, node: str) -> str | None:
    status = (stack.kube.get("Node", node) or {}).get("status") or {}
    value: str | None = status.get("allocatable", {}).get("nvidia.com/gpu")
    return value


def wait_advertising(stack: Stack, node: str, count: str = "8", timeout: float = 300) -> None:
    """Wait until ``node`` advertises ``count`` nvidia.com/gpu. A plugin that just restarted
    (after a MIG change, an MPS config, a driver upgrade) leaves the kubelet's allocatable at
    "0" until it registers again, and a pod admitted then is rejected: "0" is not ready."""
    wait_for(
        f"{node} advertising {count} nvidia.com/gpu",
        lambda: (got := allocatable(stack, node)) == count or NotYet(got),
        timeout=timeout,
    )


def diagnose(stack: Stack) -> str:
    """Why pods are not Ready: their phases, container states, their last Events (a pod the
    scheduler could not place, or whose claims could not be prepared, says so only there) and
    log tails. Pods bound to kwok nodes are left out (they have no logs, and are Ready)."""
    lines = []
    for pod in stack.kube.list_objects("Pod", NS):
        node = pod["spec"].get("nodeName")
        if (node and node not in stack.cluster.real_nodes) or ready(pod):
            continue
        name = pod["metadata"]["name"]
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        states = [json.dumps(s.get("state")) for s in statuses]
        lines.append(f"{name} on {node} {pod['status'].get('phase')}: {'; '.join(states)}")
        about = f"involvedObject.kind=Pod,involvedObject.name={name}"
        for event in stack.kube.list_objects("Event", NS, field_selector=about)[-6:]:
            lines.append(f"  event {event.get('reason')}: {event.get('message')}")
        if not node:
            continue
        # An init container that failed (a crash loop holds the pod in PodInitializing) says
        # why in its last run's log; the main containers have none yet.
        init = (pod.get("status") or {}).get("initContainerStatuses") or []
        failed = [s["name"] for s in init if (s.get("lastState") or {}).get("terminated")]
        wanted = [(n, True) for n in failed]
        wanted += [(c["name"], False) for c in pod["spec"]["containers"]]
        for container, previous in wanted:
            try:
                tail = stack.core.read_namespaced_pod_log(
                    name, NS, container=container, tail_lines=8, previous=previous
                )
            except k8s.ApiException as exc:
                tail = f"(no log: {exc.reason})"
            lines.append(f"  {container}{' (last run)' if previous else ''}: {tail}")
    return "\n".join(lines)


def pod_exec(stack: Stack, pod: str, container: str, command: list[str]) -> str:
    out: str = stream(
        stack.core.connect_get_namespaced_pod_exec, pod, NS, container=container,
        command=command, stderr=True, stdin=False, stdout=True, tty=False,
    )  # fmt: skip
    return out


def gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
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


def wait_all_operands_ready(stack: Stack) -> float:
    """Every DaemonSet of ON_EACH_REAL_NODE with its pods Ready (through the pods' own probes)
    on every real node; the seconds since the policy was created."""

    def all_ready() -> bool | NotYet:
        for ds in ON_EACH_REAL_NODE:
            for node in stack.cluster.real_nodes:
                pods = pods_on(stack, ds, node)
                if not pods or not all(ready(p) for p in pods):
                    return NotYet(f"{ds} on {node} not Ready: {phases(pods)}")
        return True

    try:
        wait_for("every operand Ready on both real nodes", all_ready, timeout=420)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(stack)}") from None
    return time.monotonic() - stack.started


def check_discovery_labels(stack: Stack) -> None:
    """Feature discovery, in its container, labels each real node with its simulated GPUs; the
    device plugin, in its own, registers with the real kubelet: the node advertises them."""

    def labelled(name: str) -> dict[str, str] | NotYet:
        labels = node_labels(stack.kube, name)
        return labels if labels.get("nvidia.com/gpu.product") else NotYet(labels)

    for planned in stack.cluster.real.nodes:  # type: ignore[union-attr]
        labels = wait_for(
            f"{planned.name} labelled by discovery",
            lambda n=planned.name: labelled(n),
            timeout=300,
        )
        assert labels["nvidia.com/gpu.product"] == PRODUCTS[planned.gpus]
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/mig.capable"] == "true"
        wait_advertising(stack, planned.name)


def exporter_metrics(stack: Stack, pod: str) -> str:
    """The exporter's /metrics, fetched from inside its container (python3: both images have
    it, the stand-in being built FROM the project's)."""
    fetch = [
        "python3", "-c",
        "import urllib.request; print(urllib.request.urlopen("
        "'http://127.0.0.1:9400/metrics', timeout=10).read().decode())",
    ]  # fmt: skip
    return pod_exec(stack, pod, "nvidia-dcgm-exporter", fetch)


def check_exporter_names_the_gpu_pod(stack: Stack, node: str) -> list[str]:
    """A pod gets a GPU from the device plugin through the real kubelet; the exporter on that
    node reads the kubelet's PodResources socket and labels the GPU's series with the pod.
    Returns those series. It starts from a settled stack (every operand Ready), whatever ran
    before it in the module."""
    wait_all_operands_ready(stack)
    wait_advertising(stack, node)

    def gpu_user_ready() -> bool | NotYet:
        pod = stack.kube.get("Pod", "gpu-user", NS) or {}
        return ready(pod) or NotYet(pod.get("status"))

    def exporters_ready() -> list[dict[str, Any]] | NotYet:
        pods = pods_on(stack, "nvidia-dcgm-exporter", node)
        return [p for p in pods if ready(p)] or NotYet(phases(pods))

    def pod_series(exporter: str) -> list[str] | NotYet:
        text = exporter_metrics(stack, exporter)
        series = [line for line in text.splitlines() if 'pod="gpu-user"' in line]
        return series or NotYet({"pods in its series": sorted(set(POD_LABEL.findall(text)))})

    stack.kube.create(gpu_pod("gpu-user", node, 1))
    try:
        try:
            wait_for("gpu-user Running", gpu_user_ready)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnose(stack)}") from None
        exporter = wait_for("the exporter Ready", exporters_ready, timeout=300)[0]
        series = wait_for(
            "a series labelled with pod gpu-user",
            lambda: pod_series(exporter["metadata"]["name"]),
            timeout=120,
        )
        assert any(f'namespace="{NS}"' in s and 'container="main"' in s for s in series), series
        return series
    finally:
        stack.kube.delete("Pod", "gpu-user", NS)


def check_mig_reconfiguration(stack: Stack, node: str) -> None:
    """The MIG manager in its container changes ``node``'s layout (an A100 40GB's) to
    all-1g.5gb through the node's shared simulated NVML state, pausing the operands: discovery
    and the device plugin, in their own containers, see the MIG devices. MIG is disabled again
    at the end."""
    seen: list[dict[str, str]] = []

    def state() -> str | None:
        labels = node_labels(stack.kube, node)
        seen.append(labels)
        return labels.get("nvidia.com/mig.config.state")

    def applied_after_pause() -> bool | NotYet:
        now = state()
        paused = any(s.get("nvidia.com/mig.config.state") == "pending" for s in seen)
        if now == "success" and paused:
            return True
        return NotYet({"nvidia.com/mig.config.state": now, "pending seen": paused})

    def mig_product() -> dict[str, str] | NotYet:
        labels = node_labels(stack.kube, node)
        product = labels.get("nvidia.com/gpu.product", "")
        if product.endswith("-MIG-1g.5gb"):
            return labels
        return NotYet({"nvidia.com/gpu.product": product})

    def mig_disabled() -> bool | NotYet:
        labels = node_labels(stack.kube, node)
        got = {k: labels.get(k) for k in ("nvidia.com/gpu.count", "nvidia.com/mig.config.state")}
        want = {"nvidia.com/gpu.count": "8", "nvidia.com/mig.config.state": "success"}
        return got == want or NotYet(got)

    stack.kube.merge_patch(
        "Node", node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.5gb"}}}
    )
    try:
        wait_for("the new layout applied after a pause", applied_after_pause, timeout=300)
        paused = [s for s in seen if s.get("nvidia.com/mig.config.state") == "pending"]
        assert any(
            s.get("nvidia.com/gpu.deploy.device-plugin") == "paused-for-mig-change" for s in paused
        )
        labels = wait_for(
            "discovery in its container sees the MIG devices", mig_product, timeout=300
        )
        assert labels["nvidia.com/gpu.count"] == "56"
        wait_advertising(stack, node, "56")
    finally:
        stack.kube.merge_patch(
            "Node", node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-disabled"}}}
        )
        wait_for("MIG disabled again", mig_disabled, timeout=300)
        wait_advertising(stack, node)  # the plugin back: the next test can admit a GPU pod


# The simulated driver is laid out in a second, not compiled for minutes: its startupProbe need
# not wait NVIDIA's 60 s before the first try (every driver pod start on a real node did).
SIMULATED_DRIVER_STARTUP_PROBE = {"initialDelaySeconds": 2, "periodSeconds": 2}


def example_policy() -> dict[str, Any]:
    """The example, with GPU health remediation on (short delays): every real-stack test also
    shows that MIG changes, MPS and driver upgrades raise no false quarantine."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
    doc["spec"]["driver"]["startupProbe"] = SIMULATED_DRIVER_STARTUP_PROBE
    doc["spec"]["healthRemediation"] = {
        "enabled": True,
        "maxUnavailable": 1,
        "recoveryDelay": "5s",
        "signals": {"quietPeriod": "3s"},
    }
    return doc


def sandbox_policy() -> dict[str, Any]:
    """The example with GPUs for virtual machines on: the VFIO manager and KubeVirt's device
    plugin (with the sandbox validator, from the validator section) on vm-passthrough nodes."""
    doc = example_policy()
    doc["spec"]["sandboxWorkloads"] = {"enabled": True}
    doc["spec"]["vfioManager"] = {"enabled": True}
    doc["spec"]["sandboxDevicePlugin"] = {"enabled": True}
    return doc


def drivers_ready(stack: Stack) -> bool | NotYet:
    """One Ready driver pod on each real node."""
    for n in stack.cluster.real_nodes:
        pods = pods_on(stack, "nvidia-driver-daemonset", n)
        if len([p for p in pods if ready(p)]) != 1:
            return NotYet({n: phases(pods)})
    return True


def driver_pod(stack: Stack, node: str) -> dict[str, Any] | None:
    """``node``'s one driver pod that is not going away, if there is exactly one."""
    pods = [
        p
        for p in pods_on(stack, "nvidia-driver-daemonset", node)
        if not p["metadata"].get("deletionTimestamp")
    ]
    return pods[0] if len(pods) == 1 else None


def on_version(stack: Stack, node: str, version: str) -> bool | NotYet:
    """``node``'s driver pod Ready on ``version`` and the node in service."""
    pod = driver_pod(stack, node)
    spec = (stack.kube.get("Node", node) or {}).get("spec") or {}
    image = pod["spec"]["containers"][0]["image"] if pod else None
    if pod and ready(pod) and version in str(image) and not spec.get("unschedulable"):
        return True
    return NotYet(
        {"image": image, "ready": bool(pod and ready(pod)), "cordoned": spec.get("unschedulable")}
    )


def rollout_in(stack: Stack, phase: str) -> dict[str, Any] | NotYet:
    """The driver rollout's status once it is in ``phase``."""
    rollout = (policy_status(stack.kube, POLICY).get("upgrade") or {}).get("rollout") or {}
    return rollout if rollout.get("phase") == phase else NotYet(rollout)
