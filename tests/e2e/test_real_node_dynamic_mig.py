"""DynamicMIG through a real kubelet: MIG devices made at Prepare for the claims the real
scheduler placed on an H100's partitions, each pod's ``nvidia-smi -L`` listing exactly its
own, one claim too many waiting with the scheduler's reason, and the devices destroyed when
the pods go; a plugin that dies between the GPU and the compute instance leaves nothing once
it is back, and the kubelet's retry then gets its device.

The plugin runs in this process over the stub driver's simulated NVML (as the agent loads it
from a driver root in the node's directory), serving the node's kubelet; containerd gives the
pods the driver from the plugin's CDI specs, and the node's runtime shows a container holding
the GPU what the simulated kernel holds (testenv's nvidia_runtime ``kernel_view``)."""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.agent.dra import agent as dra_agent
from gpu_operator.agent.dra import partitions
from gpu_operator.agent.dra import slices as dra_slices
from gpu_operator.agent.dra.devices import DeviceRef
from gpu_operator.agent.dra.mig_control import MigControl
from gpu_operator.agent.dra.server import DraPlugin
from gpu_operator.agent.driver_cdi import HostDriver, find_host_driver
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.nvml.loader import load_nvml
from gpu_operator.api.dragates import resolve
from gpu_operator.kube import Kube
from gpu_operator.render.dra import device_classes
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.sim import registration
from gpu_operator.sim.nvml import uninstall_simulated_nvml
from gpu_operator.sim.operands import install_driver
from gpu_operator.sim.stubdriver import read_mig_state

from .dra_node_support import (
    DRIVER,
    log_with,
    namespace,
    phase,
    plugin_paths,
    registered,
    slices_of,
)
from .stack_support import project_images
from .support import NotYet, wait_for

pytestmark = pytest.mark.real_nodes

GPUS = "h100-80gb:1"
A = f"device.attributes['{DRIVER}']"
LISTED = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9a-f-]+)\)$", re.M)
GATES = resolve({"DynamicMIG": True})


