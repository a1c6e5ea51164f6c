"""The GPUHealthy monitor as the device-plugin agent runs it, over the simulated NVML: the
condition on a recording Node (written only on a change, retried after a failure, Events on
the turns, kept across a restart), the reset handshake, Unhealthy in ListAndWatch, a kwok
node's allocatable, and the strategic merge patch it is written with."""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpu_operator.agent.deviceplugin.agent import DevicePluginAgent, HealthOptions, Paths
from gpu_operator.agent.deviceplugin.capacity import capacity_patch, counts
from gpu_operator.agent.deviceplugin.config_file import parse_device_plugin_config
from gpu_operator.agent.deviceplugin.kubelet import LocalKubelet
from gpu_operator.agent.deviceplugin.resources import device_map
from gpu_operator.agent.gpuhealth.monitor import HealthMonitor, KubeNode
from gpu_operator.agent.gpuhealth.settings import HealthSettings, xid_policy
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.labels import (
    GPU_HEALTHY_CONDITION,
    HEALTH_RESET_DONE,
    HEALTH_RESET_REQUESTED,
    KWOK_NODE,
)
from gpu_operator.sim.nvml import (
    SimulatedNvml,
    install_simulated_nvml,
    uninstall_simulated_nvml,
)
from gpu_operator.views import NodeView
from tests.fakes.kube import FakeKube, ScriptedRequests

T0 = 1_700_000_000.0
SETTINGS = HealthSettings(quiet_s=60)
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - {{name: nvidia.com/gpu, replicas: {replicas}}}\n"
)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class RecordingNode:
    """The monitor's Node: what the API server would hold, and every write made to it."""

    def __init__(self, condition: Mapping[str, Any] | None = None) -> None:
        self.condition = dict(condition) if condition else None
        self.writes: list[dict[str, Any]] = []
        self.annotations: dict[str, str] = {}
        self.events: list[tuple[str, str, str]] = []
        self.failing = False

    def read_condition(self) -> Mapping[str, Any] | None:
        return self.condition

    def write_condition(self, entry: Mapping[str, Any]) -> None:
        if self.failing:
            raise ConnectionError("API server unavailable")
        self.writes.append(dict(entry))
        self.condition = dict(entry)

    def annotate(self, annotations: Mapping[str, str]) -> None:
        self.annotations.update(annotations)

    def event(self, etype: str, reason: str, message: str) -> None:
        self.events.append((etype, reason, message))

    def view(self, **annotations: str) -> NodeView:
        return NodeView("gpu-node", annotations={**self.annotations, **annotations})


@pytest.fixture
def sim() -> Iterator[SimulatedNvml]:
    yield install_simulated_nvml("a100-40gb:4", seed="health")
    uninstall_simulated_nvml()


@pytest.fixture
def nvml(sim: SimulatedNvml) -> Iterator[Nvml]:
    with Nvml() as opened:
        yield opened


Make = Callable[..., tuple[HealthMonitor, RecordingNode, Clock, Inventory]]


@pytest.fixture
def monitor(nvml: Nvml) -> Make:
    def make(
        settings: HealthSettings = SETTINGS,
        condition: Mapping[str, Any] | None = None,
        start: float = T0,
    ) -> tuple[HealthMonitor, RecordingNode, Clock, Inventory]:
        node, clock = RecordingNode(condition), Clock()
        clock.now = start
        mon = HealthMonitor(nvml, node, settings, clock=clock, retry_s=5)
        inventory = nvml.inventory()
        mon.prime(inventory)
        nvml.xid_events([g.index for g in inventory.gpus])  # XIDs come from registration on
        return mon, node, clock, inventory

    return make


def poll(mon: HealthMonitor, nvml: Nvml, inventory: Inventory) -> frozenset[str]:
    events = nvml.xid_events([g.index for g in inventory.gpus])
    sick = mon.poll(inventory, events)
    mon.publish()
    return sick


def test_the_condition_follows_the_gpus_and_is_written_only_on_a_change(
    sim: SimulatedNvml, nvml: Nvml, monitor: Make
) -> None:
    mon, node, clock, inventory = monitor()
    assert poll(mon, nvml, inventory) == frozenset()
    assert [(w["status"], w["reason"], w["message"]) for w in node.writes] == [
        ("True", "GPUsHealthy", "4 GPUs healthy")
    ]
    assert node.events == []  # healthy from the start: nothing to tell
    for _ in range(3):
        clock.now += 1
        poll(mon, nvml, inventory)
    assert len(node.writes) == 1  # quiet on the API server
    sim.inject_xid(2, 79)
    sim.inject_xid(1, 13)  # an application XID: not counted
    clock.now += 1
    uuid = inventory.gpus[2].uuid
    assert poll(mon, nvml, inventory) == {uuid}
    written = node.writes[-1]
    assert (written["status"], written["reason"]) == ("False", "GPUXid")
    assert written["message"] == f"GPU 2 {uuid}: XID 79 at 22:13:24Z"
    assert written["lastTransitionTime"] == written["lastHeartbeatTime"] == "2023-11-14T22:13:24Z"
    assert node.events == [("Warning", "GPUUnhealthy", f"GPUXid: {written['message']}")]
    clock.now += 59
    poll(mon, nvml, inventory)
    assert len(node.writes) == 2
    clock.now += 1
    assert poll(mon, nvml, inventory) == frozenset()
    assert node.writes[-1]["status"] == "True"
    assert node.events[-1] == ("Normal", "GPUHealthy", "GPUs healthy again: 4 GPUs healthy")


