"""The GPUCluster loop's shell on the fake API: a refused write is retried by the pass itself."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpu_operator.controller.gpucluster.reconciler import GPUClusterController
from gpu_operator.controller.runtime.loop import REFUSED_RETRY_S
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.reconciler import run_pass
from tests.fakes.kube import FakeKube
from tests.unit.controller.builders import CONFIG
from tests.unit.controller.gpucluster.test_decide import cluster, node


def controller_on(kube: FakeKube) -> GPUClusterController:
    """The loop's shell over ``kube``, its indexes holding one GPUCluster and one GPU node."""
    stores: dict[str, list[Any]] = {
        "gpuclusters": [cluster()], "nodes": [node("gpu-a")], "clusterpolicies": [],
        "daemonsets": [],
    }  # fmt: skip
    return GPUClusterController(
        kube, CONFIG, PrometheusMetrics(), lambda index: stores[index], lambda nodes: None
    )


def test_a_refused_apply_is_retried_by_itself_and_not_again_once_applied() -> None:
    """No watch event follows a refused write: the pass itself asks to be run again."""
    kube = FakeKube().add(cluster(), {"kind": "Node", "metadata": {"name": "gpu-a"}})
    controller = controller_on(kube)
    kube.refuse("apply", "DeviceClass", status=409, times=1)
    start = time.time()
    retry = asyncio.run(run_pass(controller, False))
    end = time.time()
    assert retry is not None and start + REFUSED_RETRY_S <= retry <= end + REFUSED_RETRY_S
    assert asyncio.run(run_pass(controller, False)) is None
    assert kube.obj("DeviceClass", "gpu.nvidia.com") is not None


def test_without_dras_api_nothing_is_applied_and_discovery_is_asked_again_only_at_resync() -> None:
    kube = FakeKube(unserved=frozenset({"resource.k8s.io/v1"}), server_release="v1.33.13")
    kube.add(cluster())
    controller = controller_on(kube)
    for resync in (False, False, True):
        asyncio.run(run_pass(controller, resync))
    asked = [c for c in kube.calls if c.kind == "discovery"]
    assert [c.name for c in asked] == ["resource.k8s.io/v1"] * 2  # the first pass, the resync
    assert [w for w in kube.writes if w[0] == "apply"] == []
    ready = {c["type"]: c for c in kube.obj("GPUCluster", "gpu-cluster")["status"]["conditions"]}
    assert ready["Ready"]["reason"] == "KubernetesTooOld"
    assert "v1.33.13" in ready["Ready"]["message"]
