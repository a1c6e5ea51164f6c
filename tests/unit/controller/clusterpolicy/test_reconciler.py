"""The ClusterPolicy shell: observe the indexes, decide, execute on a fake API, remember.

The watches are stood in for by :func:`refresh`, which fills the informer's stores from the fake
API server's objects the way the real index handlers do (``watch.index_value``, the same label
selectors, the operator's namespace for namespaced kinds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterator
from typing import Any, ClassVar, TypeVar

import pytest

from gpu_operator.controller.clusterpolicy.decide import FINALIZER
from gpu_operator.controller.clusterpolicy.reconciler import ClusterPolicyController, Inbox
from gpu_operator.controller.nvidiadriver.reconciler import NVIDIADriverController
from gpu_operator.controller.runtime.loop import MAX_REFUSED_RETRY_S, REFUSED_RETRY_S
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.reconciler import run_pass
from gpu_operator.controller.runtime.watch import OUR_GROUP, WATCHED, Watched, index_value
from gpu_operator.kinds import KINDS
from gpu_operator.labels import (
    DEPLOY_PREFIX,
    GPU_PRESENT,
    MANAGED_BY,
    OPERATOR_NAME,
    UPGRADE_STATE,
)
from gpu_operator.views import NodeView
from tests.fakes.kube import FakeKube
from tests.unit.controller.builders import (
    CONFIG,
    NAMESPACE,
    cpu_node,
    gpu_node,
    node_object,
    pod,
    policy,
    revision,
)

T = TypeVar("T")
Indexes = dict[str, dict[tuple[str, str], Any]]


def refresh(kube: FakeKube, indexes: Indexes) -> Indexes:
    """What the informer's stores hold for the fake's current objects (updated in place: the
    controller keeps the live stores)."""
    for w in WATCHED:
        # An optional kind is served once its CRD is there (the operator installs its own).
        crd = kube.obj("CustomResourceDefinition", f"{w.kind.plural}.{w.kind.group}")
        if w.optional and w.kind.group != OUR_GROUP and crd is None:
            indexes.pop(w.index, None)  # not served: no store, as the informer keeps it
            continue
        namespace = NAMESPACE if w.kind.namespaced else None
        objects = kube.list_objects(w.kind.kind, namespace, label_selector=w.selector)
        index = indexes.setdefault(w.index, {})
        index.clear()
        for obj in objects:
            meta = obj["metadata"]
            index[(meta.get("namespace") or "", meta["name"])] = index_value(w.index, obj)
    return indexes


class Harness:
    """The controller on a fake API, its passes on one event loop as in the operator."""

    opened: ClassVar[list[asyncio.Runner]] = []

    def __init__(self, kube: FakeKube) -> None:
        self.runner = asyncio.Runner()
        Harness.opened.append(self.runner)
        self.kube = kube
        self.metrics = PrometheusMetrics()
        self.controller = ClusterPolicyController(kube, CONFIG, self.metrics)
        self.indexes: Indexes = refresh(kube, {})
        self.controller.watching(self.indexes)

    def run_pass(self, resync: bool = False) -> float | None:
        """One pass; afterwards the watches report what it changed (nodes included)."""
        before = {n.name: n for n in self._nodes()}
        requeue = self.run(run_pass(self.controller, resync))
        refresh(self.kube, self.indexes)
        for node in self._nodes():
            if before.get(node.name) != node:
                self.controller.notify(Watched(KINDS["Node"]), ("", node.name))
        return requeue

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(asyncio.wait_for(coro, timeout=60))

    def converge(self, passes: int = 6) -> int:
        """Passes until one writes nothing; how many wrote."""
        for n in range(passes):
            count = len(self.kube.writes)
            self.run_pass()
            if len(self.kube.writes) == count:
                return n
        raise AssertionError(f"still writing after {passes} passes: {self.kube.writes[-5:]}")

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def _nodes(self) -> list[NodeView]:
        return list(self.indexes["nodes"].values())


@pytest.fixture(autouse=True)
def _close_event_loops() -> Iterator[None]:
    yield
    while Harness.opened:
        Harness.opened.pop().close()


def cluster(spec: dict[str, Any] | None = None, *extra: dict[str, Any]) -> FakeKube:
    return FakeKube().add(
        policy(spec=spec, finalizers=()),
        node_object(gpu_node("gpu-1")),
        node_object(cpu_node("cpu-1")),
        *extra,
    )


def make_daemonsets_ready(kube: FakeKube) -> None:
    """What the DaemonSet controller and kubelets would do: every pod up and current."""
    for ds in kube.of_kind("DaemonSet"):
        ds["status"] = {"desiredNumberScheduled": 1, "numberReady": 1, "numberAvailable": 1,
                        "updatedNumberScheduled": 1, "observedGeneration": 1}  # fmt: skip
        if ds["spec"].get("updateStrategy", {}).get("type") == "OnDelete":
            uid, name = ds["metadata"]["uid"], ds["metadata"]["name"]
            managed = {MANAGED_BY: OPERATOR_NAME}
            rev = revision(uid, 1, f"{name}-1")
            rev["metadata"]["labels"] |= managed
            pod_ = pod(f"{name}-gpu-1", owner_uid=uid, revision=f"{name}-1", labels=managed)
            pod_["metadata"]["ownerReferences"][0]["name"] = name
            kube.add(rev, pod_)


def test_a_fresh_cluster_converges_and_then_costs_no_write() -> None:
    h = Harness(cluster())
    assert h.converge() >= 2
    kube = h.kube
    cp = kube.obj("ClusterPolicy", "cluster-policy")
    assert cp is not None and FINALIZER in cp["metadata"]["finalizers"]
    assert cp["status"]["state"] == "notReady"  # nothing runs the DaemonSets here
    assert {d["metadata"]["name"] for d in kube.of_kind("DaemonSet")} >= {
        "nvidia-driver-daemonset-ubuntu22.04",
        "nvidia-device-plugin-daemonset",
    }
    gpu, cpu = kube.obj("Node", "gpu-1"), kube.obj("Node", "cpu-1")
    assert gpu is not None and cpu is not None
    assert gpu["metadata"]["labels"][GPU_PRESENT] == "true"
    assert gpu["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert not any(k.startswith("nvidia.com/") for k in cpu["metadata"]["labels"])
    assert ("create", "Event") in {(v, k) for v, k, _ in kube.writes}
    assert h.gauge("gpu_operator_gpu_nodes") == 1
    assert h.gauge("gpu_operator_clusterpolicy_ready") == 0
    assert h.gauge("gpu_operator_component_ready", component="driver") == 0

    make_daemonsets_ready(kube)
    refresh(kube, h.indexes)
    h.converge()
    cp = kube.obj("ClusterPolicy", "cluster-policy")
    assert cp is not None and cp["status"]["state"] == "ready"
    assert h.gauge("gpu_operator_clusterpolicy_ready") == 1
    assert h.gauge("gpu_operator_component_ready", component="driver") == 1
    assert h.gauge("gpu_operator_driver_upgrade_nodes", state="pending") == 0

    count = len(kube.writes)
    h.run_pass(resync=True)  # the safety net looks at everything: still nothing to write
    assert len(kube.writes) == count


def test_an_edited_object_is_put_back() -> None:
    h = Harness(cluster())
    h.converge()
    ds = h.kube.obj("DaemonSet", "nvidia-device-plugin-daemonset", NAMESPACE)
    assert ds is not None
    h.kube.apply({**ds, "spec": {**ds["spec"], "template": {"edited": True}}})
    refresh(h.kube, h.indexes)
    before = len(h.kube.writes)
    h.run_pass()
    # Put back, and the status says its rollout is starting (written in the same pass).
    assert [w[:3] for w in h.kube.writes[before:]] == [
        ("apply", "DaemonSet", "nvidia-device-plugin-daemonset"),
        ("patch", "ClusterPolicy/status", "cluster-policy"),
    ]
    restored = h.kube.obj("DaemonSet", "nvidia-device-plugin-daemonset", NAMESPACE)
    assert restored is not None and "edited" not in restored["spec"]["template"]


def test_a_refused_node_patch_is_retried_soon(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(cluster())
    h.run_pass()  # the finalizer
    h.kube.refuse("patch", "Node", "gpu-1", status=409, times=1)
    with caplog.at_level(logging.INFO, "gpu_operator.controller.clusterpolicy.reconciler"):
        requeue = h.run_pass()
    assert requeue is not None and requeue <= time.time() + REFUSED_RETRY_S
    assert "gpu-1" in h.controller.inbox.changed_nodes
    assert "1 of" in caplog.text and "actions refused" in caplog.text
    gpu = h.kube.obj("Node", "gpu-1")
    assert gpu is not None and GPU_PRESENT not in gpu["metadata"]["labels"]
    h.run_pass()
    gpu = h.kube.obj("Node", "gpu-1")
    assert gpu is not None and gpu["metadata"]["labels"][GPU_PRESENT] == "true"


def test_any_refused_write_is_retried_soon_then_less_often_while_refused() -> None:
    """A refused write brings no watch event: without a requeue the next try would wait for
    an unrelated change (the chaos suite's 20 % of writes answered 409 once left a driver
    upgrade idle for minutes)."""
    h = Harness(cluster())
    h.converge()
    h.kube.merge_patch("ClusterPolicy", "cluster-policy", {"spec": {"driver": {"version": "9"}}})
    refresh(h.kube, h.indexes)
    h.kube.refuse("apply", "DaemonSet", status=409)  # until lifted
    expected = [min(MAX_REFUSED_RETRY_S, REFUSED_RETRY_S * 2**n) for n in range(7)]
    for delay in expected:
        start = time.time()
        requeue = h.run_pass()
        end = time.time()
        assert requeue is not None, "a refused pass must look again by itself"
        # The delay counts from a moment inside the pass, however long a loaded machine makes it.
        assert start + delay <= requeue <= end + delay, (requeue - start, requeue - end, delay)
    h.kube.refusals.clear()
    h.run_pass()
    assert h.controller.loop.refusals.in_a_row == 0
    images = [
        c["image"]
        for ds in h.kube.of_kind("DaemonSet")
        if ds["metadata"]["name"].startswith("nvidia-driver-daemonset")
        for c in ds["spec"]["template"]["spec"]["containers"]
    ]
    assert images == ["nvcr.io/nvidia/driver:9-ubuntu22.04"]


def test_an_apply_failure_is_reported_then_cleared() -> None:
    h = Harness(cluster())
    h.run_pass()
    h.kube.refuse("apply", "ServiceAccount", "nvidia-driver", status=403, times=1)
    h.run_pass()
    assert h.controller.loop.wake.is_set()  # status must say so: another pass soon
    h.run_pass()  # reports it
    cp = h.kube.obj("ClusterPolicy", "cluster-policy")
    assert cp is not None
    assert "nvidia-driver" in cp["status"]["conditions"][0]["message"]
    h.converge()
    cp = h.kube.obj("ClusterPolicy", "cluster-policy")
    assert cp is not None and cp["status"]["conditions"][0]["reason"] != "ReconcileFailed"


MONITOR_SPEC = {"dcgmExporter": {"serviceMonitor": {"enabled": True}}}
MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
MONITOR_CRD_OBJECT = {"kind": "CustomResourceDefinition", "metadata": {"name": MONITOR_CRD}}


def test_without_the_prometheus_operator_no_service_monitor_is_applied() -> None:
    h = Harness(cluster(MONITOR_SPEC))
    h.converge()
    assert h.kube.of_kind("ServiceMonitor") == []
    assert "servicemonitors" not in h.indexes
    cp = h.kube.obj("ClusterPolicy", "cluster-policy")
    assert cp is not None and cp["status"]["conditions"][0]["reason"] != "ReconcileFailed"


def test_service_monitors_are_applied_once_where_their_crd_is_served() -> None:
    h = Harness(cluster(MONITOR_SPEC, MONITOR_CRD_OBJECT))
    h.converge()
    (sm,) = h.kube.of_kind("ServiceMonitor")
    applies = [w for w in h.kube.writes if w[1] == "ServiceMonitor"]
    assert len(applies) == 1
    # a resync finds it, from the watch, as applied, and writes nothing
    count = len(h.kube.writes)
    h.run_pass(resync=True)
    assert len(h.kube.writes) == count
    # someone deleted it: the watch says so, and the next pass applies it again
    h.kube.delete("ServiceMonitor", sm["metadata"]["name"], NAMESPACE)
    refresh(h.kube, h.indexes)
    h.run_pass()
    assert len(h.kube.of_kind("ServiceMonitor")) == 1


def test_a_service_monitor_follows_the_prometheus_operator_installed_later() -> None:
    h = Harness(cluster(MONITOR_SPEC))
    h.converge()
    h.kube.add(MONITOR_CRD_OBJECT)
    refresh(h.kube, h.indexes)  # the informer lists the kind once it is served
    h.run_pass()
    assert [o["metadata"]["name"] for o in h.kube.of_kind("ServiceMonitor")] == [
        "nvidia-dcgm-exporter"
    ]


def test_observe_lists_workload_pods_only_on_nodes_being_emptied() -> None:
    kube = FakeKube().add(
        node_object(gpu_node("gpu-1", upgrade_state="drain-required")),
        node_object(gpu_node("gpu-2", upgrade_state="upgrade-required")),
        pod("train-1", namespace="team", node="gpu-1"),
        pod("train-2", namespace="team", node="gpu-2"),
        {"kind": "ConfigMap", "metadata": {"name": "mine", "namespace": NAMESPACE}, "data": {}},
        {"kind": "ConfigMap", "metadata": {"name": "theirs", "namespace": "team"}, "data": {}},
    )
    h = Harness(kube)
    h.indexes["configmaps"][("team", "theirs")] = index_value(
        "configmaps", kube.of_kind("ConfigMap")[1]
    )
    snap = h.run(h.controller.observe(False))
    assert [p["metadata"]["name"] for p in snap.workload_pods] == ["train-1"]
    assert set(snap.configmap_hashes) == {"mine"}
    assert snap.changed_nodes is None  # the first pass looks at every node
    assert h.run(h.controller.observe(False)).changed_nodes == frozenset()


def test_changes_wake_the_loop_and_name_the_node() -> None:
    """(Heartbeats never get here: the informer drops events that change nothing it keeps.)"""
    h = Harness(FakeKube())
    loop = h.controller.loop
    assert loop.ready.is_set()
    loop.wake.clear()
    h.controller.notify(Watched(KINDS["Node"]), ("", "gpu-1"))
    assert loop.wake.is_set() and loop.urgent.is_set()
    assert h.controller.inbox.changed_nodes == {"gpu-1"}
    loop.wake.clear()
    loop.urgent.clear()
    h.controller.notify(Watched(KINDS["DaemonSet"]), ("ns", "ds"))
    assert loop.wake.is_set() and not loop.urgent.is_set()  # a rollout's events settle


def test_a_new_revision_wakes_both_loops() -> None:
    """An OnDelete DaemonSet's new template moves no pod: its new ControllerRevision (which can
    arrive after the DaemonSet's change, on another watch) is what puts pods out of date. Seen
    in CI: a pass woken by the DaemonSet alone found every driver pod current, and the upgrade
    waited four minutes for an unrelated change."""
    h = Harness(FakeKube())
    drivers = NVIDIADriverController(FakeKube(), CONFIG, PrometheusMetrics())
    drivers.watching(h.controller.indexes)
    revisions = next(w for w in WATCHED if w.kind.kind == "ControllerRevision")
    for controller in (h.controller, drivers):
        controller.loop.wake.clear()
        controller.notify(revisions, ("gpu-operator", "nvidia-driver-daemonset-7f44cfdcfd"))
        assert controller.loop.wake.is_set(), type(controller).__name__


@pytest.mark.parametrize(("state", "urgent"), [("", False), ("upgrade-done", False),
    ("pod-restart-required", True), ("validation-required", True)])  # fmt: skip
def test_a_pod_on_a_node_mid_upgrade_is_acted_on_at_once(state: str, urgent: bool) -> None:
    """Its upgrade's next step waits for it; a plain rollout's pods settle."""
    h = Harness(FakeKube())
    loop = h.controller.loop
    labels = {UPGRADE_STATE: state} if state else {}
    h.controller.indexes = {
        "nodes": {("", "gpu-1"): NodeView("gpu-1", labels=labels)},
        "pods": {("gpu-operator", "p"): {"metadata": {"name": "p"}, "spec": {"nodeName": "gpu-1"}}},
    }
    loop.wake.clear()
    loop.urgent.clear()
    h.controller.notify(Watched(KINDS["Pod"]), ("gpu-operator", "p"))
    assert loop.wake.is_set() and loop.urgent.is_set() is urgent
    loop.urgent.clear()
    h.controller.notify(Watched(KINDS["Pod"]), ("gpu-operator", "gone"))  # deleted: not known
    assert not loop.urgent.is_set()


@pytest.mark.parametrize(
    "change",
    [
        {"labels": {DEPLOY_PREFIX + "driver": "false"}},
        {"annotations": {"x": "y"}},
        {"taints": ({"key": "k", "effect": "NoSchedule"},)},
        {"capacity": {"nvidia.com/gpu": "8"}},
        {"container_runtime": "cri-o://1.30"},
        {"ready": False},
        {"unschedulable": True},
    ],
)
def test_a_node_view_compares_what_decisions_read(change: dict[str, Any]) -> None:
    from dataclasses import replace

    node = gpu_node()
    assert replace(node, **change) != node
    assert replace(node, resource_version="99") == node


def test_the_inbox_hands_over_changed_nodes_once() -> None:
    inbox = Inbox()
    inbox.changed_nodes.add("a")
    assert inbox.take() is None  # the first look is at everything
    assert inbox.take() == frozenset()
    inbox.changed_nodes.add("a")
    assert inbox.take() == frozenset({"a"})
    assert inbox.take() == frozenset()
