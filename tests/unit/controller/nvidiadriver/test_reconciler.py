"""The NVIDIADriver shell on the fake API: it creates the default NVIDIADriver, labels the
pool, applies its DaemonSet, writes status, and then stays silent."""

from __future__ import annotations

import asyncio

from gpu_operator.controller.nvidiadriver.reconciler import NVIDIADriverController
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.reconciler import run_pass
from gpu_operator.labels import DRIVER_POOL
from tests.fakes.kube import FakeKube
from tests.unit.controller.builders import CONFIG, gpu_node, node_object, policy
from tests.unit.controller.clusterpolicy.test_reconciler import refresh


def test_default_driver_created_applied_and_then_silent() -> None:
    kube = FakeKube().add(
        policy(spec={"driver": {"useNvidiaDriverCRD": True, "version": "570.172.08"}},
               finalizers=()),
        node_object(gpu_node("gpu-1")),
    )  # fmt: skip
    controller = NVIDIADriverController(kube, CONFIG, PrometheusMetrics())
    indexes = refresh(kube, {})
    controller.watching(indexes)
    writes = []
    with asyncio.Runner() as runner:
        for _ in range(6):
            before = len(kube.writes)
            runner.run(run_pass(controller, False))
            for created in kube.of_kind("NVIDIADriver"):  # the API server gives each a uid
                created["metadata"].setdefault("uid", "uid-default")
            refresh(kube, indexes)
            writes.append(len(kube.writes) - before)
            if writes[-1] == 0:
                break
    assert writes[-1] == 0, writes
    (default,) = kube.of_kind("NVIDIADriver")
    assert default["spec"]["default"] is True and default["spec"]["version"] == "570.172.08"
    node = kube.get("Node", "gpu-1") or {}
    assert node["metadata"]["labels"][DRIVER_POOL] == "default"
    (ds,) = [d for d in kube.of_kind("DaemonSet") if d["metadata"]["name"].startswith("nvidia-gpu")]
    assert ds["metadata"]["ownerReferences"][0]["kind"] == "NVIDIADriver"
    assert (default.get("status") or {}).get("state") == "notReady"  # no pod has run yet


def test_a_pool_label_written_counts_before_the_node_watch_shows_it() -> None:
    """Read your own writes: a pass right after the nodes were labelled, on a node store that
    does not show the labels yet, sees the nodes in their pool (it neither labels them again
    nor, in a move, moves more of them); once the store shows them the record goes."""
    kube = FakeKube().add(
        policy(spec={"driver": {"useNvidiaDriverCRD": True, "version": "570.172.08"}},
               finalizers=()),
        node_object(gpu_node("gpu-1")),
        node_object(gpu_node("gpu-2")),
    )  # fmt: skip
    controller = NVIDIADriverController(kube, CONFIG, PrometheusMetrics())
    indexes = refresh(kube, {})
    controller.watching(indexes)

    def node_patches(since: int) -> int:
        return sum(1 for w in kube.writes[since:] if w[:2] == ("patch", "Node"))

    with asyncio.Runner() as runner:
        runner.run(run_pass(controller, False))  # creates the default NVIDIADriver
        (default,) = kube.of_kind("NVIDIADriver")
        default["metadata"].setdefault("uid", "uid-default")
        refresh(kube, indexes)
        stale = dict(indexes["nodes"])
        before = len(kube.writes)
        runner.run(run_pass(controller, False))
        assert node_patches(before) == 2 and set(controller.written) == {"gpu-1", "gpu-2"}
        refresh(kube, indexes)
        indexes["nodes"].clear()
        indexes["nodes"].update(stale)  # the node watch behind: no pool label shown
        before = len(kube.writes)
        runner.run(run_pass(controller, False))
        assert node_patches(before) == 0
        refresh(kube, indexes)  # the node watch caught up
        runner.run(run_pass(controller, False))
        assert controller.written == {}
