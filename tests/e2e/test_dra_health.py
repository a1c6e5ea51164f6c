"""GPU health in DRA, on a real API server and scheduler: the DRA plugin's own process (its
GPU health gate on) publishes a fallen GPU's device tainted with NVIDIA's key within 10 s and
sets GPUHealthy False on the Node; the scheduler then places the next claim on the other GPU
and leaves one more Pending; once the GPU has been quiet for the quiet period the taint goes
and the pending claim is placed on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.kube import Kube
from gpu_operator.labels import GPU_HEALTHY_CONDITION
from gpu_operator.render.dra import device_classes
from gpu_operator.sim.nvml.injection import clear_faults, inject_fault

from .support import NotYet, private_cluster, wait_for

NS = "gpus"
QUIET_S = 6


@pytest.fixture
def plugin(testenv_bin_dir: Path, tmp_path: Path) -> Iterator[tuple[Kube, str, Path]]:
    with private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        (node,) = [n["metadata"]["name"] for n in kube.list_objects("Node")]
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_for("the default ServiceAccount", lambda: kube.get("ServiceAccount", "default", NS))
        for obj in device_classes():
            kube.apply(obj)
        state = tmp_path / "nvml.json"
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "NODE_NAME": node,
            "GPU_OPERATOR_SIMULATE": "a100-40gb:2",
            "GPU_OPERATOR_SIMULATE_STATE": str(state),
            "FEATURE_GATES": "NVMLDeviceHealthCheck=true",
            "GPU_HEALTH_QUIET_PERIOD": f"{QUIET_S}s",
        }
        with (tmp_path / "dra-plugin.log").open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpu_operator", "agent", "dra-plugin", "--publish-only",
                 "--interval", "0.5", "--health-poll-ms", "200"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                wait_for("the node's pool", lambda: len(_devices(kube, node)) == 2, timeout=60)
                yield kube, node, state
            finally:
                process.terminate()
                process.wait(timeout=30)
        print((tmp_path / "dra-plugin.log").read_text()[-3000:])


def _devices(kube: Kube, node: str) -> dict[str, dict[str, Any]]:
    found = kube.list_objects("ResourceSlice", field_selector=f"spec.nodeName={node}")
    return {d["name"]: d for s in found for d in s["spec"].get("devices") or []}


def _taints(kube: Kube, node: str) -> dict[str, list[tuple[str, str | None]]]:
    return {
        name: [(t["key"], t.get("value")) for t in d.get("taints") or []]
        for name, d in _devices(kube, node).items()
    }


def _healthy(kube: Kube, node: str) -> str | None:
    conditions = (kube.get("Node", node) or {}).get("status", {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == GPU_HEALTHY_CONDITION), None)


def _pod_with_claim(kube: Kube, node: str) -> str:
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    kube.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    })  # fmt: skip
    kube.create({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    })  # fmt: skip
    return name


def _allocated(kube: Kube, name: str) -> str | NotYet:
    claim = kube.get("ResourceClaim", name, NS) or {}
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    devices = [r["device"] for r in results.get("results") or []]
    if devices:
        return devices[0]
    pod = kube.get("Pod", name, NS) or {}
    return NotYet(
        {"claim": claim.get("status"), "pod": (pod.get("status") or {}).get("conditions")}
    )


def _unschedulable(kube: Kube, name: str) -> str | NotYet:
    pod = kube.get("Pod", name, NS) or {}
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
            return str(c.get("message"))
    return NotYet({"pod status": pod.get("status")})


def test_a_fallen_gpu_is_tainted_in_the_slice_claims_go_elsewhere_and_it_comes_back(
    plugin: tuple[Kube, str, Path],
) -> None:
    kube, node, state = plugin
    assert _taints(kube, node) == {"gpu-0": [], "gpu-1": []}
    inject_fault(state, 0, "xid", 79)
    injected = time.monotonic()
    wait_for(
        "gpu-0 tainted with XID 79",
        lambda: (
            (got := _taints(kube, node))["gpu-0"] == [("gpu.nvidia.com/xid", "79")] or NotYet(got)
        ),
        timeout=10,
    )
    tainted_after = time.monotonic() - injected
    assert _taints(kube, node)["gpu-1"] == []
    wait_for(
        "GPUHealthy False", lambda: _healthy(kube, node) == "False" or NotYet(_healthy(kube, node))
    )
    clear_faults(state, 0)  # the XID was one event: the quiet period starts from it

    first = _pod_with_claim(kube, node)
    assert wait_for("the first claim allocated", lambda: _allocated(kube, first)) == "gpu-1"
    second = _pod_with_claim(kube, node)
    reason = wait_for("the second pod unschedulable", lambda: _unschedulable(kube, second))
    assert "cannot allocate all claims" in reason or "resourceclaim" in reason.lower(), reason

    wait_for(
        "the taint gone after the quiet period",
        lambda: (got := _taints(kube, node))["gpu-0"] == [] or NotYet(got),
        timeout=QUIET_S + 30,
    )
    assert time.monotonic() - injected >= QUIET_S  # not before the quiet period
    assert wait_for("the second claim placed on gpu-0", lambda: _allocated(kube, second)) == "gpu-0"
    wait_for(
        "GPUHealthy True", lambda: _healthy(kube, node) == "True" or NotYet(_healthy(kube, node))
    )
    print(f"tainted {tainted_after:.1f}s after the XID")
