"""The stack in real containers on real kubelets: the project's image built from its Dockerfile
(`make image`) and the SIMULATED stand-ins for NVIDIA's images (`make standins`) loaded into the
real nodes, the operator reconciling examples/clusterpolicy.yaml (the project's defaults, whose
agents run the project's image; test_real_helm_default.py reconciles NVIDIA's Helm-default
policy, whose agents are NVIDIA's images). Every agent runs from the rendered DaemonSet (its
probes, hostPaths, securityContext, ServiceAccount token, the `nvidia` RuntimeClass): discovery
labels its node from inside its container, the validator's readiness probe passes only once its
checks have, the exporter reads the kubelet's real PodResources socket, and a driver upgrade
evicts, restarts and validates for real."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.labels import GPU_PRESENT
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.testenv.standins import UPGRADE_DRIVER_VERSION
from tests.e2e.stack_support import (
    NS,
    POLICY,
    Stack,
    allocatable,
    check_discovery_labels,
    check_exporter_names_the_gpu_pod,
    check_mig_reconfiguration,
    diagnose,
    example_policy,
    gpu_pod,
    node_labels,
    phases,
    pods_on,
    ready,
    real_stack,
    rollout_in,
    wait_advertising,
    wait_all_operands_ready,
)
from tests.e2e.support import OPERATOR_USER, NotYet, audit_writes, policy_ready, wait_for

# The first run builds the image and the stand-ins (minutes; a changed tree rebuilds them).
pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]

UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"


@pytest.fixture(scope="module")
def stack(
    real_cluster: testenv.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with real_stack(real_cluster, example_policy(), tmp_path_factory) as running:
        yield running


def test_every_operand_is_ready_on_the_real_nodes_through_its_real_probes(stack: Stack) -> None:
    nodes = stack.cluster.real_nodes
    print(f"\nreal stack: every operand Ready in {wait_all_operands_ready(stack):.0f}s")

    status = wait_for("ClusterPolicy ready", lambda: policy_ready(stack.kube, POLICY), timeout=180)
    assert status["namespace"] == NS
    # The driver stand-in says what it is.
    driver = pods_on(stack, "nvidia-driver-daemonset", nodes[0])[0]
    log = stack.core.read_namespaced_pod_log(driver["metadata"]["name"], NS)
    assert log.startswith("SIMULATED: NVIDIA driver stand-in"), log


def test_discovery_labels_each_real_node_from_inside_its_container(stack: Stack) -> None:
    check_discovery_labels(stack)


def test_exporter_serves_metrics_naming_the_pod_that_holds_a_gpu(stack: Stack) -> None:
    check_exporter_names_the_gpu_pod(stack, stack.cluster.real_nodes[0])


def test_agents_run_as_rendered(stack: Stack) -> None:
    """The pods are the rendered ones: no RuntimeClass for the project's image (its agents load the
    driver themselves), the `nvidia` one for NVIDIA's images, the project's image for the
    agents, the stand-ins' names for NVIDIA's, and tokens from their own ServiceAccounts."""
    node = stack.cluster.real_nodes[1]

    def one_pod(ds: str) -> dict[str, Any] | NotYet:
        """The node's pod of ``ds`` once there is exactly one (none yet, or a rollout, waits)."""
        pods = pods_on(stack, ds, node)
        return pods[0] if len(pods) == 1 else NotYet(phases(pods))

    for ds in ("gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-operator-validator"):
        pod = wait_for(f"one {ds} pod on {node}", lambda ds=ds: one_pod(ds), timeout=300)
        # The project's agents load the driver by path from the root they mount: no runtime
        assert "runtimeClassName" not in pod["spec"]
        assert pod["spec"]["containers"][0]["image"] == DEFAULT_OPERATOR_IMAGE
    plugin = wait_for("one device plugin pod", lambda: one_pod("nvidia-device-plugin-daemonset"))
    assert plugin["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"


def test_mig_reconfiguration_on_a_real_node_pauses_and_resumes_the_operands(
    stack: Stack,
) -> None:
    check_mig_reconfiguration(stack, stack.cluster.real_nodes[0])  # A100 40GB x8


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

    def daemons_ready() -> list[dict[str, Any]] | NotYet:
        pods = pods_on(stack, "nvidia-device-plugin-mps-control-daemon", node)
        return [p for p in pods if ready(p)] or NotYet(phases(pods))

    def refused_at_admission() -> dict[str, Any] | NotYet:
        status = (stack.kube.get("Pod", "two-replicas", NS) or {}).get("status") or {}
        if status.get("phase") == "Failed":
            return status
        return NotYet({k: status.get(k) for k in ("phase", "reason", "message")})

    def whole_gpus_again() -> bool | NotYet:
        if (got := allocatable(stack, node)) != "8":
            return NotYet({"nvidia.com/gpu": got})
        mps = node_labels(stack.kube, node).get("nvidia.com/mps.capable")
        return mps == "false" or NotYet({"nvidia.com/mps.capable": mps})

    def plugin_back() -> bool | NotYet:
        for n in stack.cluster.real_nodes:
            pods = pods_on(stack, "nvidia-device-plugin-daemonset", n)
            if not (
                len(pods) == 1
                and pods[0]["spec"]["containers"][0]["image"] != DEFAULT_OPERATOR_IMAGE
                and ready(pods[0])
            ):
                images = {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in pods}
                return NotYet({n: {"phases": phases(pods), "images": images}})
        return True

    stack.kube.merge_patch(
        "Node", node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "mps"}}}
    )
    try:
        wait_for(
            f"{node} labelled mps.capable by discovery",
            lambda: (
                (got := node_labels(stack.kube, node).get("nvidia.com/mps.capable")) == "true"
                or NotYet({"nvidia.com/mps.capable": got})
            ),
            timeout=300,
        )
        daemon = wait_for("the MPS control daemon Ready on the node", daemons_ready, timeout=300)[0]
        assert daemon["metadata"]["labels"]["app"] == "nvidia-device-plugin-mps-control-daemon"
        # Ready as soon as it runs (NVIDIA's daemon has no probe either); it logs once laid out.
        wait_for(
            "the daemon saying it is the simulated one, for nvidia.com/gpu",
            lambda: (
                "SIMULATED MPS control daemon for nvidia.com/gpu"
                in (log := stack.core.read_namespaced_pod_log(daemon["metadata"]["name"], NS))
                or NotYet({"log": log[-500:]})
            ),
            timeout=120,
        )
        other = stack.cluster.real_nodes[0]  # its config is not MPS: no daemon there
        assert not pods_on(stack, "nvidia-device-plugin-mps-control-daemon", other)
        wait_advertising(stack, node, "32")
        stack.kube.create(gpu_pod("two-replicas", node, 2))
        refused = wait_for("the 2-replica pod refused at admission", refused_at_admission, 120)
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
        wait_for("8 whole GPUs advertised again, no MPS", whole_gpus_again, timeout=300)
        wait_for(
            "the device plugin back on NVIDIA's image (its stand-in), one Ready pod per node",
            plugin_back,
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
    first = example_policy()["spec"]["driver"]["version"]
    target = UPGRADE_DRIVER_VERSION if current != UPGRADE_DRIVER_VERSION else first

    def driver(node: str) -> dict[str, Any] | None:
        pods = [p for p in pods_on(stack, "nvidia-driver-daemonset", node) if ready(p)]
        return pods[0] if len(pods) == 1 else None

    def job_ready() -> bool | NotYet:
        pod = stack.kube.get("Pod", "gpu-job", NS) or {}
        return ready(pod) or NotYet(pod.get("status"))

    # Two at a time (of the 3 GPU nodes: the real two and the kwok one), to keep the test short;
    # one at a time is what the kwok upgrade e2e (test_upgrade.py) holds to on 8 nodes.
    # The canary (the cluster's kwok GPU node: quick) goes first and soaks; then the real nodes,
    # two at a time.
    def kwok_gpu_node() -> str | NotYet:
        others = {
            n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(GPU_PRESENT)
            for n in stack.kube.list_objects("Node")
            if n["metadata"]["name"] not in nodes
        }
        labelled = [name for name, present in others.items() if present == "true"]
        return labelled[0] if labelled else NotYet({"gpu.present on the kwok nodes": others})

    kwok = wait_for("the kwok GPU node labelled gpu.present", kwok_gpu_node, timeout=60)
    selector = {"kubernetes.io/hostname": kwok}
    canary = {"nodeSelector": selector, "soak": "5s", "timeout": "5m"}
    upgrade_policy = {"maxParallelUpgrades": 2, "maxUnavailable": "100%", "canary": canary}
    unavailable: list[int] = []

    def upgraded(name: str) -> bool | NotYet:
        pod = driver(name)
        state = node_labels(stack.kube, name).get(UPGRADE_STATE, "")
        spec = (stack.kube.get("Node", name) or {}).get("spec") or {}
        image = pod["spec"]["containers"][0]["image"] if pod else None
        if (
            pod
            and pod["metadata"]["uid"] != before[name]
            and target in pod["spec"]["containers"][0]["image"]
            and state == "upgrade-done"
            and not spec.get("unschedulable")
        ):
            return True
        new = pod is not None and pod["metadata"]["uid"] != before[name]
        cordoned = bool(spec.get("unschedulable"))
        return NotYet(
            {name: {"driver": image, "new pod": new, "state": state, "cordoned": cordoned}}
        )

    timeline: list[dict[str, str]] = []  # each node's upgrade state, every sample

    def done() -> bool | NotYet:
        cordoned = [n for n in stack.kube.list_objects("Node") if n["spec"].get("unschedulable")]
        unavailable.append(len(cordoned))
        timeline.append(
            {n: node_labels(stack.kube, n).get(UPGRADE_STATE, "") for n in (*nodes, kwok)}
        )
        for n in nodes:
            if not (result := upgraded(n)):
                return result
        return True

    wait_all_operands_ready(stack)  # whatever ran before in this module has settled
    before = {n: driver(n)["metadata"]["uid"] for n in nodes}  # type: ignore[index]
    wait_advertising(stack, nodes[0])
    stack.kube.create(gpu_pod("gpu-job", nodes[0], 1))
    try:
        wait_for("gpu-job Running", job_ready)
        since = datetime.now(UTC)
        stack.kube.merge_patch(
            "ClusterPolicy",
            POLICY,
            {"spec": {"driver": {"version": target, "upgradePolicy": upgrade_policy}}},
        )
        wait_for(f"driver {target} on every real node", done, timeout=600, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(stack)}") from None
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
    # Canary first: no real node started before the canary was done and validated.
    first_done = next(i for i, states in enumerate(timeline) if states[kwok] == "upgrade-done")
    for states in timeline[:first_done]:
        others = {n: states[n] for n in nodes}
        assert all(v in ("", "upgrade-done") for v in others.values()), others
    # (the pass after the last node's says so)
    wait_for("the rollout done", lambda: rollout_in(stack, "done"), timeout=60)
    wait_for(
        "ClusterPolicy ready again",
        lambda: policy_ready(stack.kube, POLICY),
        timeout=300,
    )
