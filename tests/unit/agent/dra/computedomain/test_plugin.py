"""The compute-domain kubelet plugin through its real unix sockets, driven by a client speaking
the kubelet's protocol, over the fake API server: registration, a channel claim that waits for
its IMEX daemon and then gets channel 0, a daemon claim, unprepare, a restart, the health
service and one pass of the run loop."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpu_operator.agent.dra import healthcheck
from gpu_operator.agent.dra.computedomain import agent as domain_agent
from gpu_operator.agent.dra.computedomain import decide
from gpu_operator.agent.dra.computedomain.plugin import DomainPlugin, HostFiles, Waiting
from gpu_operator.agent.dra.kubelet import DraClient, LocalDraKubelet
from gpu_operator.agent.dra.server import PluginPaths
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.agent.driverroot import DeviceNodes
from gpu_operator.agent.nvml import FabricError
from gpu_operator.api.computedomain import API_VERSION
from tests.fakes.kube import FakeKube

NODE = "node-a"
DRIVER = decide.DRIVER
DOMAIN = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"
CLIQUE = "1b2c3d4e-0000-0000-0000-000000000007.3"
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
PROC_DEVICES = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n235 nvidia-caps\n"


def domain(nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {"name": "imex", "namespace": "team", "uid": DOMAIN},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "imex-channel"}}},
    }
    if nodes is not None:
        doc["status"] = {"nodes": nodes}
    return doc


def ready(kube: FakeKube) -> None:
    kube.add(
        domain([{"name": NODE, "ipAddress": "10.0.0.1", "cliqueID": CLIQUE, "status": "Ready"}])
    )


def claim(uid: str, kind: str, namespace: str = "team", mode: str = "Single") -> dict[str, Any]:
    device, config = (
        ("channel-0", "ComputeDomainChannelConfig")
        if kind == "channel"
        else (
            "daemon-0",
            "ComputeDomainDaemonConfig",
        )
    )
    params: dict[str, Any] = {"apiVersion": API_VERSION, "kind": config, "domainID": DOMAIN}
    if kind == "channel":
        params["allocationMode"] = mode
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": f"claim-{uid}", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": kind, "driver": DRIVER, "pool": NODE, "device": device}
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": [kind],
                            "opaque": {"driver": DRIVER, "parameters": params},
                        }
                    ],
                }
            }
        },
    }


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return meta["namespace"], meta["name"], meta["uid"]


def no_driver() -> HostDriver:
    return HostDriver(None, DeviceNodes("/", {}, (), ()), "/", "/")


@pytest.fixture
def kube() -> FakeKube:
    meta = {"name": NODE, "uid": "node-uid", "labels": {}}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    return FakeKube().add(node, domain())


@pytest.fixture
def paths(short_tmp: Path) -> PluginPaths:
    return PluginPaths(
        plugin_dir=short_tmp / "plugins" / DRIVER,
        registry_dir=short_tmp / "registry",
        cdi_dir=short_tmp / "cdi",
        driver=DRIVER,
    )


@pytest.fixture
def files(tmp_path: Path) -> HostFiles:
    (tmp_path / "devices").write_text(PROC_DEVICES)
    (tmp_path / "fabric-imex-mgmt").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\n")
    return HostFiles(tmp_path / "devices", tmp_path / "fabric-imex-mgmt")


def make(kube: FakeKube, paths: PluginPaths, files: HostFiles, **kw: Any) -> DomainPlugin:
    kw.setdefault("waiting", Waiting(timeout_s=0.3, first_s=0.01, most_s=0.05))
    return DomainPlugin(kube, NODE, paths, lambda: CLIQUE, no_driver, files, **kw)  # type: ignore[arg-type]


@pytest.fixture
def plugin(kube: FakeKube, paths: PluginPaths, files: HostFiles) -> Iterator[DomainPlugin]:
    with make(kube, paths, files) as p:
        yield p


def registered_client(paths: PluginPaths) -> DraClient:
    found = LocalDraKubelet(paths.registry_dir).wait_for_plugin(DRIVER)
    return DraClient(found.endpoint, found.version)


def labels(kube: FakeKube) -> dict[str, str]:
    node = kube.obj("Node", NODE) or {}
    return dict(node["metadata"].get("labels") or {})


def spec(paths: PluginPaths, uid: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((paths.cdi_dir / decide.spec_file_name(uid)).read_text())
    return loaded


def test_it_registers_as_compute_domain_nvidia_com(
    plugin: DomainPlugin, paths: PluginPaths
) -> None:
    found = LocalDraKubelet(paths.registry_dir).wait_for_plugin(DRIVER)
    assert found.version == "v1.DRAPlugin"
    assert found.endpoint == str(paths.plugin_dir / "dra.sock")
    assert (paths.registry_dir / f"{DRIVER}-reg.sock").exists()
    assert plugin.registrations.statuses == [(True, "")]


def test_a_channel_labels_the_node_waits_for_its_daemon_then_gets_channel_0(
    plugin: DomainPlugin, paths: PluginPaths, kube: FakeKube
) -> None:
    workload = claim("uid-1", "channel")
    kube.add(workload)
    with registered_client(paths) as kubelet:
        first = kubelet.prepare(key(workload)).claims["uid-1"]
        assert "IMEX daemon of ComputeDomain team/imex on node node-a is not Ready yet" in (
            first.error
        )
        assert labels(kube) == {DOMAIN_LABEL: DOMAIN}  # so the controller's daemon comes here
        assert not (paths.cdi_dir / decide.spec_file_name("uid-1")).exists()
        ready(kube)
        again = kubelet.prepare(key(workload)).claims["uid-1"]
    assert not again.error, again.error
    (device,) = again.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["channel"],
        NODE,
        "channel-0",
    )
    assert list(device.cdi_device_ids) == [f"{decide.CDI_KIND}=uid-1-channel-0"]
    (entry,) = spec(paths, "uid-1")["devices"]
    assert entry["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/nvidia-caps-imex-channels/channel0",
            "type": "c",
            "major": 234,
            "minor": 0,
            "fileMode": 0o666,
        }
    ]


def test_a_daemon_that_gets_ready_during_the_call_is_waited_for(
    kube: FakeKube, paths: PluginPaths, files: HostFiles
) -> None:
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            ready(kube)

    workload = claim("uid-2", "channel", mode="All")
    kube.add(workload)
    plugin = make(kube, paths, files, sleep=nap, waiting=Waiting(timeout_s=30, first_s=0.5))
    prepared = plugin.prepare(*key(workload))
    assert [p.channels for p in prepared] == [2048]
    assert naps == [0.5, 1.0, 2.0]  # backing off
    nodes = spec(paths, "uid-2")["devices"][0]["containerEdits"]["deviceNodes"]
    assert len(nodes) == 2048


def test_a_claim_from_another_namespace_is_refused_at_once(
    plugin: DomainPlugin, paths: PluginPaths, kube: FakeKube
) -> None:
    intruder = claim("uid-3", "channel", namespace="intruder")
    kube.add(intruder)
    with registered_client(paths) as kubelet:
        answer = kubelet.prepare(key(intruder)).claims["uid-3"]
    assert "serves claims in namespace team only; this claim is in intruder" in answer.error
    assert labels(kube) == {}  # nothing done for it


def test_a_daemon_claim_gets_its_domain_and_clique(
    plugin: DomainPlugin, paths: PluginPaths, kube: FakeKube
) -> None:
    daemon = claim("uid-4", "daemon")
    daemon["metadata"]["namespace"] = "gpu-operator"  # the daemons' claims are the driver's
    kube.add(daemon)
    with registered_client(paths) as kubelet:
        answer = kubelet.prepare(key(daemon)).claims["uid-4"]
    assert not answer.error, answer.error
    assert (paths.plugin_dir / "domains" / DOMAIN).is_dir()
    edits = spec(paths, "uid-4")["devices"][0]["containerEdits"]
    assert f"CLIQUE_ID={CLIQUE}" in edits["env"]
    assert edits["mounts"][0]["hostPath"] == str(paths.plugin_dir / "domains" / DOMAIN)
    assert edits["deviceNodes"] == [
        {
            "path": "/dev/nvidia-caps/nvidia-cap1",
            "type": "c",
            "major": 235,
            "minor": 1,
            "fileMode": 256,
        }
    ]
    assert labels(kube) == {}  # a daemon does not label the node


def test_unprepare_removes_the_spec_and_the_domain_label_and_a_restart_answers_the_same(
    kube: FakeKube, paths: PluginPaths, files: HostFiles
) -> None:
    ready(kube)
    workload = claim("uid-5", "channel")
    kube.add(workload)
    with make(kube, paths, files), registered_client(paths) as kubelet:
        first = kubelet.prepare(key(workload)).claims["uid-5"]
        assert not first.error, first.error
        (paths.cdi_dir / decide.spec_file_name("uid-5")).unlink()  # a rebooted /var/run
    reads = len(kube.calls)
    with make(kube, paths, files) as restarted, registered_client(paths) as kubelet:
        again = kubelet.prepare(key(workload)).claims["uid-5"]
        assert list(again.devices[0].cdi_device_ids) == list(first.devices[0].cdi_device_ids)
        assert len(kube.calls) == reads  # from the checkpoint, no API read
        assert spec(paths, "uid-5")["devices"][0]["name"] == "uid-5-channel-0"
        assert labels(kube) == {DOMAIN_LABEL: DOMAIN}
        gone = kubelet.unprepare(key(workload)).claims["uid-5"]
        assert not gone.error, gone.error
    assert labels(kube) == {}
    assert not (paths.cdi_dir / decide.spec_file_name("uid-5")).exists()
    assert restarted.checkpoint.uids() == frozenset()


def test_a_claim_let_go_before_it_was_prepared_still_takes_its_label_off(
    plugin: DomainPlugin, kube: FakeKube
) -> None:
    workload = claim("uid-6", "channel")
    kube.add(workload)
    with pytest.raises(Exception, match="not Ready yet"):
        plugin.prepare(*key(workload))
    assert labels(kube) == {DOMAIN_LABEL: DOMAIN}
    plugin.unprepare("uid-6")
    assert labels(kube) == {}


def test_the_health_service_says_serving_while_both_sockets_answer(
    plugin: DomainPlugin, paths: PluginPaths
) -> None:
    server, port = healthcheck.serve(0, lambda: healthcheck.plugin_answers(paths))
    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            assert check(b"", timeout=5) == b"\x08\x01"  # SERVING
            assert check(b"\x0a\x08liveness", timeout=5) == b"\x08\x01"
            with pytest.raises(grpc.RpcError) as unknown:
                check(b"\x0a\x05other", timeout=5)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            plugin.stop()
            assert check(b"", timeout=5) == b"\x08\x02"  # NOT_SERVING
    finally:
        server.stop(grace=None).wait()


def test_one_pass_publishes_the_pool_and_labels_the_clique(
    kube: FakeKube, paths: PluginPaths, files: HostFiles
) -> None:
    stale = paths.plugin_dir / "domains" / "gone-domain"
    stale.mkdir(parents=True)
    options = domain_agent.DomainPluginOptions(NODE, paths, healthcheck_port=-1, files=files)
    stop = threading.Event()
    stop.set()  # one pass, then stop
    assert domain_agent.run(kube, lambda: CLIQUE, options, stop, no_driver) == 0  # type: ignore[arg-type]
    (published,) = kube.of_kind("ResourceSlice")
    assert published["spec"]["driver"] == DRIVER
    assert [d["name"] for d in published["spec"]["devices"]] == ["channel-0", "daemon-0"]
    assert published["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
    assert labels(kube) == {"nvidia.com/gpu.clique": CLIQUE}
    assert not stale.exists()  # its domain is gone
    assert not (paths.registry_dir / f"{DRIVER}-reg.sock").exists()  # stopped


def test_a_node_without_a_clique_loses_the_label(
    kube: FakeKube, paths: PluginPaths, files: HostFiles
) -> None:
    kube.obj("Node", NODE)["metadata"]["labels"]["nvidia.com/gpu.clique"] = "old.1"  # type: ignore[index]
    options = domain_agent.DomainPluginOptions(NODE, paths, healthcheck_port=-1, files=files)
    stop = threading.Event()
    stop.set()
    domain_agent.run(kube, lambda: None, options, stop, no_driver)  # type: ignore[arg-type]
    assert labels(kube) == {}


def test_an_unusable_fabric_stops_the_plugin_at_start(kube: FakeKube, paths: PluginPaths) -> None:
    def broken() -> str | None:
        raise FabricError("GPU fabric state in-progress on GPU 0", 0)

    options = domain_agent.DomainPluginOptions(NODE, paths, healthcheck_port=-1)
    with pytest.raises(FabricError, match="in-progress on GPU 0: the node's NVLink fabric"):
        domain_agent.run(kube, broken, options, threading.Event(), no_driver)  # type: ignore[arg-type]
    assert not paths.registry_dir.exists()  # nothing served
