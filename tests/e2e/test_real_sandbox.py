"""GPUs for virtual machines on a real node: each real node's simulated PCI bus (laid out by the
harness beside its preinstalled driver, every GPU on ``nvidia``) is what the passthrough
operands act on, from their rendered DaemonSets and the SIMULATED stand-ins of NVIDIA's images.

With sandbox workloads on and one node labelled ``vm-passthrough``, the VFIO manager binds its
GPUs to ``vfio-pci`` (the node's sysfs driver links say so), the sandbox validator sees them
there, and KubeVirt's device plugin advertises them to the real kubelet as
``nvidia.com/<PCI device name>``; a pod asking for one gets its IOMMU group's node. The other
real node runs no operand meanwhile (``nvidia.com/gpu.deploy.operands=false``).

Then DRA on that other node: a claim of class ``vfio.gpu.nvidia.com`` against the kubelet
plugin with PassthroughSupport (in this process, as in test_real_node_dra.py) moves its GPU to
``vfio-pci`` and hands the pod the group's node through CDI; while it is held the GPU's
``gpu-<i>`` leaves the published pool, and comes back once the claim is gone."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.agent.dra import agent as dra_agent
from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra.server import DraPlugin
from gpu_operator.agent.dra.vfio import NVIDIA_DRIVER, VFIO_DRIVER, VfioControl, pci_bus
from gpu_operator.agent.driver_cdi import find_host_driver
from gpu_operator.api.dragates import resolve
from gpu_operator.kube import Kube
from gpu_operator.labels import SIMULATED_PCI_ROOT, WORKLOAD_CONFIG
from gpu_operator.render.dra import device_classes
from gpu_operator.sim import dra as sim_dra
from gpu_operator.sim import sandbox as sim_sandbox
from gpu_operator.sim.nvml.profiles import load_model
from gpu_operator.sim.registration import register
from tests.e2e.dra_node_support import log_with, namespace, phase, plugin_paths, registered
from tests.e2e.stack_support import (
    NS,
    POLICY,
    Stack,
    diagnose,
    phases,
    pods_on,
    ready,
    real_stack,
    sandbox_policy,
)
from tests.e2e.support import NotYet, wait_for

# The first run builds the image and the stand-ins (minutes; a changed tree rebuilds them).
pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]

OPERANDS_OFF = "nvidia.com/gpu.deploy.operands"
SHELL = testenv.binaries.node_image_name("shell")
SANDBOX_APPS = (
    "nvidia-vfio-manager",
    "nvidia-sandbox-validator",
    "nvidia-sandbox-device-plugin-daemonset",
)


def pci_root(cluster: testenv.Cluster, node: str) -> Path:
    """The node's simulated PCI bus, from this process (the node sees it at
    SIMULATED_PCI_ROOT)."""
    return cluster.real_node_dir(node) / "host-driver"


def pci_drivers(root: Path) -> dict[str, str]:
    """Each NVIDIA GPU function's driver, as its sysfs ``driver`` link names it."""
    bus = pci_bus(root)
    return {a: bus.driver_of(a) for a in bus.nvidia_functions()}


def all_on(root: Path, driver: str) -> Callable[[], dict[str, str] | NotYet]:
    def probe() -> dict[str, str] | NotYet:
        found = pci_drivers(root)
        return found if found and set(found.values()) == {driver} else NotYet(found)

    return probe


def gpu_spec(cluster: testenv.Cluster, node: str) -> str:
    planned = next(n for n in cluster.real.nodes if n.name == node)  # type: ignore[union-attr]
    return planned.gpus


def resource_of(spec: str) -> tuple[str, int]:
    """The resource KubeVirt's plugin advertises a node's GPUs as, and how many (``h100-80gb:8``
    -> ``nvidia.com/GH100_H100_SXM5_80GB``, 8)."""
    profile, count = spec.split(":")
    name = sim_sandbox.device_name(load_model(profile).pci_device_id >> 16)
    return f"{sim_sandbox.RESOURCE_PREFIX}/{name}", int(count)


def set_labels(kube: Kube, node: str, labels: dict[str, str | None]) -> None:
    kube.merge_patch("Node", node, {"metadata": {"labels": labels}})


