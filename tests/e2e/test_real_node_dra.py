"""DRA end to end on a real node: the real kubelet finds the plugin through its registration
socket, calls NodePrepareResources for a pod's claim, and containerd injects the device from
the CDI spec the plugin wrote; after the pod goes, NodeUnprepareResources removes the spec.
The claim asks for time-slicing interval Long: the GPU holds it while the pod runs, and
Default again once the claim is unprepared.

The plugin runs in this process, serving in the node's directories (the kubelet sees them as
/var/lib/kubelet and /var/run/cdi in its mount namespace), on simulated GPUs, setting the
time-slice with the stub driver's nvidia-smi."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.agent.dra import agent as dra_agent
from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra.prepare import spec_file_name
from gpu_operator.agent.dra.server import DraPlugin
from gpu_operator.agent.dra.sharing import NvidiaSmi
from gpu_operator.agent.driver_cdi import find_host_driver
from gpu_operator.api.draconfig import GROUP_VERSION
from gpu_operator.api.dragates import resolve
from gpu_operator.kube import Kube
from gpu_operator.render.dra import device_classes
from gpu_operator.sim import dra as sim_dra
from gpu_operator.sim.operands import install_driver
from gpu_operator.sim.stubdriver import read_compute_policy

from .dra_node_support import log_with, namespace, phase, plugin_paths, registered, slices_of
from .support import NotYet, wait_for

pytestmark = pytest.mark.real_nodes

SHELL = testenv.binaries.node_image_name("shell")
DRIVER = dra_devices.DRIVER
LONG_TIME_SLICES = {
    "driver": DRIVER,
    "parameters": {
        "apiVersion": GROUP_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    },
}


@pytest.fixture
def kube(real_cluster: testenv.Cluster) -> Iterator[tuple[Kube, str]]:
    with real_cluster.api_client() as api:
        k = Kube(api)
        with namespace(k, "dra") as ns:
            yield k, ns


def test_a_pod_with_a_claim_sees_its_gpu_through_cdi_on_a_real_node(
    real_cluster: testenv.Cluster, kube: tuple[Kube, str]
) -> None:
    api, ns = kube
    node = real_cluster.real_nodes[0]
    node_dir = real_cluster.real_node_dir(node)
    for obj in device_classes():
        api.apply(obj)
    inventory = sim_dra.simulated_inventory("a100-40gb:1", node)
    refs = dra_devices.refs_by_name(inventory)
    with tempfile.TemporaryDirectory(prefix="dra", dir="/tmp") as tmp:
        paths = plugin_paths(node_dir, Path(tmp))

        def read_claim(namespace: str, name: str) -> dict[str, Any] | None:
            return api.get("ResourceClaim", name, namespace)

        # No driver files here (simulated NVML in this process): the spec carries the GPU's
        # env only; test_real_driver.py has the plugin in its DaemonSet give the driver too.
        no_driver, _ = find_host_driver(str(Path(tmp) / "no-driver"), "/")
        # The GPU's compute policy is the stub driver's: laid out for the same GPUs.
        stub_root = Path(tmp) / "stub-driver"
        install_driver("a100-40gb:1", stub_root, seed=node)
        stub_driver, missing = find_host_driver(str(stub_root), "/")
        assert missing is None, missing
        plugin = DraPlugin(
            node,
            paths,
            lambda: refs,
            read_claim,
            lambda: no_driver,
            resolve({"TimeSlicingSettings": True}),
            lambda: NvidiaSmi(stub_driver),
        )
        uuid_ = refs["gpu-0"].uuid

        def time_slice() -> str:
            return read_compute_policy(stub_root / "dev", uuid_).time_slice

        with registered(plugin, node_dir), slices_of(api, node):
            dra_agent.publish(api, node, inventory, dra_agent.node_owner(api, node))
            api.create(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "one-gpu", "namespace": ns},
                    "spec": {"spec": {"devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ],
                        "config": [{"requests": ["gpu"], "opaque": LONG_TIME_SLICES}],
                    }}},
                }
            )  # fmt: skip
            api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "cuda", "namespace": ns},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 1,
                        "resourceClaims": [
                            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}
                        ],
                        "containers": [
                            {
                                "name": "main",
                                "image": SHELL,
                                "imagePullPolicy": "Never",
                                "command": ["sh", "-c",
                                            'echo "gpu=$NVIDIA_DRA_GPU_0"; sleep 3600'],
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                }
            )  # fmt: skip

            assert wait_for("the pod Running", phase(api, ns, "cuda"), timeout=120) == "Running"

            assert time_slice() == "Long"  # set at Prepare, before the container started
            claim_uid = next(iter(plugin.checkpoint.uids()))
            assert (node_dir / "cdi" / spec_file_name(claim_uid)).exists()
            log = wait_for("the container's output", log_with(api, ns, "cuda", "gpu="), timeout=60)
            assert f"gpu={uuid_}" in log, log

            api.delete("Pod", "cuda", ns, grace_period_seconds=0)

            def unprepared() -> bool | NotYet:
                spec = node_dir / "cdi" / spec_file_name(claim_uid)
                if spec.exists():
                    return NotYet(f"{spec} still there")
                # The checkpoint lets go of the claim just after the spec goes.
                return not plugin.checkpoint.uids() or NotYet(f"checkpoint holds {claim_uid}")

            wait_for(
                "NodeUnprepareResources to remove the CDI spec, then the checkpoint's claim",
                unprepared,
                timeout=90,
            )
            assert time_slice() == "Default"  # put back before the spec went