def test_a_failed_write_is_tried_again_later(sim: SimulatedNvml, nvml: Nvml, monitor: Make) -> None:
    mon, node, clock, inventory = monitor()
    node.failing = True
    sim.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST)  # every GPU lost
    poll(mon, nvml, inventory)
    assert node.writes == [] and node.events == []
    node.failing = False
    clock.now += 1
    poll(mon, nvml, inventory)
    assert node.writes == []  # not before retry_s
    clock.now += 5
    poll(mon, nvml, inventory)
    assert [w["reason"] for w in node.writes] == ["GPULost"]
    assert node.events[0][:2] == ("Warning", "GPUUnhealthy")


def test_a_restarted_agent_keeps_the_node_unhealthy_for_a_fresh_quiet_period(
    sim: SimulatedNvml, nvml: Nvml, monitor: Make
) -> None:
    mon, node, clock, inventory = monitor()
    sim.inject_xid(0, 48)
    poll(mon, nvml, inventory)
    before = dict(node.condition or {})
    assert before["status"] == "False"
    # Restarted long after the XID: the new process has not looked long enough yet.
    again, node2, clock2, _ = monitor(condition=before, start=clock.now + 600)
    assert poll(again, nvml, inventory) == {inventory.gpus[0].uuid}
    assert node2.writes == []  # the Node already says so
    clock2.now += 60
    assert poll(again, nvml, inventory) == frozenset()
    assert node2.writes[-1]["status"] == "True"


def test_the_node_watch_brings_back_a_condition_someone_removed(nvml: Nvml, monitor: Make) -> None:
    mon, node, _, inventory = monitor()
    poll(mon, nvml, inventory)
    mon.on_node(node.view(), {})  # e.g. a status update that replaced the conditions
    poll(mon, nvml, inventory)
    assert len(node.writes) == 2
    mon.on_node(node.view(), {GPU_HEALTHY_CONDITION: node.writes[-1]})
    poll(mon, nvml, inventory)
    assert len(node.writes) == 2


