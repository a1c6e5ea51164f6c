"""How containers get the driver on a real node, for a driver root in the driver container
(``/run/nvidia/driver``) and on the host (a driver preinstalled at a root of its own, GKE's
layout, named by ``hostPaths.driverInstallDir``), with the stub driver standing in for NVIDIA's
(real ELF libraries with NVIDIA's sonames, ``nvidia-smi``, device nodes under the driver root):

- every operand that runs the project's image is Ready with no runtime hook involved: no
  RuntimeClass, ``NVIDIA_VISIBLE_DEVICES=void``, the driver root mounted and NVML loaded from it;
- a pod from an image with no NVIDIA files, given one GPU by the device plugin with ``cdi-cri``,
  loads ``libnvidia-ml.so.1`` and ``libcuda.so.1`` by soname, ``nvidia-smi -L`` lists exactly its
  GPU, and a CUDA driver-API probe allocates, fills and reads back device memory;
- the same for a pod with a DRA ResourceClaim, prepared by the GPUCluster's kubelet plugin on the
  node where the device plugin is turned off;
- two pods sharing one claim with MPS get one control daemon (the stub driver's
  ``nvidia-cuda-mps-control``, in a Deployment the plugin starts), holding the limits asked, that
  both reach through the pipe the claim's CDI device mounts; the GPU is EXCLUSIVE_PROCESS while
  it runs, and the daemon is gone and the GPU DEFAULT again once the pods are.

What reaches those containers is only what the CDI specs carry: the test pods run plain runc.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import yaml

from gpu_operator import labels as gpu_labels
from gpu_operator import testenv
from gpu_operator.api.dragates import Gates
from gpu_operator.kube import Kube
from gpu_operator.render.dra_admission import config_policies
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.render.images import split_reference
from gpu_operator.sim.stubdriver import PROBE
from tests.e2e.stack_support import (
    NS,
    POLICY,
    SIMULATED_DRIVER_STARTUP_PROBE,
    Stack,
    diagnose,
    phases,
    pod_exec,
    pods_on,
    ready,
    real_stack,
    wait_advertising,
)
from tests.e2e.support import NotYet, wait_for
from tests.paths import REPO

pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]

PLUGIN_NODE, DRA_NODE = "real-node-0", "real-node-1"
HOST_DRIVER = gpu_labels.SIMULATED_HOST_DRIVER_ROOT  # the nodes' "preinstalled" driver (gke)
CONTAINER_DRIVER = gpu_labels.SIMULATED_DRIVER_ROOT
PROJECT_OPERANDS = (
    "nvidia-device-plugin-daemonset",
    "nvidia-operator-validator",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-mig-manager",
)
UUID = re.compile(r"\(UUID: (GPU-[0-9a-f-]+)\)")
PROBE_BYTES = 64 * 1024 * 1024
NO_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DRA_PLUGIN = "nvidia-dra-driver-kubelet-plugin"
DRA_VALIDATOR = "nvidia-dra-validator"


def _policy() -> dict[str, Any]:
    """The project's example with every agent on the project's image (the device plugin too,
    handing out GPUs through CDI only)."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
    image = split_reference(DEFAULT_OPERATOR_IMAGE)
    spec = doc["spec"]
    spec["devicePlugin"].update(
        repository=image.repository,
        image=image.image,
        version=image.version,
        env=[{"name": "DEVICE_LIST_STRATEGY", "value": "cdi-cri"}],
    )
    spec["cdi"] = {"enabled": True}
    spec["driver"]["startupProbe"] = SIMULATED_DRIVER_STARTUP_PROBE
    return doc


def _gpucluster(driver_install_dir: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "gpucluster.yaml").read_text())
    doc["spec"]["dcgmExporter"]["enabled"] = False  # the exporter's own DRA pods: not needed
    doc["spec"]["draDriver"]["featureGates"] = {"MPSSupport": True}
    doc["spec"]["hostPaths"]["driverInstallDir"] = driver_install_dir
    return doc


