"""The DRA kubelet plugin through its real unix sockets, driven by a client speaking the
kubelet's protocol: registration, prepare, unprepare, a plugin restart, prepare again."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.dra import agent as dra_agent
from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra.kubelet import DraClient, LocalDraKubelet
from gpu_operator.agent.dra.prepare import CDI_KIND, PrepareError, spec_file_name
from gpu_operator.agent.dra.server import DraPlugin, PluginPaths
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.agent.driverroot import DeviceNodes
from gpu_operator.agent.nvml import Nvml
from gpu_operator.api.draconfig import GROUP_VERSION
from gpu_operator.api.dragates import resolve
from tests.e2e.support import NotYet, wait_for
from tests.unit.agent.conftest import Simulate

NODE = "node-a"
DRIVER = dra_devices.DRIVER
SLICING = resolve({"TimeSlicingSettings": True})


def claim(uid: str, *devices: str, pool: str = NODE, name: str = "") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name or f"claim-{uid}", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": f"r{i}", "driver": DRIVER, "pool": pool, "device": d}
                        for i, d in enumerate(devices)
                    ]
                }
            }
        },
    }


class Api:
    """The claims the API server holds, and how often the plugin asked."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.down = False

    def add(self, obj: dict[str, Any]) -> tuple[str, str, str]:
        meta = obj["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = obj
        return meta["namespace"], meta["name"], meta["uid"]

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self.down:
            raise ConnectionError("API server unreachable")
        self.reads += 1
        return self.claims.get((namespace, name))


@pytest.fixture
def paths(tmp_path: Path) -> PluginPaths:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be long.
    return PluginPaths(
        plugin_dir=tmp_path / "plugins" / DRIVER,
        registry_dir=tmp_path / "registry",
        cdi_dir=tmp_path / "cdi",
    )


@pytest.fixture
def refs(simulate: Simulate) -> dict[str, dra_devices.DeviceRef]:
    simulate("a100-40gb:2")
    with Nvml() as nvml:
        return dra_devices.refs_by_name(nvml.inventory())


def no_driver() -> HostDriver:
    """No driver root here: the specs carry device nodes and env only (the driver's files are
    test_driver_cdi's)."""
    return HostDriver(None, DeviceNodes("/", {}, (), ()), "/", "/")


@pytest.fixture
def api() -> Api:
    return Api()


@pytest.fixture
def plugin(
    paths: PluginPaths, refs: dict[str, dra_devices.DeviceRef], api: Api
) -> Iterator[DraPlugin]:
    with DraPlugin(NODE, paths, lambda: refs, api.read, no_driver) as p:
        yield p


def registered_client(paths: PluginPaths, version: str | None = None) -> DraClient:
    found = LocalDraKubelet(paths.registry_dir).wait_for_plugin(DRIVER)
    return DraClient(found.endpoint, version or found.version)


def answer(response: Any, uid: str) -> list[tuple[list[str], str, str, list[str]]]:
    one = response.claims[uid]
    assert not one.error, one.error
    return [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
        for d in one.devices
    ]


def test_registration_offers_v1_and_v1beta1(plugin: DraPlugin, paths: PluginPaths) -> None:
    found = LocalDraKubelet(paths.registry_dir).wait_for_plugin(DRIVER)
    assert found.version == "v1.DRAPlugin"
    assert found.endpoint == str(paths.plugin_socket)
    assert plugin.registrations.statuses == [(True, "")]


def test_prepare_writes_a_cdi_spec_and_returns_its_device_names(
    plugin: DraPlugin, paths: PluginPaths, refs: dict[str, dra_devices.DeviceRef], api: Api
) -> None:
    key = api.add(claim("uid-1", "gpu-1"))
    with registered_client(paths) as kubelet:
        got = answer(kubelet.prepare(key), "uid-1")
    assert got == [(["r0"], NODE, "gpu-1", [f"{CDI_KIND}=uid-1-gpu-1"])]
    spec = json.loads((paths.cdi_dir / spec_file_name("uid-1")).read_text())
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"  # NVIDIA's DRA driver's kind
    (device,) = spec["devices"]
    assert device["name"] == "uid-1-gpu-1"
    assert device["containerEdits"]["env"] == [f"NVIDIA_DRA_GPU_1={refs['gpu-1'].uuid}"]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]