def test_a_reset_request_resets_idle_unhealthy_gpus_once(
    sim: SimulatedNvml, nvml: Nvml, monitor: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    mon, node, _, inventory = monitor()
    busy = {inventory.gpus[3].uuid}

    def processes(index: int) -> tuple[int, ...] | None:
        return (4242,) if inventory.gpus[index].uuid in busy else ()

    resets: list[int] = []
    monkeypatch.setattr(mon.gpus, "gpu_processes", processes)
    monkeypatch.setattr(mon.gpus, "reset_gpu", resets.append)
    for index in (1, 3):
        sim.inject_xid(index, 79)
    poll(mon, nvml, inventory)
    mon.on_node(node.view(**{HEALTH_RESET_REQUESTED: "1700000100"}), {})
    poll(mon, nvml, inventory)
    a, b = inventory.gpus[1].uuid, inventory.gpus[3].uuid
    assert resets == [1]
    answer = f"1700000100:reset {a}; refused: {b} in use by pid 4242"
    assert node.annotations == {HEALTH_RESET_DONE: answer}
    assert node.events[-1] == ("Warning", "GPUResetIncomplete", answer.split(":", 1)[1])
    # The watch may still show the request before the answer: it is not carried out twice.
    mon.on_node(node.view(**{HEALTH_RESET_REQUESTED: "1700000100", HEALTH_RESET_DONE: ""}), {})
    poll(mon, nvml, inventory)
    assert resets == [1]


def test_processes_unknown_means_no_reset(sim: SimulatedNvml, nvml: Nvml, monitor: Make) -> None:
    mon, node, _, inventory = monitor()
    sim.fail("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sim.inject_xid(0, 79)
    poll(mon, nvml, inventory)
    mon.on_node(node.view(**{HEALTH_RESET_REQUESTED: "7"}), {})
    poll(mon, nvml, inventory)
    uuid = inventory.gpus[0].uuid
    assert node.annotations[HEALTH_RESET_DONE] == f"7:refused: {uuid} processes unknown"


# -- in the device plugin: ListAndWatch ----------------------------------------------------------
def test_gpus_the_monitor_finds_unhealthy_are_unhealthy_in_list_and_watch(
    sim: SimulatedNvml, nvml: Nvml, short_tmp: Path
) -> None:
    node = RecordingNode()
    # XID 13 is an application error: NVIDIA's device-level rule ignores it, this node counts it.
    settings = HealthSettings(xids=xid_policy(frozenset({13}), frozenset()), quiet_s=3600)
    monitor = HealthMonitor(nvml, node, settings)
    kubelet = LocalKubelet(short_tmp / "device-plugins").start()
    agent = DevicePluginAgent(
        nvml,
        paths=Paths(kubelet.socket_path, short_tmp / "cdi", short_tmp / "sys"),
        overrides={"DEVICE_LIST_STRATEGY": "envvar"},
        health_options=HealthOptions(poll_s=0.02),
        kubelet_poll_s=0.05,
        monitor=monitor,
    )
    config = SHARED.format(replicas=2)
    try:
        agent.apply(parse_device_plugin_config(config))
        agent.start()
        kubelet.wait_for_registration("nvidia.com/gpu")
        with kubelet.client("nvidia.com/gpu") as client:
            stream = client.list_and_watch(20)
            assert {d.health for d in next(stream).devices} == {"Healthy"}
            sim.inject_xid(1, 13)
            update = next(stream).devices
            stream.cancel()  # type: ignore[attr-defined]
        unhealthy = {d.ID for d in update if d.health == "Unhealthy"}
        assert unhealthy == {f"{sim.gpus[1].uuid}::{r}" for r in range(2)}
        deadline = time.monotonic() + 10
        while (node.condition or {}).get("status") != "False" and time.monotonic() < deadline:
            time.sleep(0.02)  # the publish loop writes it
        assert (node.condition or {}).get("reason") == "GPUXid"
    finally:
        agent.stop()
        kubelet.stop()


# -- kwok: allocatable -----------------------------------------------------------------------------
def test_allocatable_drops_every_device_on_an_unhealthy_gpu(nvml: Nvml) -> None:
    inventory = nvml.inventory()
    config = parse_device_plugin_config(SHARED.format(replicas=4))
    devices = device_map(inventory, config)
    sick = {inventory.gpus[0].uuid, inventory.gpus[2].uuid}
    assert counts(devices) == {"nvidia.com/gpu": 16}
    assert counts(devices, sick) == {"nvidia.com/gpu": 8}
    node = NodeView("n", capacity={"nvidia.com/gpu": "16"}, allocatable={"nvidia.com/gpu": "16"})
    # Capacity stays as it is, as a kubelet keeps it; only allocatable changes.
    assert capacity_patch(node, counts(devices), counts(devices, sick)) == {
        "status": {"allocatable": {"nvidia.com/gpu": "8"}}
    }


# -- the write itself ----------------------------------------------------------------------------
def test_the_condition_is_a_strategic_merge_patch_of_the_status_and_read_back_by_type() -> None:
    entry = {"type": GPU_HEALTHY_CONDITION, "status": "True"}
    stored = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready"}, entry]}}
    api = ScriptedRequests(lambda sent: stored if sent.method == "GET" else {})
    node = KubeNode(api, "n", "nvidia-device-plugin")
    assert node.read_condition() == entry
    node.write_condition(entry)
    node.annotate({HEALTH_RESET_DONE: "1:reset GPU-a"})
    _, (method, path, _, body, content_type), (_, meta_path, _, meta, meta_type) = api.sent
    assert (method, path) == ("PATCH", "/api/v1/nodes/n/status")
    assert content_type == "application/strategic-merge-patch+json"
    assert body == {"status": {"conditions": [entry]}}
    assert (meta_path, meta_type) == ("/api/v1/nodes/n", "application/merge-patch+json")
    assert meta == {"metadata": {"annotations": {HEALTH_RESET_DONE: "1:reset GPU-a"}}}


def test_the_node_watch_feeds_the_monitor_without_a_config_dir(nvml: Nvml) -> None:
    seen: list[tuple[NodeView, Mapping[str, Any]]] = []

    class Watching(HealthMonitor):
        def on_node(self, view: NodeView, conditions: Mapping[str, Mapping[str, Any]]) -> None:
            seen.append((view, conditions))
            agent.stopping.set()

    agent = DevicePluginAgent(nvml, monitor=Watching(nvml, RecordingNode(), SETTINGS))
    condition = {"type": GPU_HEALTHY_CONDITION, "status": "True"}
    api = FakeKube().add(
        {
            "kind": "Node",
            "metadata": {"name": "gpu-node", "annotations": {HEALTH_RESET_REQUESTED: "5"}},
            "status": {"conditions": [{"type": "Ready"}, condition]},
        }
    )
    watch = threading.Thread(
        target=agent.watch_node,
        args=(api, "gpu-node", None),
        kwargs={"resync_s": 1},  # the Node does not change: its watch ends within a second
        daemon=True,
    )
    watch.start()
    watch.join(timeout=10)
    assert not watch.is_alive()
    view, conditions = seen[0]
    assert view.annotations[HEALTH_RESET_REQUESTED] == "5"
    assert conditions[GPU_HEALTHY_CONDITION] == condition


def test_the_command_refuses_a_malformed_health_setting_by_name() -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},  # the tree under test
        "GPU_HEALTH_CONDITION": "true",
        "GPU_HEALTH_QUIET_PERIOD": "two minutes",
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpu_operator", "agent", "device-plugin", "--simulate", "t4:1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 1  # bad input: a value the command cannot use
    assert "GPU_HEALTH_QUIET_PERIOD" in result.stderr


# -- kwok: the whole --kwok-capacity path on an in-memory Node -------------------------------------
def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


class KwokNode:
    """A kwok Node as the API server keeps it: merge patches, strategic merge of conditions."""

    def __init__(self) -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": "kwok-0", "annotations": {KWOK_NODE: "fake"}},
            "status": {
                "capacity": {"cpu": "8"},
                "allocatable": {"cpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        self.version = 1
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def with_retry(self, retry: Any) -> KwokNode:
        return self

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        with self.lock:
            self.node["metadata"]["resourceVersion"] = str(self.version)
            return copy.deepcopy(self.node)

    def merge_patch(self, kind: str, name: str, patch: Any, **_: Any) -> dict[str, Any]:
        with self.lock:
            _merge(self.node, copy.deepcopy(patch))
            self.version += 1
        return {}

    def strategic_patch(self, kind: str, name: str, patch: Any, **_: Any) -> dict[str, Any]:
        with self.lock:
            conditions = self.node["status"]["conditions"]
            for entry in patch["status"]["conditions"]:
                conditions[:] = [c for c in conditions if c["type"] != entry["type"]] + [entry]
            self.version += 1
        return {}

    def wait_for_change(self, kind: str, name: str, version: str, timeout_s: int) -> bool:
        time.sleep(0.05)
        return True

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.events.append(obj)
        return obj

    def status(self) -> tuple[str | None, str | None, str | None]:
        with self.lock:
            status = self.node["status"]
            health = {c["type"]: c for c in status["conditions"]}.get(GPU_HEALTHY_CONDITION)
            return (
                health and health["status"],
                status["capacity"].get("nvidia.com/gpu"),
                status["allocatable"].get("nvidia.com/gpu"),
            )


def _until(what: Callable[[], Any], expected: Any, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while what() != expected:
        assert time.monotonic() < deadline, (what(), expected)
        time.sleep(0.02)


def test_kwok_capacity_publishes_the_condition_and_takes_a_lost_gpu_off_allocatable(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_operator.agent import nodeapi
    from gpu_operator.agent.cli import plugins
    from gpu_operator.agent.deviceplugin.settings import ENV_NAMES

    if not hasattr(sim, "inject_fault"):
        pytest.skip("the simulated library has no hardware fault injection yet")
    api = KwokNode()
    monkeypatch.setattr(nodeapi, "connect", lambda *_: api)
    args = argparse.Namespace(
        simulate="a100-40gb:4",
        config_file=None,
        health_poll_ms=20,
        **dict.fromkeys((e.lower() for e in ENV_NAMES), None),
    )
    stop = threading.Event()
    settings = HealthSettings(quiet_s=0.5)
    run = threading.Thread(
        target=plugins._kwok_capacity, args=(args, "kwok-0", None, stop, settings), daemon=True
    )
    run.start()
    try:
        _until(api.status, ("True", "4", "4"))
        sim.inject_fault(2, "lost")  # NVML stops answering for it: the inventory fails too
        _until(api.status, ("False", "4", "3"))
        message = {c["type"]: c for c in api.node["status"]["conditions"]}[GPU_HEALTHY_CONDITION]
        assert message["reason"] == "GPULost"
        assert f"GPU 2 {sim.gpus[2].uuid}: not answering NVML" in message["message"]
        assert {c["type"] for c in api.node["status"]["conditions"]} == {"Ready", "GPUHealthy"}
        sim.clear_faults(2)
        _until(api.status, ("True", "4", "4"))
        # The Event follows the condition's patch: wait for it too, not just the condition.
        _until(lambda: [e["reason"] for e in api.events], ["GPUUnhealthy", "GPUHealthy"])
    finally:
        stop.set()
        run.join(timeout=10)
