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
  node where the device plugin is turned off.

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
from gpu_operator.agent.stubdriver import PROBE
from gpu_operator.api.dragates import Gates
from gpu_operator.kube import Kube
from gpu_operator.render.dra_admission import config_policies
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.render.images import split_reference
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
