"""DRA against the real local control plane: ResourceSlices for 20 simulated GPU nodes of mixed
products, ResourceClaims allocated by the real kube-scheduler, a MIG reconfiguration
republished by the plugin's own process.

kwok plays the kubelets (it runs no DRA plugin, so pods become Running without
NodePrepareResources; the gRPC side is covered through its sockets in the unit tests). The
slices come from the same publisher the plugin runs, fed by the simulated NVML profiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.agent import migparted
from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra import slices as dra_slices
from gpu_operator.agent.nvml import Nvml
from gpu_operator.kube import Kube
from gpu_operator.render.dra import device_classes
from gpu_operator.sim import dra as sim_dra
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml
from gpu_operator.testenv import nodes as testenv_nodes
from tests.e2e.support import NotYet, private_cluster, wait_for

NS = "dra-e2e"
DRIVER = dra_devices.DRIVER
MIG_NODE = "dra-a100-mig"
LAYOUTS = migparted.parse_mig_config(
    """
version: v1
mig-configs:
  mixed:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 4}
"""
)
# 20 nodes: name -> simulated GPUs.
FLEET = {
    **{f"dra-a100-{i}": "a100-40gb:8" for i in range(6)},
    **{f"dra-h100-{i}": "h100-80gb:8" for i in range(6)},
    **{f"dra-t4-{i}": "t4:1" for i in range(4)},
    **{f"dra-l4-{i}": "l4:2" for i in range(3)},
    MIG_NODE: "a100-40gb:8",
}
A = f"device.attributes['{DRIVER}']"
C = f"device.capacity['{DRIVER}']"
# template -> (device class, CEL selector, the same predicate in Python, pods)
Predicate = Callable[[dict[str, Any]], bool]


def attr(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"].get(name) or {}
    return next(iter(value.values()), None)


def mem_mib(device: dict[str, Any]) -> int:
    text = device["capacity"]["memory"]["value"]
    units = {"Mi": 1, "Gi": 1024}
    return int(text[:-2]) * units[text[-2:]]


TEMPLATES: dict[str, tuple[str, str, Predicate, int]] = {
    "a100": (
        "gpu.nvidia.com",
        f"{A}.productName == 'NVIDIA A100-SXM4-40GB'",
        lambda d: attr(d, "type") == "gpu" and attr(d, "productName") == "NVIDIA A100-SXM4-40GB",
        18,
    ),
    "h100": (
        "gpu.nvidia.com",
        f"{A}.productName == 'NVIDIA H100 80GB HBM3'",
        lambda d: attr(d, "type") == "gpu" and attr(d, "productName") == "NVIDIA H100 80GB HBM3",
        10,
    ),
    "mem-70gi": (
        "gpu.nvidia.com",
        f"{C}.memory.compareTo(quantity('70Gi')) >= 0",
        lambda d: attr(d, "type") == "gpu" and mem_mib(d) >= 70 * 1024,
        10,
    ),
    "mem-20-30gi": (
        "gpu.nvidia.com",
        f"{C}.memory.compareTo(quantity('20Gi')) >= 0 && "
        f"{C}.memory.compareTo(quantity('30Gi')) <= 0",
        lambda d: attr(d, "type") == "gpu" and 20 * 1024 <= mem_mib(d) <= 30 * 1024,
        4,
    ),
    "t4": (
        "gpu.nvidia.com",
        f"{A}.productName == 'Tesla T4'",
        lambda d: attr(d, "type") == "gpu" and attr(d, "productName") == "Tesla T4",
        4,
    ),
    "mig-1g": (
        "mig.nvidia.com",
        f"{A}.type == 'mig' && {A}.profile == '1g.5gb'",
        lambda d: attr(d, "type") == "mig" and attr(d, "profile") == "1g.5gb",
        10,
    ),
    "mig-3g": (
        "mig.nvidia.com",
        f"{A}.type == 'mig' && {A}.profile == '3g.20gb'",
        lambda d: attr(d, "type") == "mig" and attr(d, "profile") == "3g.20gb",
        4,
    ),
}


def claim_template(name: str, device_class: str, selector: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": device_class,
                                "selectors": [{"cel": {"expression": selector}}],
                            },
                        }
                    ]
                }
            }
        },
    }


def pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"template": template}},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu22.04",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def apply_mig_layout(state: Path, layout: str) -> None:
    """What the MIG manager does on the node: mig-parted's apply on the node's NVML."""
    install_simulated_nvml(FLEET[MIG_NODE], seed=MIG_NODE, state_file=state)
    try:
        with Nvml() as nvml:
            migparted.apply_config(nvml, LAYOUTS, layout)
    finally:
        uninstall_simulated_nvml()


def pool(kube: Kube, node: str) -> list[dict[str, Any]]:
    return kube.list_objects("ResourceSlice", field_selector=dra_slices.field_selector(node))


def published(kube: Kube) -> dict[tuple[str, str], dict[str, Any]]:
    """(pool, device) -> device, over every slice of the driver."""
    found = {}
    for s in kube.list_objects("ResourceSlice", field_selector=f"spec.driver={DRIVER}"):
        for d in s["spec"].get("devices") or []:
            found[(s["spec"]["pool"]["name"], d["name"])] = d
    return found


def allocations(kube: Kube) -> dict[str, list[tuple[str, str]]]:
    """Claim name -> the (pool, device) pairs allocated to it."""
    out = {}
    for c in kube.list_objects("ResourceClaim", NS):
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        if results:
            out[c["metadata"]["name"]] = [(r["pool"], r["device"]) for r in results]
    return out


def released(kube: Kube) -> bool | NotYet:
    """True once no claim holds a device; else the claims that still do."""
    left = allocations(kube)
    return not left or NotYet({"allocated": sorted(left)})


@pytest.fixture(scope="module")
def dra_cluster(
    testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[testenv.Cluster, Kube, Path]]:
    state_dir = tmp_path_factory.mktemp("dra-nvml")
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        cluster.create_nodes([testenv_nodes.node_manifest(n, gpu=True) for n in FLEET])
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_for(
            "the default ServiceAccount in the namespace",
            lambda: kube.get("ServiceAccount", "default", NS),
        )
        for obj in device_classes():
            kube.apply(obj)
        apply_mig_layout(state_dir / f"{MIG_NODE}.json", "mixed")
        others = {n: s for n, s in FLEET.items() if n != MIG_NODE}
        sim_dra.publish_simulated(kube, others)
        # The MIG node runs the plugin's own process, which follows its NVML.
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "NODE_NAME": MIG_NODE,
            "GPU_OPERATOR_SIMULATE": FLEET[MIG_NODE],
            "GPU_OPERATOR_SIMULATE_STATE": str(state_dir / f"{MIG_NODE}.json"),
        }
        log = (state_dir / "dra-plugin.log").open("w")
        plugin = subprocess.Popen(
            [sys.executable, "-m", "gpu_operator", "agent", "dra-plugin", "--publish-only",
             "--interval", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for("the MIG node's pool", lambda: pool(kube, MIG_NODE), timeout=60)
            yield cluster, kube, state_dir
        finally:
            plugin.terminate()
            plugin.wait(timeout=30)
            log.close()


def test_every_node_publishes_its_pool_field_by_field(
    dra_cluster: tuple[testenv.Cluster, Kube, Path],
) -> None:
    _, kube, state_dir = dra_cluster
    everything = published(kube)
    per_pool = Counter(p for p, _ in everything)
    assert set(per_pool) == set(FLEET)
    assert per_pool["dra-a100-0"] == per_pool["dra-h100-0"] == 8
    assert per_pool["dra-t4-0"] == 1 and per_pool["dra-l4-0"] == 2
    assert per_pool[MIG_NODE] == 32  # 8 GPUs x (2 x 1g.5gb + 2g.10gb + 3g.20gb)
    for node in FLEET:
        (one,) = pool(kube, node)
        # Generation 1 unless a MIG reconfiguration (another test) republished the pool since.
        assert one["spec"]["pool"]["name"] == node and one["spec"]["pool"]["generation"] >= 1
        assert one["spec"]["pool"]["resourceSliceCount"] == 1
        assert one["metadata"]["ownerReferences"][0]["name"] == node

    # One GPU and one MIG device, field by field against what the node's NVML reports.
    inventory = sim_dra.simulated_inventory(FLEET["dra-h100-3"], "dra-h100-3")
    gpu = inventory.gpus[5]
    assert everything[("dra-h100-3", "gpu-5")] == {
        "name": "gpu-5",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
            "index": {"int": 5},
            "minor": {"int": 5},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "resource.kubernetes.io/pciBusID": {"string": dra_devices.bus_id(gpu.pci_bus_id)},
        },
        "capacity": {"memory": {"value": "81559Mi"}},
    }
    mig_inventory = sim_dra.simulated_inventory(
        FLEET[MIG_NODE], MIG_NODE, state_dir / f"{MIG_NODE}.json"
    )
    parent = mig_inventory.gpus[2]
    mig = next(m for m in parent.mig_devices if m.profile == "2g.10gb")
    device = everything[(MIG_NODE, "gpu-2-mig-2g10gb-14-0")]
    assert device["attributes"]["uuid"] == {"string": mig.uuid}
    assert device["attributes"]["parentUUID"] == {"string": parent.uuid}
    assert device["attributes"]["profile"] == {"string": "2g.10gb"}
    assert device["attributes"]["type"] == {"string": "mig"}
    assert device["capacity"]["memory"] == {"value": "9856Mi"}
    assert device["capacity"]["multiprocessors"] == {"value": "28"}
    assert {k for k in device["capacity"] if k.startswith("memorySlice")} == {
        "memorySlice0",
        "memorySlice1",
    }


def test_claims_are_allocated_by_the_scheduler_to_exactly_the_matching_devices(
    dra_cluster: tuple[testenv.Cluster, Kube, Path],
) -> None:
    _, kube, _ = dra_cluster
    for name, (device_class, selector, _, _) in TEMPLATES.items():
        kube.create(claim_template(name, device_class, selector))
    impossible = claim_template("b200", "gpu.nvidia.com", f"{A}.productName == 'NVIDIA B200'")
    kube.create(impossible)
    pods = [(f"{name}-{i}", name) for name, (*_, count) in TEMPLATES.items() for i in range(count)]
    assert len(pods) == 60
    for pod_name, template in pods:
        kube.create(pod(pod_name, template))
    kube.create(pod("b200-0", "b200"))

    def all_scheduled() -> bool | NotYet:
        placed = [p for p in kube.list_objects("Pod", NS) if (p["spec"].get("nodeName") or "")]
        return len(placed) == 60 or NotYet({"scheduled": len(placed)})

    wait_for("60 pods scheduled with their claims allocated", all_scheduled, timeout=180)
    allocated = allocations(kube)
    everything = published(kube)
    by_pod = {p["metadata"]["name"]: p for p in kube.list_objects("Pod", NS)}
    seen: Counter[tuple[str, str]] = Counter()
    for pod_name, template in pods:
        status = by_pod[pod_name]["status"].get("resourceClaimStatuses") or []
        (claim_name,) = [s["resourceClaimName"] for s in status if s["name"] == "gpu"]
        (pair,) = allocated[claim_name]
        seen[pair] += 1
        predicate = TEMPLATES[template][2]
        assert predicate(everything[pair]), (pod_name, pair)
        assert by_pod[pod_name]["spec"]["nodeName"] == pair[0]  # the pool is the node
    assert max(seen.values()) == 1, "a device was allocated twice"
    assert len(seen) == 60

    # Nothing publishes a B200: the pod stays pending, and the scheduler says why.
    def unschedulable() -> str | NotYet:
        obj = kube.get("Pod", "b200-0", NS) or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        for c in conditions:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c.get("message") or "")
        return NotYet({"conditions": conditions})

    message = wait_for("the B200 pod reported unschedulable", unschedulable, timeout=60)
    assert "cannot allocate all claims" in message, message
    assert not (kube.get("Pod", "b200-0", NS) or {})["spec"].get("nodeName")

    # Pods gone: their claims go with them, and every device is free again.
    for pod_name, _ in [*pods, ("b200-0", "b200")]:
        kube.delete("Pod", pod_name, NS, grace_period_seconds=0)
    wait_for("every claim released", lambda: released(kube), timeout=120)
    wait_for(
        "the generated claims deleted",
        lambda: (
            not (claims := kube.list_objects("ResourceClaim", NS))
            or NotYet([c["metadata"]["name"] for c in claims])
        ),
        timeout=120,
    )


def test_a_mig_reconfiguration_is_republished_and_satisfies_a_claim_for_the_new_profile(
    dra_cluster: tuple[testenv.Cluster, Kube, Path],
) -> None:
    _, kube, state_dir = dra_cluster
    (before,) = pool(kube, MIG_NODE)
    generation = before["spec"]["pool"]["generation"]
    name = f"mig-1g10gb-{uuid.uuid4().hex[:6]}"
    kube.create(claim_template(name, "mig.nvidia.com", f"{A}.profile == '1g.10gb'"))
    apply_mig_layout(state_dir / f"{MIG_NODE}.json", "all-1g.10gb")

    def republished() -> dict[str, Any] | NotYet:
        # The plugin publishes what NVML shows each second, so a pass in the middle of the
        # reconfiguration may publish (and bump past) an intermediate layout.
        (now,) = pool(kube, MIG_NODE)
        profiles = Counter(attr(d, "profile") for d in now["spec"]["devices"])
        done = profiles == {"1g.10gb": 32} and now["spec"]["pool"]["generation"] > generation
        seen = {"profiles": dict(profiles), "generation": now["spec"]["pool"]["generation"]}
        return now if done else NotYet(seen)

    wait_for("the plugin to republish the new layout", republished, timeout=30)
    kube.create(pod(name, name))

    def placed() -> str | NotYet:
        obj = kube.get("Pod", name, NS) or {}
        node: str | None = obj["spec"].get("nodeName")
        return node or NotYet({"conditions": (obj.get("status") or {}).get("conditions")})

    assert wait_for("the 1g.10gb pod scheduled", placed, timeout=60) == MIG_NODE
    (claim,) = [c for c in allocations(kube).values()]
    (pair,) = claim
    assert pair[0] == MIG_NODE and "-mig-1g10gb-" in pair[1]
    kube.delete("Pod", name, NS, grace_period_seconds=0)
    # Back to the module's layout, so the other tests (in any order) see the fleet they expect.
    wait_for("the 1g.10gb claim released", lambda: released(kube), timeout=120)
    apply_mig_layout(state_dir / f"{MIG_NODE}.json", "mixed")
    mixed = Counter(attr(d, "profile") for d in before["spec"]["devices"])

    def mixed_again() -> bool | NotYet:
        profiles = Counter(attr(d, "profile") for d in pool(kube, MIG_NODE)[0]["spec"]["devices"])
        return profiles == mixed or NotYet({"profiles": dict(profiles)})

    wait_for("the mixed layout republished", mixed_again, timeout=60)


def test_an_unchanged_inventory_writes_nothing(
    dra_cluster: tuple[testenv.Cluster, Kube, Path],
) -> None:
    _, kube, _ = dra_cluster
    plans = sim_dra.publish_simulated(kube, {"dra-t4-0": FLEET["dra-t4-0"]})
    assert plans["dra-t4-0"].writes == 0
