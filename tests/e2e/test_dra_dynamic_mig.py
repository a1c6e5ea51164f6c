"""DynamicMIG pools against the real API server (partitionable devices on) and the real
kube-scheduler: the partitions of a GPU no one has cut yet are published with their counter
set, claims selecting a profile by CEL are placed on partitions that do not overlap, and a
claim the GPU's remaining counters cannot hold stays Pending with the scheduler's reason
until the others go.

kwok plays the kubelets, as in test_dra (no Prepare here: creating the MIG devices at Prepare
is test_dra_dynamic_mig in the unit tier, on simulated NVML). The slices come from the
publisher the plugin runs with its DynamicMIG gate on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra import slices as dra_slices
from gpu_operator.kube import Kube
from gpu_operator.render.dra import device_classes
from gpu_operator.sim import dra as sim_dra
from gpu_operator.testenv import nodes as testenv_nodes
from tests.e2e.support import NotYet, private_cluster, wait_for

NS = "dynamic-mig"
DRIVER = dra_devices.DRIVER
NODES = {"dyn-h100": "h100-80gb:1", "dyn-a100": "a100-40gb:1"}  # the A100 out of MIG mode
A = f"device.attributes['{DRIVER}']"
NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")


def claim(name: str, device_class: str, selector: str) -> dict[str, Any]:
    request = {"deviceClassName": device_class, "selectors": [{"cel": {"expression": selector}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {"name": "cuda", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def allocated(kube: Kube, name: str) -> tuple[str, str] | NotYet:
    """The (pool, device) the claim was given, once it was."""
    obj = kube.get("ResourceClaim", name, NS) or {}
    results = ((obj.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
    if not results:
        return NotYet({"claim": name, "status": obj.get("status")})
    (one,) = results
    return one["pool"], one["device"]


def unschedulable(kube: Kube, name: str) -> str | NotYet:
    obj = kube.get("Pod", name, NS) or {}
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message") or "")
    return NotYet({"pod": name, "status": obj.get("status")})


def memory_slices(device: dict[str, Any]) -> set[str]:
    (consumed,) = device["consumesCounters"]
    return {k for k in consumed["counters"] if k.startswith("memory-slice-")}


@pytest.fixture(scope="module")
def cluster_kube(testenv_bin_dir: Any) -> Iterator[Kube]:
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        cluster.create_nodes([testenv_nodes.node_manifest(n, gpu=True) for n in NODES])
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_for("the default ServiceAccount", lambda: kube.get("ServiceAccount", "default", NS))
        for obj in device_classes():
            kube.apply(obj)
        sim_dra.publish_simulated(kube, NODES, dynamic_mig=True)
        yield kube


def h100_slices(kube: Kube) -> list[dict[str, Any]]:
    return kube.list_objects("ResourceSlice", field_selector=dra_slices.field_selector("dyn-h100"))


def test_the_api_server_takes_each_gpu_with_its_counter_set_as_the_release_wants(
    cluster_kube: Kube,
) -> None:
    """1.34 takes a GPU's counter set in the slice of its devices; from 1.35 a slice holding
    counter sets holds nothing else, so they have one of their own."""
    kube = cluster_kube
    layout = dra_slices.dynamic_layout(kube.server_version())
    slices = h100_slices(kube)
    if layout == dra_slices.COMBINED:
        assert len(slices) == 1
    else:
        assert layout == dra_slices.SPLIT and len(slices) == 2
        assert sorted(bool(s["spec"].get("devices")) for s in slices) == [False, True]
        assert sorted(bool(s["spec"].get("sharedCounters")) for s in slices) == [False, True]
    (counter_set,) = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
    assert counter_set["name"] == "gpu-0-counter-set"
    assert {f"memory-slice-{i}" for i in range(8)} <= set(counter_set["counters"])
    names = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
    assert "gpu-0" in names and "gpu-0-mig-1g10gb-19-6" in names and "gpu-0-mig-7g80gb-0-0" in names
    assert len(names) == 26  # the whole GPU and every H100 profile x placement
    (a100,) = kube.list_objects(
        "ResourceSlice", field_selector=dra_slices.field_selector("dyn-a100")
    )
    assert "sharedCounters" not in a100["spec"], "an A100 out of MIG mode is offered whole only"
    assert [d["name"] for d in a100["spec"]["devices"]] == ["gpu-0"]
    again = sim_dra.publish_simulated(kube, NODES, dynamic_mig=True)
    assert sum(p.writes for p in again.values()) == 0, "the stored pools read back equal"


def test_partitions_are_placed_apart_and_one_too_many_waits_with_the_schedulers_reason(
    cluster_kube: Kube,
) -> None:
    kube = cluster_kube
    devices = {d["name"]: d for s in h100_slices(kube) for d in s["spec"].get("devices") or []}
    wanted = {"small": "1g.10gb", "medium": "3g.40gb"}
    for name, profile in wanted.items():
        kube.create(claim(name, "mig.nvidia.com", f"{A}.profile == '{profile}'"))
        kube.create(pod(name))
    given = {
        name: wait_for(f"the {name} claim allocated", lambda n=name: allocated(kube, n), timeout=60)
        for name in wanted
    }
    for name, (node, device) in given.items():
        assert node == "dyn-h100"
        match = NAME.match(device)
        assert match and devices[device]["attributes"]["profile"]["string"] == wanted[name]
    small, medium = (memory_slices(devices[given[n][1]]) for n in ("small", "medium"))
    assert small and medium and not small & medium, "the partitions share no memory slice"

    # The whole GPU's 8 memory slices cannot be had while two are taken, wherever they are.
    kube.create(claim("large", "mig.nvidia.com", f"{A}.profile == '7g.80gb'"))
    kube.create(pod("large"))
    kube.create(claim("whole", "gpu.nvidia.com", f"{A}.productName == 'NVIDIA H100 80GB HBM3'"))
    kube.create(pod("whole"))
    for name in ("large", "whole"):
        reason = wait_for(f"{name} reported unschedulable", lambda n=name: unschedulable(kube, n))
        assert "cannot allocate all claims" in reason, reason
        assert not (kube.get("Pod", name, NS) or {})["spec"].get("nodeName")

    kube.delete("Pod", "whole", NS, grace_period_seconds=0)
    for name in wanted:
        kube.delete("Pod", name, NS, grace_period_seconds=0)
        kube.delete("ResourceClaim", name, NS)
    node, device = wait_for(
        "the 7g.80gb claim allocated once the GPU is free",
        lambda: allocated(kube, "large"),
        timeout=120,
    )
    assert (node, device) == ("dyn-h100", "gpu-0-mig-7g80gb-0-0")