def test_prepare_unprepare_restart_prepare_again_is_the_same_answer(
    paths: PluginPaths, refs: dict[str, dra_devices.DeviceRef], api: Api
) -> None:
    key = api.add(claim("uid-2", "gpu-0", "gpu-1"))
    spec_file = paths.cdi_dir / spec_file_name("uid-2")
    with (
        DraPlugin(NODE, paths, lambda: refs, api.read, no_driver),
        registered_client(paths) as kubelet,
    ):
        first = answer(kubelet.prepare(key), "uid-2")
        assert answer(kubelet.prepare(key), "uid-2") == first  # idempotent
    assert api.reads == 1
    assert spec_file.exists()  # a stopped plugin leaves prepared claims prepared

    # A new plugin process: state comes from the checkpoint, not from the API server.
    api.down = True
    with (
        DraPlugin(NODE, paths, lambda: refs, api.read, no_driver),
        registered_client(paths) as kubelet,
    ):
        assert answer(kubelet.prepare(key), "uid-2") == first
        spec_file.unlink()  # even a lost spec file comes back
        assert answer(kubelet.prepare(key), "uid-2") == first
        assert spec_file.exists()
        response = kubelet.unprepare(key)
        assert not response.claims["uid-2"].error
        assert not spec_file.exists()
        assert not kubelet.unprepare(key).claims["uid-2"].error  # idempotent
    api.down = False
    with (
        DraPlugin(NODE, paths, lambda: refs, api.read, no_driver),
        registered_client(paths) as kubelet,
    ):
        assert answer(kubelet.prepare(key), "uid-2") == first  # prepared afresh
    assert api.reads == 2


def test_v1beta1_kubelets_get_the_same_answer(
    plugin: DraPlugin, paths: PluginPaths, api: Api
) -> None:
    key = api.add(claim("uid-3", "gpu-0"))
    with registered_client(paths, "v1.DRAPlugin") as v1_kubelet:
        via_v1 = answer(v1_kubelet.prepare(key), "uid-3")
    with registered_client(paths, "v1beta1.DRAPlugin") as old_kubelet:
        assert answer(old_kubelet.prepare(key), "uid-3") == via_v1
        assert not old_kubelet.unprepare(key).claims["uid-3"].error


@pytest.mark.parametrize(
    ("obj", "uid", "message"),
    [
        (claim("uid-4", "gpu-0", pool="node-b"), "uid-4", "no allocation"),
        (claim("uid-5", "gpu-7"), "uid-5", "gpu-7 is not on this node"),
        (claim("uid-6", "gpu-0"), "other-uid", "is not the claim's"),
    ],
)
def test_claims_this_node_cannot_prepare_get_an_error(
    plugin: DraPlugin, paths: PluginPaths, api: Api, obj: dict[str, Any], uid: str, message: str
) -> None:
    ns, name, _ = api.add(obj)
    with registered_client(paths) as kubelet:
        response = kubelet.prepare((ns, name, uid))
    assert message in response.claims[uid].error
    assert not (paths.cdi_dir / spec_file_name(uid)).exists()
    assert uid not in plugin.checkpoint.uids()


def test_a_missing_claim_is_an_error_not_a_crash(plugin: DraPlugin, paths: PluginPaths) -> None:
    with registered_client(paths) as kubelet:
        response = kubelet.prepare(("ns", "gone", "uid-9"))
    assert "not found" in response.claims["uid-9"].error


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = False

    def set_time_slice(self, uuid: str, interval: str) -> None:
        if self.fail:
            raise PrepareError(
                f"nvidia-smi compute-policy -i {uuid} exited 4: Insufficient Permissions"
            )
        self.calls.append((uuid, interval))


def long_claim(uid: str) -> dict[str, Any]:
    doc = claim(uid, "gpu-0")
    doc["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": dra_devices.DRIVER,
                "parameters": {
                    "apiVersion": GROUP_VERSION,
                    "kind": "GpuConfig",
                    "sharing": {
                        "strategy": "TimeSlicing",
                        "timeSlicingConfig": {"interval": "Long"},
                    },
                },
            },
        }
    ]
    return doc