@dataclass
class Node:
    api: Kube
    ns: str
    name: str
    dir: Path
    sockets: Path
    root: Path  # the stub driver, under the node's directory
    nvml: Nvml
    driver: HostDriver

    def plugin(self, nvml: Any = None) -> DraPlugin:
        """A plugin for the node's kubelet; ``nvml``: what makes its MIG devices."""
        session = self.nvml

        def refs() -> dict[str, DeviceRef]:
            return partitions.refs_by_name(session.inventory())

        def read_claim(namespace: str, name: str) -> dict[str, Any] | None:
            return self.api.get("ResourceClaim", name, namespace)

        return DraPlugin(
            self.name,
            plugin_paths(self.dir, self.sockets),
            refs,
            read_claim,
            lambda: self.driver,
            GATES,
            mig=MigControl(nvml or session),
        )

    def publish(self) -> None:
        inventory = self.nvml.inventory()
        pool = dra_agent.pool_of(inventory, dra_slices.dynamic_layout(self.api.server_version()))
        owner = dra_agent.node_owner(self.api, self.name)
        dra_agent.publish(self.api, self.name, inventory, owner, None, pool)

    def instances(self) -> list[tuple[str, int]]:
        """The GPU's GPU instances: profile and compute instances."""
        (gpu,) = self.nvml.inventory().gpus
        return [(gi.profile, len(gi.compute_instances)) for gi in gpu.gpu_instances]

    def listed_by_the_kernel(self) -> list[str]:
        """The MIG devices' UUIDs as the stub driver's library reads them."""
        (gpu,) = self.nvml.inventory().gpus
        return [row.uuid for row in read_mig_state(self.root / "dev", gpu.uuid)[1]]

    def claim_and_pod(self, name: str, profile: str) -> None:
        request = {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": f"{A}.profile == '{profile}'"}}],
        }
        self.api.create(
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": self.ns},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}
        )  # fmt: skip
        container = {
            "name": "main",
            "image": DEFAULT_OPERATOR_IMAGE,  # glibc for nvidia-smi; no NVIDIA files
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "nvidia-smi -L && echo listed && sleep infinity"],
            "resources": {"claims": [{"name": "gpu"}]},
        }
        self.api.create(
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": name, "namespace": self.ns},
             "spec": {"nodeSelector": {"kubernetes.io/hostname": self.name},
                      "terminationGracePeriodSeconds": 1,
                      "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                      "containers": [container]}}
        )  # fmt: skip

    def running_with(self, name: str) -> list[tuple[str, str]]:
        """The pod Running, and the MIG devices its ``nvidia-smi -L`` listed."""
        assert wait_for(f"{name} Running", phase(self.api, self.ns, name), 120) == "Running"
        log = wait_for(f"{name}'s listing", log_with(self.api, self.ns, name, "listed"), 60)
        return LISTED.findall(log)

    def gone(self, *names: str) -> None:
        for name in names:
            self.api.delete("Pod", name, self.ns, grace_period_seconds=0)
            self.api.delete("ResourceClaim", name, self.ns)


@pytest.fixture
def node(real_cluster: testenv.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    real_cluster.load_image(project_images(tmp_path_factory)[0])  # the project's own
    name = real_cluster.real_nodes[0]
    node_dir = real_cluster.real_node_dir(name)
    root = node_dir / f"dynamic-mig-{uuid.uuid4().hex[:8]}"
    install_driver(GPUS, root, seed=name)
    registration.register()  # the stub driver's NVML, as the plugin's command line has it
    loaded = load_nvml(root)
    assert loaded.startswith("simulated NVML from the stub driver"), loaded
    driver, missing = find_host_driver(str(root), str(root))  # seen alike from the node
    assert missing is None, missing
    try:
        with (
            real_cluster.api_client() as client,
            namespace(Kube(client), "dynamic-mig") as ns,
            tempfile.TemporaryDirectory(prefix="dra", dir="/tmp") as sockets,
            Nvml() as nvml,
        ):
            api = Kube(client)
            for obj in device_classes():
                api.apply(obj)
            with slices_of(api, name):
                yield Node(api, ns, name, node_dir, Path(sockets), root, nvml, driver)
    finally:
        uninstall_simulated_nvml()
        shutil.rmtree(root, ignore_errors=True)


def unschedulable(node: Node, name: str) -> str | NotYet:
    obj = node.api.get("Pod", name, node.ns) or {}
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message") or "")
    return NotYet({"pod": name, "status": obj.get("status")})


def test_each_pod_lists_the_mig_device_made_for_its_claim_and_none_is_left_after(
    node: Node,
) -> None:
    wanted = {"small": "1g.10gb", "medium": "3g.40gb"}
    with registered(node.plugin(), node.dir):
        node.publish()
        for name, profile in wanted.items():
            node.claim_and_pod(name, profile)
        listed = {name: node.running_with(name) for name in wanted}
        made = node.listed_by_the_kernel()
        assert sorted(node.instances()) == [("1g.10gb", 1), ("3g.40gb", 1)]
        for name, profile in wanted.items():
            ((got_profile, got_uuid),) = listed[name]  # its own, and only its own
            assert got_profile == profile and got_uuid in made, (listed, made)
        assert listed["small"][0][1] != listed["medium"][0][1]

        # The GPU's 8 memory slices cannot be had while two are taken.
        node.claim_and_pod("large", "7g.80gb")
        reason = wait_for("the 7g.80gb pod unschedulable", lambda: unschedulable(node, "large"))
        assert "cannot allocate all claims" in reason, reason

        node.gone(*wanted)
        wait_for(
            "the two MIG devices destroyed at Unprepare, then the 7g.80gb one made",
            lambda: node.instances() == [("7g.80gb", 1)] or NotYet(node.instances()),
            timeout=180,
        )
        ((profile, _),) = node.running_with("large")
        assert profile == "7g.80gb"
        node.gone("large")
        wait_for(
            "no MIG device left once the last pod went",
            lambda: node.instances() == [] or NotYet(node.instances()),
            timeout=90,
        )
        assert node.listed_by_the_kernel() == []


class Killed(BaseException):
    """The plugin's process dying mid-call: nothing after it runs, no handler sees it."""


class DiesBeforeTheComputeInstance:
    """NVML, in a plugin process that dies once a GPU instance exists and before its compute
    instance: the call blocks until :meth:`die`, then it and every later call raise."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.reached = threading.Event()
        self._dead = threading.Event()

    def __getattr__(self, name: str) -> Any:
        if self._dead.is_set():
            raise Killed
        return getattr(self.nvml, name)

    def create_compute_instance(self, index: int, gi_id: int, slices: int) -> int:
        self.reached.set()
        self._dead.wait(120)
        raise Killed

    def die(self) -> None:
        self._dead.set()


def test_a_plugin_dying_between_the_gpu_and_compute_instance_leaves_nothing_once_back(
    node: Node,
) -> None:
    dying = DiesBeforeTheComputeInstance(node.nvml)
    with registered(node.plugin(dying), node.dir):
        node.publish()
        node.claim_and_pod("retried", "3g.40gb")
        assert dying.reached.wait(120), "the kubelet never asked to prepare the claim"
        assert node.instances() == [("3g.40gb", 0)]  # a GPU instance, no compute instance
        dying.die()
    assert node.instances() == [("3g.40gb", 0)], "a dead process undoes nothing"

    back = node.plugin()
    assert back.restore_migs(), "the restarted plugin destroys what no claim holds"
    assert node.instances() == []
    with registered(back, node.dir):
        ((profile, mig),) = node.running_with("retried")  # the kubelet's retry, served
        assert profile == "3g.40gb" and node.listed_by_the_kernel() == [mig]
        assert node.instances() == [("3g.40gb", 1)]
        node.gone("retried")
        wait_for(
            "the MIG device destroyed at Unprepare",
            lambda: node.instances() == [] or NotYet(node.instances()),
            timeout=90,
        )