@pytest.fixture(scope="module")
def stack(
    real_cluster: testenv.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # The DRA node keeps no device plugin (the operator leaves a user's "false" alone), so the
    # GPUCluster's kubelet plugin serves it: both ways GPUs reach pods, on one cluster.
    with real_cluster.api_client() as api:
        Kube(api).merge_patch("Node", DRA_NODE, {"metadata": {"labels": {NO_PLUGIN: "false"}}})
    with real_stack(real_cluster, _policy(), tmp_path_factory) as running:
        running.kube.create(_gpucluster(CONTAINER_DRIVER))
        try:
            yield running
        finally:
            # Before the policy goes (real_stack): the node as the module found it.
            running.kube.delete("GPUCluster", "gpu-cluster")
            patch = {"metadata": {"labels": {NO_PLUGIN: None}}}
            running.kube.merge_patch("Node", DRA_NODE, patch)
            # No claim-config admission policy left for the next module's claims: deleted
            # here, not waited for through the GPUCluster's teardown (a minute of it).
            for name in _policy_names():
                running.kube.delete("ValidatingAdmissionPolicy", name)
            wait_for("the admission policies gone", partial(_left, running))


def _policy_names() -> list[str]:
    policies = config_policies(Gates.defaults())
    return [o["metadata"]["name"] for o in policies if o["kind"] == "ValidatingAdmissionPolicy"]


def _left(stack: Stack) -> bool | NotYet:
    """Whether the admission policies the GPUCluster rendered are gone."""
    left = [n for n in _policy_names() if stack.kube.get("ValidatingAdmissionPolicy", n)]
    return not left or NotYet(left)


def _use_driver_root(stack: Stack, root: str) -> None:
    """The host's preinstalled driver (driver disabled, its root in driverInstallDir), or the
    driver container's; the GPUCluster told the same."""
    host = root == HOST_DRIVER
    stack.kube.merge_patch(
        "ClusterPolicy",
        POLICY,
        {
            "spec": {
                "driver": {"enabled": not host},
                "hostPaths": {"driverInstallDir": root if host else None},
            }
        },
    )
    stack.kube.merge_patch(
        "GPUCluster",
        "gpu-cluster",
        {"spec": {"hostPaths": {"driverInstallDir": root}}},
    )


def _operands_on(stack: Stack, root: str) -> None:
    """Every project-image operand Ready on both real nodes (the DRA node has no device plugin;
    its DRA plugin instead), each rendered to load the driver from ``root`` by itself."""

    def rolled_out(name: str) -> dict[str, Any] | NotYet:
        ds = stack.kube.get("DaemonSet", name, NS)
        if ds is None:
            return NotYet(f"DaemonSet {name} not rendered")
        status = ds.get("status") or {}
        wanted = status.get("desiredNumberScheduled")
        done = (
            status.get("observedGeneration") == ds["metadata"]["generation"]
            and wanted
            and status.get("updatedNumberScheduled") == wanted
            and status.get("numberReady") == wanted
        )
        return ds if done else NotYet({name: status})

    def settled() -> bool | NotYet:
        for name in PROJECT_OPERANDS:
            ds = rolled_out(name)
            if not ds:
                return ds
            pod = ds["spec"]["template"]["spec"]
            volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
            if volumes.get("driver-root") != root:
                return NotYet({name: {"driver-root": volumes.get("driver-root")}})
        # The DRA validator's pod Ready: its claim prepared and the claim's GPU answering.
        for name in (DRA_PLUGIN, DRA_VALIDATOR):
            dra = rolled_out(name)
            if not dra:
                return dra
            if not [p for p in pods_on(stack, name, DRA_NODE) if ready(p)]:
                return NotYet({name: phases(pods_on(stack, name, DRA_NODE))})
        return True

    try:
        wait_for(f"every project-image operand Ready with the driver at {root}", settled, 480)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(stack)}") from None
    for name in PROJECT_OPERANDS:
        pod = stack.kube.get("DaemonSet", name, NS)["spec"]["template"]["spec"]  # type: ignore[index]
        assert "runtimeClassName" not in pod, name  # no runtime hook in the way
        env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env") or []}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void", name
        assert env["CONTAINER_DRIVER_ROOT"] == "/driver-root", name
        assert env["NVIDIA_DRIVER_ROOT"] == root, name


def _workload(name: str, node: str, root: str, claim: bool) -> dict[str, Any]:
    """The project's image (Debian and Python, no NVIDIA files) on plain runc, asking for one
    GPU from the device plugin or through a claim; the CUDA probe (the test's own program, not
    something CDI hands out) mounted from where the stub driver laid it out on the node."""
    probe_dir = "/bin" if root == HOST_DRIVER else "/usr/bin"
    container: dict[str, Any] = {
        "name": "main",
        "image": DEFAULT_OPERATOR_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "infinity"],
        "volumeMounts": [{"name": "probe", "mountPath": "/probe", "readOnly": True}],
    }
    spec: dict[str, Any] = {
        # Through the scheduler: a claim is allocated and reserved for the pod there (a pod
        # bound by nodeName is refused the claim by the kubelet).
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [container],
        "volumes": [
            {
                "name": "probe",
                "hostPath": {"path": f"{root}{probe_dir}/{PROBE}", "type": "File"},
            }
        ],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    else:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def _claim_template() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
                }
            }
        },
    }


