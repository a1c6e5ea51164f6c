"""What hands the real GPU to pods: ``agent device-plugin`` registered with the project's local
kubelet (the kubelet's side of the device-plugin API), and the DRA driver's device listing."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_operator.agent.deviceplugin import cdi
from gpu_operator.agent.deviceplugin.kubelet import LocalKubelet
from gpu_operator.agent.dra import devices as dra
from gpu_operator.agent.inventory import Inventory
from tests.gpu.conftest import Driver
from tests.gpu.host import SmiGpu, agent_argv, agent_env, session_dir

RESOURCE = "nvidia.com/gpu"
ALLOCATIONS = 50


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = session_dir("gpu-tier-dp-")  # short: plugin sockets live here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_device_plugin_advertises_and_allocates_the_real_gpus(
    driver: Driver, inventory: Inventory, plugin_dir: Path
) -> None:
    kubelet_dir, cdi_dir, log = plugin_dir / "dp", plugin_dir / "cdi", plugin_dir / "plugin.log"
    with LocalKubelet(kubelet_dir) as kubelet, log.open("wb") as sink:
        args = ["device-plugin", "--driver-root", driver.root]
        args += ["--kubelet-socket", str(kubelet.socket_path), "--cdi-root", str(cdi_dir)]
        args += ["--device-list-strategy", "envvar,cdi-cri"]
        args += ["--nvidia-driver-root", driver.root]
        process = subprocess.Popen(
            agent_argv(*args), stdout=sink, stderr=subprocess.STDOUT, env=agent_env()
        )
        try:
            try:
                kubelet.wait_for_registration(RESOURCE, timeout_s=60)
            except TimeoutError as exc:
                pytest.fail(f"{exc}; the plugin's log:\n{log.read_text()}")
            with kubelet.client(RESOURCE) as client:
                stream = client.list_and_watch(30.0)
                advertised = next(stream).devices
                stream.cancel()  # type: ignore[attr-defined]
                ids = sorted(d.ID for d in advertised)
                print(f"\nListAndWatch: {[(d.ID, d.health) for d in advertised]}")
                full = sorted(g.uuid for g in inventory.gpus if not g.mig_current)
                if full == sorted(g.uuid for g in inventory.gpus):  # no GPU in MIG mode
                    assert ids == full
                else:
                    every = {g.uuid for g in inventory.gpus}
                    every |= {d.uuid for g in inventory.gpus for d in g.mig_devices}
                    assert set(ids) <= every
                assert {d.health for d in advertised} == {"Healthy"}

                uuid = ids[0]
                response = client.allocate([uuid])
                container = response.container_responses[0]
                print(
                    f"Allocate [{uuid}]: envs {dict(container.envs)}, "
                    f"CDI devices {[d.name for d in container.cdi_devices]}"
                )
                assert container.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
                assert [d.name for d in container.cdi_devices] == [cdi.qualified_name(uuid)]
                specs = [json.loads(p.read_text()) for p in cdi_dir.glob("*.json")]
                names = {d["name"] for spec in specs for d in spec.get("devices", [])}
                assert uuid in names, f"the plugin's CDI specs in {cdi_dir} name {sorted(names)}"

                latencies = []
                for _ in range(ALLOCATIONS):
                    start = time.perf_counter()
                    client.allocate([uuid])
                    latencies.append(time.perf_counter() - start)
                median_ms = statistics.median(latencies) * 1000
                worst_ms = max(latencies) * 1000
                print(
                    f"Allocate latency over {ALLOCATIONS} calls: median {median_ms:.2f} ms, "
                    f"max {worst_ms:.2f} ms"
                )
        finally:
            process.terminate()
            try:
                assert process.wait(timeout=30) == 0, log.read_text()
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise


def test_dra_devices_carry_the_real_gpus(
    driver: Driver, inventory: Inventory, smi_gpus: list[SmiGpu]
) -> None:
    listed = {d["name"]: d for d in dra.devices(inventory)}
    print("\n" + json.dumps(list(listed.values()), indent=1))
    by_uuid = {g.uuid: g for g in smi_gpus}
    cuda = driver.smi.cuda_version()
    for gpu in inventory.gpus:
        if gpu.mig_current:
            continue  # a GPU in MIG mode publishes its MIG devices only
        device = listed[f"gpu-{gpu.minor_number}"]
        attributes = device["attributes"]
        smi = by_uuid[attributes["uuid"]["string"]]
        assert attributes["uuid"]["string"] == gpu.uuid == smi.uuid
        assert attributes["type"]["string"] == "gpu"
        assert attributes["index"]["int"] == smi.index
        assert attributes["productName"]["string"] == smi.name
        assert attributes["driverVersion"]["version"] == dra.semver(smi.driver_version)
        assert attributes["cudaDriverVersion"]["version"] == dra.semver(cuda)
        assert attributes["cudaComputeCapability"]["version"] == dra.semver(smi.compute_cap)
        assert attributes["resource.kubernetes.io/pciBusID"]["string"] == dra.bus_id(smi.pci_bus_id)
        if smi.compute_cap.startswith("9."):
            assert attributes["architecture"]["string"] == "Hopper"
        memory = device["capacity"]["memory"]["value"]
        assert memory == dra.quantity(gpu.memory_mib * dra.MIB)
        print(f"{device['name']}: {smi.name} {smi.uuid}, memory {memory}")