@pytest.fixture(scope="module")
def passthrough(
    real_cluster: testenv.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The sandbox policy reconciled, the second real node labelled vm-passthrough and the first
    given no operands. Teardown deletes the policy first, so the VFIO manager's preStop hands
    the GPUs back to nvidia before the labels go (the node then keeps no container stack)."""
    register()
    other, node = real_cluster.real_nodes[:2]
    root = pci_root(real_cluster, node)
    with real_stack(real_cluster, sandbox_policy(), tmp_path_factory) as stack:
        set_labels(stack.kube, other, {OPERANDS_OFF: "false"})
        set_labels(stack.kube, node, {WORKLOAD_CONFIG: "vm-passthrough"})
        try:
            yield stack
        finally:
            stack.kube.delete("ClusterPolicy", POLICY)
            try:
                wait_for(
                    "the sandbox operands gone",
                    lambda: (
                        not (left := [p for a in SANDBOX_APPS for p in pods_on(stack, a, node)])
                        or NotYet(phases(left))
                    ),
                    timeout=180,
                )
                wait_for("the GPUs back on nvidia", all_on(root, NVIDIA_DRIVER), timeout=30)
            finally:
                set_labels(stack.kube, other, {OPERANDS_OFF: None})
                set_labels(stack.kube, node, {WORKLOAD_CONFIG: None})


def sandbox_ready(stack: Stack, node: str) -> None:
    def every_one_ready() -> bool | NotYet:
        for app in SANDBOX_APPS:
            pods = pods_on(stack, app, node)
            if not pods or not all(ready(p) for p in pods):
                return NotYet(f"{app} on {node} not Ready: {phases(pods)}")
        return True

    try:
        wait_for("the sandbox operands Ready", every_one_ready, timeout=300)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(stack)}") from None


def advertised(stack: Stack, node: str, resource: str) -> Callable[[], str | NotYet]:
    def probe() -> str | NotYet:
        status = (stack.kube.get("Node", node) or {}).get("status") or {}
        got = (status.get("allocatable") or {}).get(resource)
        extended = {k: v for k, v in (status.get("allocatable") or {}).items() if "/" in k}
        return got if got not in (None, "0") else NotYet(extended)

    return probe


def test_the_vfio_manager_binds_every_gpu_of_the_node_to_vfio_pci(passthrough: Stack) -> None:
    cluster = passthrough.cluster
    node = cluster.real_nodes[1]
    root = pci_root(cluster, node)
    try:
        found = wait_for("every GPU on vfio-pci", all_on(root, VFIO_DRIVER), timeout=300)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(passthrough)}") from None
    assert len(found) == resource_of(gpu_spec(cluster, node))[1]
    for address in found:
        override = root / "sys/bus/pci/devices" / address / "driver_override"
        assert override.read_text() == "vfio-pci\n", address
    sandbox_ready(passthrough, node)  # the validator saw them there: the plugin's init passed
    pod = pods_on(passthrough, "nvidia-vfio-manager", node)[0]["metadata"]["name"]
    log = passthrough.core.read_namespaced_pod_log(pod, NS, container="nvidia-vfio-manager")
    assert log.startswith("SIMULATED: NVIDIA VFIO manager stand-in"), log
    assert all(line.startswith("SIMULATED") for line in log.splitlines()), log


def test_kubevirts_device_plugin_advertises_the_gpus_by_pci_device_name(
    passthrough: Stack,
) -> None:
    cluster = passthrough.cluster
    node = cluster.real_nodes[1]
    resource, count = resource_of(gpu_spec(cluster, node))
    try:
        got = wait_for(f"{node} advertising {resource}", advertised(passthrough, node, resource),
                       timeout=420)  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(passthrough)}") from None
    assert got == str(count)


def test_a_pod_asking_for_a_passthrough_gpu_gets_its_vfio_group(passthrough: Stack) -> None:
    cluster = passthrough.cluster
    node = cluster.real_nodes[1]
    resource, _ = resource_of(gpu_spec(cluster, node))
    variable = sim_sandbox.env_key(resource.split("/", 1)[1])
    wait_for(f"{node} advertising {resource}", advertised(passthrough, node, resource),
             timeout=420)  # fmt: skip
    name = "vm-gpu"
    passthrough.kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": SHELL,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c",
                                    f'echo "pci=${variable}"; echo "vfio=" $(ls /dev/vfio); '
                                    "sleep 3600"],
                        "resources": {"limits": {resource: "1"}},
                    }
                ],
            },
        }
    )  # fmt: skip
    try:
        try:
            state = wait_for("the pod Running", phase(passthrough.kube, NS, name), timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnose(passthrough)}") from None
        assert state == "Running", diagnose(passthrough)
        log = wait_for("the pod's output", log_with(passthrough.kube, NS, name, "vfio="), 60)
        lines = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
        address = lines["pci"].strip()
        group = pci_bus(pci_root(cluster, node)).iommu_group(address)
        assert set(lines["vfio"].split()) == {group, "vfio"}, log
    finally:
        passthrough.kube.delete("Pod", name, NS, grace_period_seconds=0)


# -- DRA: a VFIO claim on the other real node ----------------------------------------------------
@pytest.fixture
def kube(real_cluster: testenv.Cluster) -> Iterator[tuple[Kube, str]]:
    with real_cluster.api_client() as api:
        k = Kube(api)
        with namespace(k, "vfio") as ns:
            yield k, ns


def why_pending(api: Kube, ns: str) -> str:
    """The namespace's Events (the scheduler's and the kubelet's word on a claim) and claims."""
    lines = [f"event {e.get('reason')}: {e.get('message')}" for e in api.list_objects("Event", ns)]
    for claim in api.list_objects("ResourceClaim", ns):
        lines.append(f"claim {claim['metadata']['name']}: {claim.get('status')}")
    return "\n".join(lines)


def published(api: Kube, node: str) -> set[str]:
    slices = api.list_objects("ResourceSlice", field_selector=f"spec.nodeName={node}")
    return {d["name"] for s in slices for d in s["spec"].get("devices") or []}


def test_a_vfio_claim_gets_its_group_through_cdi_and_holds_the_gpu_off_the_pool(
    real_cluster: testenv.Cluster, kube: tuple[Kube, str]
) -> None:
    register()
    api, ns = kube
    node = real_cluster.real_nodes[0]
    node_dir = real_cluster.real_node_dir(node)
    root = pci_root(real_cluster, node)
    wait_for("the node's GPUs on nvidia", all_on(root, NVIDIA_DRIVER), timeout=60)
    for obj in device_classes():
        api.apply(obj)
    inventory = sim_dra.simulated_inventory(gpu_spec(real_cluster, node), node)
    control = VfioControl(pci_bus(root), root / "dev")
    # The CDI spec names the VFIO nodes where the node has them: the preinstalled driver's root.
    driver, _ = find_host_driver(str(root), SIMULATED_PCI_ROOT)
    owner = dra_agent.node_owner(api, node)
    with tempfile.TemporaryDirectory(prefix="vfio", dir="/tmp") as tmp:
        paths = plugin_paths(node_dir, Path(tmp))
        passthrough: list[dra_agent.Passthrough] = []

        def refs() -> dict[str, dra_devices.DeviceRef]:
            here = passthrough[0]
            return dra_devices.refs_by_name(inventory, here.gpus(inventory), here.held())

        def read_claim(namespace: str, name: str) -> dict[str, Any] | None:
            return api.get("ResourceClaim", name, namespace)

        plugin = DraPlugin(
            node, paths, refs, read_claim, lambda: driver,
            resolve({"PassthroughSupport": True}), vfio=control,
        )  # fmt: skip
        passthrough.append(dra_agent.Passthrough(control, plugin.held_vfio))

        def publish() -> set[str]:
            """One publishing pass of the plugin's loop: the pool as the PCI bus is now."""
            pool = dra_agent.pool_of(inventory, passthrough=passthrough[0])
            dra_agent.publish(api, node, inventory, owner, pool=pool)
            return published(api, node)

        try:
            with registered(plugin, node_dir):
                before = publish()
                assert {"gpu-0", "gpu-vfio-0"} <= before, sorted(before)
                api.create(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": {"name": "vm-gpu", "namespace": ns},
                        "spec": {"devices": {"requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "vfio.gpu.nvidia.com"}}
                        ]}},
                    }
                )  # fmt: skip
                api.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": "vm", "namespace": ns},
                        "spec": {
                            "nodeSelector": {"kubernetes.io/hostname": node},
                            # the operator's GPU node taint, there while a policy is active
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                            "restartPolicy": "Never",
                            "terminationGracePeriodSeconds": 1,
                            "resourceClaims": [{"name": "gpu", "resourceClaimName": "vm-gpu"}],
                            "containers": [
                                {
                                    "name": "main",
                                    "image": SHELL,
                                    "imagePullPolicy": "Never",
                                    "command": ["sh", "-c",
                                                'echo "vfio=" $(ls /dev/vfio); sleep 3600'],
                                    "resources": {"claims": [{"name": "gpu"}]},
                                }
                            ],
                        },
                    }
                )  # fmt: skip
                try:
                    state = wait_for("the pod Running", phase(api, ns, "vm"), timeout=120)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{why_pending(api, ns)}") from None
                assert state == "Running", why_pending(api, ns)
                claim = api.get("ResourceClaim", "vm-gpu", ns) or {}
                results = claim["status"]["allocation"]["devices"]["results"]
                device = results[0]["device"]
                assert device.startswith("gpu-vfio-"), device
                address = refs()[device].vfio
                assert address and control.bus.driver_of(address) == VFIO_DRIVER
                group = control.bus.iommu_group(address)
                log = wait_for("the container's output", log_with(api, ns, "vm", "vfio="), 60)
                assert set(log.split("=", 1)[1].split()) == {group, "vfio"}, log
                gpu = next(g for g in inventory.gpus if dra_devices.bus_id(g.pci_bus_id) == address)
                sibling = f"gpu-{gpu.minor_number}"
                held = publish()
                assert device in held and sibling not in held, sorted(held)

                api.delete("Pod", "vm", ns, grace_period_seconds=0)
                api.delete("ResourceClaim", "vm-gpu", ns)
                wait_for(
                    "the claim unprepared",
                    lambda: not plugin.checkpoint.uids() or NotYet(plugin.checkpoint.uids()),
                    timeout=90,
                )
                assert control.bus.driver_of(address) == NVIDIA_DRIVER
                after = publish()
                assert {device, sibling} <= after, sorted(after)
        finally:
            control.release_unheld(())  # whatever a failure left on vfio-pci
            for s in api.list_objects("ResourceSlice", field_selector=f"spec.nodeName={node}"):
                api.delete("ResourceSlice", s["metadata"]["name"])