def test_prepare_sets_the_interval_and_unprepare_puts_default_back_across_a_restart(
    paths: PluginPaths, refs: dict[str, dra_devices.DeviceRef], api: Api
) -> None:
    gpu0 = refs["gpu-0"].uuid
    recorder = Recorder()
    key = api.add(long_claim("uid-ts"))

    def plugin() -> DraPlugin:
        return DraPlugin(NODE, paths, lambda: refs, api.read, no_driver, SLICING, lambda: recorder)

    with plugin(), registered_client(paths) as kubelet:
        recorder.fail = True  # the GPU refuses: nothing is prepared, the kubelet retries
        error = kubelet.prepare(key).claims["uid-ts"].error
        assert "Insufficient Permissions" in error, error
        assert not (paths.cdi_dir / spec_file_name("uid-ts")).exists()
        recorder.fail = False
        assert not kubelet.prepare(key).claims["uid-ts"].error
        assert recorder.calls == [(gpu0, "Long")]
    with (
        plugin(),
        registered_client(paths) as kubelet,
    ):  # a restarted plugin knows from its checkpoint
        assert not kubelet.unprepare(key).claims["uid-ts"].error
        assert recorder.calls == [(gpu0, "Long"), (gpu0, "Default")]
        assert not kubelet.unprepare(key).claims["uid-ts"].error  # once only
        assert len(recorder.calls) == 2


def test_a_restart_puts_default_back_on_free_gpus_only(
    paths: PluginPaths, refs: dict[str, dra_devices.DeviceRef], api: Api
) -> None:
    """A GPU whose claim is checkpointed keeps its interval; every other full GPU gets Default
    (a plugin killed between setting one and checkpointing left it set)."""
    recorder = Recorder()
    key = api.add(long_claim("uid-held"))
    with (
        DraPlugin(NODE, paths, lambda: refs, api.read, no_driver, SLICING, lambda: recorder),
        registered_client(paths) as kubelet,
    ):
        assert not kubelet.prepare(key).claims["uid-held"].error
    recorder.calls.clear()
    plugin = DraPlugin(NODE, paths, lambda: refs, api.read, no_driver, SLICING, lambda: recorder)
    assert plugin.restore_time_slices() == [refs["gpu-1"].uuid]
    assert recorder.calls == [(refs["gpu-1"].uuid, "Default")]  # gpu-0 stays Long
    off = DraPlugin(NODE, paths, lambda: refs, api.read, no_driver, None, lambda: recorder)
    assert off.restore_time_slices() == []  # without the gate the plugin sets nothing


class Slices:
    """The API server's ResourceSlices for the plugin's loop: list, apply, delete."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.lists = 0

    def list_objects(self, kind: str, field_selector: str = "") -> list[dict[str, Any]]:
        assert kind == "ResourceSlice" and f"spec.nodeName={NODE}" in field_selector
        self.lists += 1
        return [json.loads(json.dumps(o)) for o in self.objects.values()]

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    def delete(self, kind: str, name: str) -> None:
        self.objects.pop(name, None)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": "node-uid"}}


def test_slices_wiped_before_a_registration_are_published_again_at_once(
    paths: PluginPaths, simulate: Simulate
) -> None:
    """The kubelet deletes a driver's slices on its node 30 s after losing the driver, and
    all of them when it starts; the registration that follows makes the plugin read and
    publish them again, not 5 minutes later at its resync."""
    simulate("a100-40gb:2")
    kube = Slices()
    stop = threading.Event()
    passes = [0]
    with Nvml() as nvml:

        def read_inventory() -> Any:
            passes[0] += 1
            return nvml.inventory()

        def after_passes(n: int) -> None:
            target = passes[0] + n
            wait_for(f"{n} more passes", lambda: passes[0] >= target or NotYet(passes[0]), 10)

        options = dra_agent.PluginOptions(node=NODE, paths=paths, interval_s=0.05)
        loop = threading.Thread(
            target=dra_agent.run, args=(kube, read_inventory, options, stop), daemon=True
        )
        loop.start()
        try:
            kubelet = LocalDraKubelet(paths.registry_dir)
            kubelet.wait_for_plugin(DRIVER)
            wait_for("the pool published", lambda: bool(kube.objects) or NotYet(kube.lists), 10)
            after_passes(5)  # the first registration seen, its read done
            published = dict(kube.objects)
            lists = kube.lists
            kube.objects.clear()  # the kubelet's wipe
            kubelet.wait_for_plugin(DRIVER)  # it registers the plugin again
            wait_for(
                "the pool published again",
                lambda: kube.objects.keys() == published.keys() or NotYet(list(kube.objects)),
                10,
            )
            after_passes(5)
            again = kube.lists
            assert lists < again <= lists + 2  # read, and read back after the writes
            after_passes(5)
            assert kube.lists == again  # then quiet: no read a pass
        finally:
            stop.set()
            loop.join(10)