def _check_gets_its_gpu(stack: Stack, name: str, node: str, root: str, claim: bool) -> None:
    stack.kube.create(_workload(name, node, root, claim))
    try:

        def running() -> bool | NotYet:
            pod = stack.kube.get("Pod", name, NS) or {}
            return ready(pod) or NotYet((pod.get("status") or {}).get("containerStatuses"))

        try:
            wait_for(f"{name} Running on {node}", running, timeout=180)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnose(stack)}") from None
        env = pod_exec(stack, name, "main", ["env"])
        given = sorted(set(re.findall(r"=(GPU-[0-9a-f-]+)", env)))
        assert len(given) == 1, f"one GPU's variable from the CDI spec expected: {env}"
        loaded = pod_exec(
            stack, name, "main",
            ["python3", "-c", "import ctypes\nfor so in ('libnvidia-ml.so.1', 'libcuda.so.1'):"
             "\n    ctypes.CDLL(so)\n    print(so, 'loaded')"],
        )  # fmt: skip
        assert "libnvidia-ml.so.1 loaded" in loaded and "libcuda.so.1 loaded" in loaded, loaded
        listed = pod_exec(stack, name, "main", ["nvidia-smi", "-L"])
        assert UUID.findall(listed) == given, listed  # exactly its GPU
        probed = pod_exec(stack, name, "main", ["/probe", "--bytes", str(PROBE_BYTES)])
        assert "cuInit: ok" in probed and "check: ok" in probed, probed
    finally:
        stack.kube.delete("Pod", name, NS, grace_period_seconds=0)
        wait_for(f"{name} gone", lambda: stack.kube.get("Pod", name, NS) is None, timeout=60)


@pytest.mark.parametrize("root", [CONTAINER_DRIVER, HOST_DRIVER], ids=["driver-container", "host"])
def test_containers_get_the_driver_from_cdi_only(stack: Stack, root: str) -> None:
    _use_driver_root(stack, root)
    _operands_on(stack, root)
    wait_advertising(stack, PLUGIN_NODE)  # the re-rolled plugin registered again
    if stack.kube.get("ResourceClaimTemplate", "one-gpu", NS) is None:
        stack.kube.create(_claim_template())
    _check_gets_its_gpu(stack, "cdi-plugin-pod", PLUGIN_NODE, root, claim=False)
    _check_gets_its_gpu(stack, "cdi-claim-pod", DRA_NODE, root, claim=True)
    # Nothing injected by a runtime hook: the device plugin's spec carries the driver itself.
    spec = pod_exec(
        stack,
        pods_on(stack, "nvidia-device-plugin-daemonset", PLUGIN_NODE)[0]["metadata"]["name"],
        "nvidia-device-plugin",
        ["cat", "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"],
    )
    mounts = {
        m["containerPath"]: m["hostPath"] for m in json.loads(spec)["containerEdits"]["mounts"]
    }
    assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.1"].startswith(root)


MPS_CLAIM = "mps-shared"
MPS_SETTINGS = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}


def _mps_claim(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """A ResourceClaim for one GPU shared with MPS with ``settings`` (its mpsConfig)."""
    config = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
              "sharing": {"strategy": "MPS", "mpsConfig": settings}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{"requests": ["gpu"],
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": config}}],
        }},
    }  # fmt: skip


def _claim_pod(name: str, claim: str) -> dict[str, Any]:
    """The workload on the DRA node, given the existing ResourceClaim ``claim`` by name."""
    pod = _workload(name, DRA_NODE, CONTAINER_DRIVER, claim=True)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod


def _mps_daemons(stack: Stack) -> list[dict[str, Any]]:
    return stack.kube.list_objects(
        "Deployment", NS, label_selector="app.kubernetes.io/component=mps-control-daemon"
    )


def _compute_mode(stack: Stack, uuid: str) -> str:
    """The GPU's compute mode as the stub driver's GPU holds it, read in the DRA plugin's pod
    (it has the driver root mounted)."""
    plugin = pods_on(stack, DRA_PLUGIN, DRA_NODE)[0]["metadata"]["name"]
    script = (
        "from gpu_operator.sim.stubdriver import read_compute_policy\n"
        f"print(read_compute_policy('/driver-root/dev', {uuid!r}).compute_mode)"
    )
    return pod_exec(stack, plugin, "gpus", ["python3", "-c", script]).strip()


