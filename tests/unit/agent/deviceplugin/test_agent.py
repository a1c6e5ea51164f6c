"""The device-plugin agent through real unix sockets: a test kubelet (the generated
Registration service) receives Register, then calls ListAndWatch, GetPreferredAllocation and
Allocate the way the kubelet does; kubelet restarts, XIDs and config switches are observed
on the wire. NVML is the simulated library under the real pynvml wrappers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from gpu_operator.agent import migparted
from gpu_operator.agent.deviceplugin import cdi
from gpu_operator.agent.deviceplugin.agent import (
    DevicePluginAgent,
    HealthOptions,
    Paths,
    server_changes,
)
from gpu_operator.agent.deviceplugin.config_file import Sharing, parse_device_plugin_config
from gpu_operator.agent.deviceplugin.configs import ConfigDir
from gpu_operator.agent.deviceplugin.kubelet import LocalKubelet
from gpu_operator.agent.deviceplugin.server import Advertised
from gpu_operator.agent.deviceplugin.settings import PluginSettings
from gpu_operator.agent.nvml import Nvml
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2 as pb
from gpu_operator.sim.nvml import SimulatedNvml
from tests.e2e.support import NotYet, wait_for
from tests.fakes.kube import FakeKube
from tests.unit.agent.conftest import Simulate, mig_configmap

STREAM_S = 20.0  # no stream in these tests may go quiet for longer
TIME_SLICED = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
    "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)


@dataclass
class Node:
    sim: SimulatedNvml
    agent: DevicePluginAgent
    kubelet: LocalKubelet
    root: Path
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def report(self, etype: str, reason: str, message: str) -> None:
        self.events.append((etype, reason, message))

    def devices(self, resource: str) -> list[pb.Device]:
        """The first ListAndWatch answer for ``resource``."""
        with self.kubelet.client(resource) as client:
            stream = client.list_and_watch(STREAM_S)
            first = next(stream)
            stream.cancel()  # type: ignore[attr-defined]
            return list(first.devices)


@pytest.fixture
def node(simulate: Simulate, short_tmp: Path) -> Iterator[Callable[..., Node]]:
    """``node("a100-40gb:8", config_text, mig_config=None, recovery_s=300, **overrides)``."""
    started: list[tuple[DevicePluginAgent, LocalKubelet, Nvml]] = []

    def make(
        spec: str,
        config: str = "",
        *,
        mig_config: str | None = None,
        recovery_s: float = 300.0,
        **overrides: str,
    ) -> Node:
        sim = simulate(spec)
        nvml = Nvml().open()
        if mig_config:
            migparted.apply_config(nvml, migparted.load_mig_config(mig_configmap()), mig_config)
        kubelet = LocalKubelet(short_tmp / "device-plugins").start()
        agent = DevicePluginAgent(
            nvml,
            paths=Paths(kubelet.socket_path, short_tmp / "cdi", short_tmp / "sys"),
            overrides=overrides,
            health_options=HealthOptions(recovery_s=recovery_s, poll_s=0.02),
            kubelet_poll_s=0.05,
        )
        started.append((agent, kubelet, nvml))
        agent.apply(parse_device_plugin_config(config))
        agent.start()
        return Node(sim, agent, kubelet, short_tmp)

    yield make
    for agent, kubelet, nvml in started:
        agent.stop()
        kubelet.stop()
        nvml.close()


def test_registers_every_resource_and_lists_it_over_the_socket(node: Callable[..., Node]) -> None:
    n = node("a100-40gb:8", mig_config="all-balanced", MIG_STRATEGY="mixed")
    expected = {
        "nvidia.com/mig-1g.5gb": 16,
        "nvidia.com/mig-2g.10gb": 8,
        "nvidia.com/mig-3g.20gb": 8,
    }
    for resource in expected:
        registration = n.kubelet.wait_for_registration(resource)
        assert registration.version == "v1beta1"
        assert registration.preferred_allocation
        assert registration.endpoint == f"nvidia-{resource.split('/')[1]}.sock"
    assert set(n.kubelet.registered()) == set(expected)
    for resource, count in expected.items():
        devices = n.devices(resource)
        assert len(devices) == count
        assert {d.health for d in devices} == {"Healthy"}
        assert all(d.ID.startswith("MIG-") for d in devices)
    with n.kubelet.client("nvidia.com/mig-3g.20gb") as client:
        assert client.options().get_preferred_allocation_available


def test_allocate_and_preferred_allocation_over_the_socket(node: Callable[..., Node]) -> None:
    n = node("a100-40gb:8")
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    gpus = n.sim.gpus
    ids = [d.ID for d in n.devices("nvidia.com/gpu")]
    assert ids == [g.uuid for g in gpus]
    with n.kubelet.client("nvidia.com/gpu") as client:
        preferred = client.preferred(ids[3:], [ids[5]], 2)
        assert preferred[0] == ids[5] and len(preferred) == 2
        response = client.allocate([ids[1], ids[6]], [ids[2]])
        started = client.stub.PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=ids[:1]), timeout=5
        )
        assert started == pb.PreStartContainerResponse()  # nothing to do before a container
    first, second = response.container_responses
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{ids[1]},{ids[6]}"}
    assert dict(second.envs) == {"NVIDIA_VISIBLE_DEVICES": ids[2]}


def fake_sysfs(root: Path, gpus: dict[str, tuple[int, str]]) -> None:
    """/sys/bus/pci/devices/<address> links into /sys/devices, as Linux lays them out."""
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for address, (numa, port) in gpus.items():
        device = root / "devices" / "pci0000:00" / port / address
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
        (links / address).symlink_to(device)


def test_topology_reaches_the_kubelet_and_shapes_preferred_allocation(
    node: Callable[..., Node], short_tmp: Path
) -> None:
    # GPUs 0 and 2 behind one root port on NUMA 0, GPUs 1 and 3 behind another on NUMA 1
    fake_sysfs(
        short_tmp / "sys",
        {
            "0000:07:00.0": (0, "0000:00:01.0"),
            "0000:0f:00.0": (1, "0000:00:03.0"),
            "0000:47:00.0": (0, "0000:00:01.0"),
            "0000:4e:00.0": (1, "0000:00:03.0"),
        },
    )
    n = node("a100-40gb:4")
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    devices = n.devices("nvidia.com/gpu")
    assert [[t.ID for t in d.topology.nodes] for d in devices] == [[0], [1], [0], [1]]
    ids = [d.ID for d in devices]
    with n.kubelet.client("nvidia.com/gpu") as client:
        assert client.preferred(ids, [], 2) == [ids[0], ids[2]]
        assert client.preferred(ids, [ids[3]], 2) == [ids[3], ids[1]]


def test_cdi_strategies_write_the_spec_containerd_reads(node: Callable[..., Node]) -> None:
    n = node(
        "l4:2",
        "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [cdi-cri, cdi-annotations]\n"
        "    deviceIDStrategy: index\n",
    )
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    spec = (n.root / "cdi" / cdi.SPEC_FILE).read_text()
    for gpu in n.sim.gpus:
        assert f'"name": "{gpu.uuid}"' in spec
    with n.kubelet.client("nvidia.com/gpu") as client:
        (response,) = client.allocate([n.sim.gpus[1].uuid]).container_responses
    assert [d.name for d in response.cdi_devices] == [f"{cdi.CDI_KIND}=1"]
    (value,) = response.annotations.values()
    assert value == "k8s.device-plugin.nvidia.com/gpu=1"
    assert not response.envs  # CDI only: the runtime gets the devices from the spec
    n.agent.apply(parse_device_plugin_config("version: v1\n"))  # back to envvar: spec removed
    assert not (n.root / "cdi" / cdi.SPEC_FILE).exists()


def test_two_replicas_for_one_container_are_refused_with_the_reason(
    node: Callable[..., Node],
) -> None:
    n = node(
        "h100-80gb:2",
        "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 4}\n",
    )
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    ids = [d.ID for d in n.devices("nvidia.com/gpu")]
    assert len(ids) == 8 and ids[0].endswith("::0")
    with n.kubelet.client("nvidia.com/gpu") as client:
        with pytest.raises(grpc.RpcError) as error:
            client.allocate(ids[:2])
        (response,) = client.allocate(ids[5:6]).container_responses
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "maximum request size for shared resources is 1" in error.value.details()
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == n.sim.gpus[1].uuid
    assert response.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"


def test_a_restarted_kubelet_gets_every_resource_registered_again(
    node: Callable[..., Node],
) -> None:
    n = node("a100-40gb:2", mig_config="all-balanced", MIG_STRATEGY="mixed")
    resources = ["nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"]
    for resource in resources:
        n.kubelet.wait_for_registration(resource)
    before = len(n.kubelet.registrations)
    n.kubelet.restart()  # plugin sockets removed, kubelet.sock recreated
    for resource in resources:
        n.kubelet.wait_for_registration(resource, after=before)
    assert len(n.devices("nvidia.com/mig-1g.5gb")) == 4


def test_an_xid_marks_the_gpu_and_its_replicas_unhealthy_until_it_recovers(
    node: Callable[..., Node],
) -> None:
    n = node("a100-40gb:4", TIME_SLICED, recovery_s=0.3)
    n.kubelet.wait_for_registration("nvidia.com/gpu.shared")
    gpus = n.sim.gpus
    with n.kubelet.client("nvidia.com/gpu.shared") as client:
        stream = client.list_and_watch(STREAM_S)
        assert {d.health for d in next(stream).devices} == {"Healthy"}
        n.sim.inject_xid(1, 13)  # an application error: the GPU stays healthy
        n.sim.inject_xid(2, 79)  # fallen off the bus
        update = next(stream).devices
        unhealthy = {d.ID for d in update if d.health == "Unhealthy"}
        assert unhealthy == {f"{gpus[2].uuid}::{r}" for r in range(4)}
        # quiet for recovery_s and still answering NVML: healthy again, on the same stream
        assert {d.health for d in next(stream).devices} == {"Healthy"}
        stream.cancel()  # type: ignore[attr-defined]


def test_a_gpu_that_does_not_answer_nvml_stays_unhealthy(node: Callable[..., Node]) -> None:
    n = node("a100-40gb:2", recovery_s=0.05)
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    n.sim.fail("nvmlDeviceGetUUID", 15)  # NVML_ERROR_GPU_IS_LOST, for every later probe
    with n.kubelet.client("nvidia.com/gpu") as client:
        stream = client.list_and_watch(STREAM_S)
        next(stream)
        n.sim.inject_xid(0, 79)
        assert [d.health for d in next(stream).devices] == ["Unhealthy", "Healthy"]
        n.sim.clear_failures()  # the GPU answers again (e.g. after a reset): it recovers
        assert [d.health for d in next(stream).devices] == ["Healthy", "Healthy"]
        stream.cancel()  # type: ignore[attr-defined]


def test_an_xid_on_a_mig_gpu_marks_its_mig_devices(node: Callable[..., Node]) -> None:
    n = node("a100-40gb:2", mig_config="all-1g.5gb", MIG_STRATEGY="single")
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    with n.kubelet.client("nvidia.com/gpu") as client:
        stream = client.list_and_watch(STREAM_S)
        assert len(next(stream).devices) == 14
        n.sim.inject_xid(1, 48)
        health = [d.health for d in next(stream).devices]
        assert health == ["Healthy"] * 7 + ["Unhealthy"] * 7
        stream.cancel()  # type: ignore[attr-defined]


def _configs(root: Path) -> ConfigDir:
    directory = root / "configs"
    directory.mkdir()
    (directory / "default").write_text("version: v1\n")
    (directory / "shared").write_text(TIME_SLICED)
    (directory / "mps-mig").write_text(
        "version: v1\nsharing: {mps: {resources: [{name: mig-1g.5gb, replicas: 2}]}}\n"
    )
    (directory / "broken").write_text(
        "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu}]}}\n"
    )
    return ConfigDir(directory, default="default")


def test_a_config_switch_restarts_the_changed_resources(node: Callable[..., Node]) -> None:
    n = node("a100-40gb:8")
    configs = _configs(n.root)
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    before = len(n.kubelet.registrations)
    assert n.agent.switch("shared", configs, report=n.report)
    n.kubelet.wait_for_registration("nvidia.com/gpu.shared", after=before)
    assert len(n.devices("nvidia.com/gpu.shared")) == 32
    assert not (n.kubelet.directory / "nvidia-gpu.sock").exists()  # that resource is gone
    assert n.events[-1] == (
        "Normal",
        "DevicePluginConfigApplied",
        "config shared: nvidia.com/gpu.shared: 32",
    )
    # back to the default when the label goes away
    before = len(n.kubelet.registrations)
    assert n.agent.switch(None, configs, report=n.report)
    n.kubelet.wait_for_registration("nvidia.com/gpu", after=before)
    assert len(n.devices("nvidia.com/gpu")) == 8


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("h100", "nvidia.com/device-plugin.config=h100 names no config"),
        ("broken", "config 'broken': sharing.timeSlicing.resources[0].replicas"),
        ("mps-mig", "sharing.mps.resources[0].name: MPS cannot share MIG devices"),
    ],
)
def test_a_bad_config_label_is_reported_and_changes_nothing(
    node: Callable[..., Node], label: str, message: str
) -> None:
    n = node("a100-40gb:2", mig_config="all-balanced", MIG_STRATEGY="mixed")
    configs = _configs(n.root)
    n.kubelet.wait_for_registration("nvidia.com/mig-1g.5gb")
    serving = n.agent.advertised()
    registrations = len(n.kubelet.registrations)
    assert not n.agent.switch(label, configs, report=n.report)
    ((etype, reason, text),) = n.events
    assert (etype, reason) == ("Warning", "DevicePluginConfigFailed") and message in text
    assert n.agent.advertised() == serving
    assert len(n.kubelet.registrations) == registrations
    assert not n.agent.switch(label, configs, report=n.report)  # reported once, not per pass
    assert len(n.events) == 1
    assert not n.agent.switch(None, configs, report=n.report)  # back to the label applied
    assert not n.agent.switch(label, configs, report=n.report)  # tried again: reported again
    assert len(n.events) == 2


def test_server_changes_leave_unchanged_resources_alone() -> None:
    def advertised(name: str, strategies: tuple[str, ...] = ("envvar",)) -> Advertised:
        return Advertised(name, (), PluginSettings(device_list_strategies=strategies), Sharing())

    current = {"a": advertised("a"), "b": advertised("b"), "c": advertised("c")}
    desired = {"a": advertised("a"), "b": advertised("b", ("cdi-cri",)), "d": advertised("d")}
    assert server_changes(current, desired) == (["b", "c"], ["b", "d"])
    assert server_changes(current, current) == ([], [])


# -- the label watch, on the fake API server -------------------------------------------------
def test_the_node_label_switches_the_config_without_a_restart(node: Callable[..., Node]) -> None:
    n = node("a100-40gb:8")
    configs = _configs(n.root)
    n.kubelet.wait_for_registration("nvidia.com/gpu")
    api = FakeKube().add({"kind": "Node", "metadata": {"name": "gpu-node-0"}})

    def reasons() -> list[str]:  # of the Events the agent wrote
        return [e["reason"] for e in api.list_objects("Event")]

    before = len(n.kubelet.registrations)
    watch = threading.Thread(
        target=n.agent.watch_node,
        args=(api, "gpu-node-0", configs),
        kwargs={"resync_s": 1, "retry_s": 0.1},
        daemon=True,
    )
    watch.start()
    # A person labels the Node: the stored one, replaced, with a new resourceVersion.
    labels = {"nvidia.com/device-plugin.config": "shared"}
    api.add({"kind": "Node", "metadata": {"name": "gpu-node-0", "labels": labels}})
    n.kubelet.wait_for_registration("nvidia.com/gpu.shared", after=before)
    assert len(n.devices("nvidia.com/gpu.shared")) == 32
    # The Event follows the registration: wait for it (a loaded machine once got there first).
    wait_for(
        "the DevicePluginConfigApplied Event",
        lambda: "DevicePluginConfigApplied" in (said := reasons()) or NotYet(said),
        timeout=10,
        every=0.05,
    )
    assert all(e["involvedObject"]["name"] == "gpu-node-0" for e in api.list_objects("Event"))
    n.agent.stop()
    watch.join(timeout=10)
    assert not watch.is_alive()


# -- the command ---------------------------------------------------------------------------------
def test_the_command_needs_only_the_kubelet_socket_directory(short_tmp: Path) -> None:
    plugins = short_tmp / "device-plugins"
    with LocalKubelet(plugins) as kubelet:
        env = {
            **os.environ,
            "GPU_OPERATOR_SIMULATE": "a100-40gb:2",
            "KUBELET_SOCKET": str(kubelet.socket_path),
            "DEVICE_LIST_STRATEGY": "envvar",
        }
        env.pop("GPU_OPERATOR_SIMULATE_STATE", None)
        env.pop("CONFIG_FILE", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_operator", "agent", "device-plugin"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            kubelet.wait_for_registration("nvidia.com/gpu", timeout_s=60)
            with kubelet.client("nvidia.com/gpu") as client:
                stream = client.list_and_watch(STREAM_S)
                assert len(next(stream).devices) == 2
                stream.cancel()  # type: ignore[attr-defined]
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, output.decode()
    assert not (plugins / "nvidia-gpu.sock").exists()  # removed on the way out


def test_the_command_refuses_a_bad_config_with_the_field(short_tmp: Path) -> None:
    config = short_tmp / "config.yaml"
    config.write_text("version: v1\nflags: {plugin: {deviceListStrategy: nvml}}\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator",
            "agent",
            "device-plugin",
            "--simulate",
            "t4:1",
            "--config-file",
            str(config),
            "--kubelet-socket",
            str(short_tmp / "kubelet.sock"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1  # bad input: the file names the field
    assert "flags.plugin.deviceListStrategy: 'nvml' is not one of" in result.stderr