def test_two_pods_sharing_an_mps_claim_reach_one_daemon_holding_its_limits(stack: Stack) -> None:
    _use_driver_root(stack, CONTAINER_DRIVER)
    _operands_on(stack, CONTAINER_DRIVER)
    stack.kube.create(_mps_claim(MPS_CLAIM, MPS_SETTINGS))
    names = ("mps-a", "mps-b")
    try:
        for name in names:
            stack.kube.create(_claim_pod(name, MPS_CLAIM))

        def both_ready() -> bool | NotYet:
            pods = [stack.kube.get("Pod", n, NS) or {} for n in names]
            return all(ready(p) for p in pods) or NotYet(
                {n: phases([p]) for n, p in zip(names, pods, strict=True)}
            )

        try:
            wait_for("both pods of the MPS claim Running", both_ready, timeout=180)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnose(stack)}") from None
        (daemon,) = _mps_daemons(stack)  # one daemon for the claim, Ready before the pods ran
        assert (daemon.get("status") or {}).get("readyReplicas") == 1, daemon.get("status")
        seen = {}
        for name in names:
            env = pod_exec(stack, name, "main", ["env"])
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env, env
            (uuid,) = set(re.findall(r"=(GPU-[0-9a-f-]+)", env))
            asked = "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n"
            said = pod_exec(
                stack, name, "main",
                ["sh", "-c", f"printf '{asked}' | nvidia-cuda-mps-control; "
                             "cat /tmp/nvidia-mps/nvidia-cuda-mps-control.pid"],
            )  # fmt: skip
            seen[name] = (uuid, said.split())
        assert seen["mps-a"] == seen["mps-b"], seen  # one GPU, one daemon (one pid)
        uuid, said = seen["mps-a"]
        assert said[:2] == ["50.0", "10240M"] and len(said) == 3, seen
        assert _compute_mode(stack, uuid) == "Exclusive_Process"
    finally:
        for name in names:
            stack.kube.delete("Pod", name, NS, grace_period_seconds=0)
        for name in names:
            wait_for(
                f"{name} gone", lambda n=name: stack.kube.get("Pod", n, NS) is None, timeout=60
            )
        stack.kube.delete("ResourceClaim", MPS_CLAIM, NS)
    wait_for(
        "the claim unprepared: its MPS daemon gone",
        lambda: not (left := _mps_daemons(stack)) or NotYet([d["metadata"]["name"] for d in left]),
        timeout=90,
    )
    assert _compute_mode(stack, uuid) == "Default"


def test_a_config_admission_cannot_judge_fails_prepare_with_its_reason_in_the_pods_events(
    stack: Stack,
) -> None:
    """A per-device limit for a device index the claim was not given passes admission (it
    cannot know how many devices the claim gets) and fails Prepare: the pod's Events name the
    field, no daemon is started and the GPU is left as it was."""
    _use_driver_root(stack, CONTAINER_DRIVER)
    _operands_on(stack, CONTAINER_DRIVER)
    limits = {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}
    name, claim = "mps-refused", "mps-refused"
    stack.kube.create(_mps_claim(claim, limits))
    stack.kube.create(_claim_pod(name, claim))
    try:

        def refused() -> str | NotYet:
            events = stack.kube.list_objects(
                "Event", NS, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}"
            )
            said = [f"{e.get('reason')}: {e.get('message')}" for e in events]
            hit = next((s for s in said if "defaultPerDevicePinnedMemoryLimit.3" in s), None)
            return hit or NotYet(said)

        said = wait_for("the pod's Events to name the refused field", refused, timeout=120)
        assert "not a GPU UUID of the claim nor an index below 1" in said, said
        assert not ready(stack.kube.get("Pod", name, NS) or {})
        uid = (stack.kube.get("ResourceClaim", claim, NS) or {})["metadata"]["uid"]
        assert not [d for d in _mps_daemons(stack) if uid in d["metadata"]["name"]]
        allocated = (stack.kube.get("ResourceClaim", claim, NS) or {})["status"]["allocation"]
        (result,) = allocated["devices"]["results"]
        slices = stack.kube.list_objects(
            "ResourceSlice", field_selector=f"spec.nodeName={DRA_NODE}"
        )
        uuid = next(
            d["attributes"]["uuid"]["string"]
            for s in slices
            for d in s["spec"].get("devices") or []
            if d["name"] == result["device"]
        )
        assert _compute_mode(stack, uuid) == "Default"  # nothing changed on the GPU
    finally:
        stack.kube.delete("Pod", name, NS, grace_period_seconds=0)
        wait_for(f"{name} gone", lambda: stack.kube.get("Pod", name, NS) is None, timeout=60)
        stack.kube.delete("ResourceClaim", claim, NS)
