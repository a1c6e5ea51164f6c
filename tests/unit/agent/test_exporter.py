"""The metrics exporter: counters CSV, exposition that Prometheus parses, pod attribution."""

from __future__ import annotations

import logging
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from threading import Thread

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_operator.agent import exporter, migparted
from gpu_operator.agent.exporter import CountersError, Exporter, parse_counters
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.podresources import (
    Attribution,
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesServer,
    attributions,
    list_pod_resources,
    list_response,
    pods_from,
)

from .conftest import Simulate, counters_csv, mig_configmap

NVML_FIELDS_IN_DEFAULT_CSV = {
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}


@pytest.fixture
def nvidia_counters() -> list[exporter.CounterSpec]:
    return parse_counters(counters_csv().read_text())


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths must stay under ~100 characters."""
    path = Path(tempfile.mkdtemp(prefix="gpuop-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_nvidia_counters_csv_parses(nvidia_counters: list[exporter.CounterSpec]) -> None:
    by_name = {c.field: c for c in nvidia_counters}
    assert by_name["DCGM_FI_DEV_DEC_UTIL"].type == "gauge"  # "DCGM_FI_DEV_DEC_UTIL ," in the file
    assert by_name["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert by_name["DCGM_FI_DRIVER_VERSION"].type == "label"
    assert by_name["DCGM_FI_PROF_PCIE_TX_BYTES"].help.startswith("The rate of data transmitted")
    assert parse_counters("X, gauge, a, b\n")[0].help == "a, b"  # help text may hold commas
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in by_name  # commented out


def test_unsupported_fields_are_skipped_with_one_log_line(
    simulate: Simulate,
    nvidia_counters: list[exporter.CounterSpec],
    caplog: pytest.LogCaptureFixture,
) -> None:
    simulate("t4:1")
    with caplog.at_level(logging.INFO, logger="gpu_operator.agent.exporter"), Nvml() as nvml:
        ex = Exporter(nvml, nvidia_counters, hostname="n1", pod_resources_socket=None)
    lines = [r.getMessage() for r in caplog.records if "cannot provide" in r.getMessage()]
    assert len(lines) == 1
    assert set(ex.skipped) == {
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
    for name in ex.skipped:
        assert name in lines[0]
    assert {c.field for c in ex.counters} == NVML_FIELDS_IN_DEFAULT_CSV | {"DCGM_FI_DRIVER_VERSION"}


@pytest.mark.parametrize(
    "text",
    ["DCGM_FI_DEV_GPU_TEMP\n", "DCGM_FI_DEV_GPU_TEMP, histogram, x\n", ", gauge, x\n"],
)
def test_bad_counters_lines(text: str) -> None:
    with pytest.raises(CountersError, match="line 1"):
        parse_counters(text)


def scrape(ex: Exporter) -> dict[str, object]:
    ex.collect_once()
    return {f.name: f for f in text_string_to_metric_families(ex.render())}


def test_exposition_parses_with_dcgm_names_types_and_labels(
    simulate: Simulate, nvidia_counters: list[exporter.CounterSpec]
) -> None:
    sim = simulate("a100-40gb:8")
    with Nvml() as nvml:
        ex = Exporter(nvml, nvidia_counters, hostname="gpu-node-1", pod_resources_socket=None)
        ex.collect_once()  # registers for XIDs: as on NVML, only later ones reach it
        sim.inject_xid(3, 79)
        text = (ex.collect_once(), ex.render())[1]
        families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == NVML_FIELDS_IN_DEFAULT_CSV
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text  # no _total suffix, as dcgm-exporter
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"  # type: ignore[attr-defined]
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"  # type: ignore[attr-defined]
    temps = families["DCGM_FI_DEV_GPU_TEMP"].samples  # type: ignore[attr-defined]
    assert len(temps) == 8
    first = next(s for s in temps if s.labels["gpu"] == "0")
    assert first.labels == {
        "gpu": "0",
        "UUID": sim.gpus[0].uuid,
        "pci_bus_id": "00000000:07:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-40GB",
        "Hostname": "gpu-node-1",
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
    }
    xids = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"].samples}  # type: ignore[attr-defined]
    assert xids["3"] == 79 and xids["0"] == 0
    power = [s.value for s in families["DCGM_FI_DEV_POWER_USAGE"].samples]  # type: ignore[attr-defined]
    assert all(55 <= p <= 400 for p in power)


def test_t4_has_no_hbm_or_row_remapping_samples(simulate: Simulate) -> None:
    simulate("t4:1")
    with Nvml() as nvml:
        families = scrape(Exporter(nvml, hostname="n", pod_resources_socket=None))
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in families
    assert "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" not in families
    assert "DCGM_FI_DEV_ENC_UTIL" in families


def test_mig_devices_get_their_own_framebuffer_samples(simulate: Simulate) -> None:
    simulate("a100-40gb:2")
    with Nvml() as nvml:
        migparted.apply_config(nvml, migparted.load_mig_config(mig_configmap()), "all-balanced")
        families = scrape(Exporter(nvml, hostname="n", pod_resources_socket=None))
    used = families["DCGM_FI_DEV_FB_USED"].samples  # type: ignore[attr-defined]
    mig = [s for s in used if "GPU_I_ID" in s.labels]
    assert len(mig) == 8
    assert sorted({s.labels["GPU_I_PROFILE"] for s in mig}) == ["1g.5gb", "2g.10gb", "3g.20gb"]
    three = next(
        s for s in mig if s.labels["GPU_I_PROFILE"] == "3g.20gb" and s.labels["gpu"] == "1"
    )
    assert three.labels["GPU_I_ID"] == "2"  # the 3g on slices 4-7
    assert len([s for s in used if "GPU_I_ID" not in s.labels]) == 2
    temps = families["DCGM_FI_DEV_GPU_TEMP"].samples  # type: ignore[attr-defined]
    assert all("GPU_I_ID" not in s.labels for s in temps)


def test_podresources_messages_round_trip_and_newer_fields_are_ignored() -> None:
    from gpu_operator.kubelet_api.podresources.v1 import api_pb2 as pb

    pods = [
        PodResources(
            "train-0",
            "ml",
            (
                ContainerResources(
                    "main",
                    (
                        ContainerDevices("nvidia.com/gpu", ("GPU-a", "GPU-b")),
                        ContainerDevices("example.com/nic", ("eth1",)),
                    ),
                ),
            ),
        ),
        PodResources("idle", "default"),
    ]
    wire = list_response(pods).SerializeToString()
    assert pods_from(pb.ListPodResourcesResponse.FromString(wire)) == pods
    # what a kubelet with CPU, memory and DRA managers adds is not part of the attribution
    container = pb.ContainerResources(
        name="c",
        cpu_ids=[4, 5],
        memory=[pb.ContainerMemory(memory_type="memory", size=7)],
        dynamic_resources=[pb.DynamicResource(claim_name="claim")],
    )
    newer = pb.ListPodResourcesResponse(
        pod_resources=[pb.PodResources(name="p", namespace="ns", containers=[container])]
    )
    wire = newer.SerializeToString()
    assert pods_from(pb.ListPodResourcesResponse.FromString(wire)) == [
        PodResources("p", "ns", (ContainerResources("c"),))
    ]


def test_attributions_map_devices_to_containers() -> None:
    pods = [
        PodResources(
            "a",
            "ml",
            (ContainerResources("x", (ContainerDevices("nvidia.com/gpu", ("GPU-1::0",)),)),),
        ),
        PodResources(
            "b",
            "ml",
            (ContainerResources("y", (ContainerDevices("nvidia.com/gpu", ("GPU-1::3",)),)),),
        ),
        PodResources(
            "c",
            "ml",
            (ContainerResources("z", (ContainerDevices("example.com/fpga", ("GPU-1",)),)),),
        ),
    ]
    assert attributions(pods) == {
        "GPU-1": [Attribution("a", "ml", "x"), Attribution("b", "ml", "y")]
    }


def test_pod_attribution_through_the_kubelet_socket(simulate: Simulate, short_tmp: Path) -> None:
    sim = simulate("a100-40gb:2,h100-80gb:1")
    socket_path = str(short_tmp / "kubelet.sock")
    with Nvml() as nvml:
        nvml.set_mig_mode(2, True)
        from gpu_operator.agent.inventory import Placement

        gi = nvml.create_gpu_instance(2, 2, Placement(0, 4))
        nvml.create_compute_instance(2, gi, 3)
        mig_uuid = nvml.gpu(2).mig_devices[0].uuid
        pods = [
            PodResources(
                "trainer-0",
                "research",
                (
                    ContainerResources(
                        "pytorch", (ContainerDevices("nvidia.com/gpu", (sim.gpus[1].uuid,)),)
                    ),
                ),
            ),
            PodResources(
                "notebook",
                "team-a",
                (
                    ContainerResources(
                        "jupyter", (ContainerDevices("nvidia.com/mig-3g.40gb", (mig_uuid,)),)
                    ),
                ),
            ),
        ]
        with PodResourcesServer(socket_path, pods):
            assert list_pod_resources(socket_path) == pods
            ex = Exporter(nvml, hostname="n", pod_resources_socket=socket_path)
            families = scrape(ex)
    util = {s.labels["gpu"]: s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}  # type: ignore[attr-defined]
    assert util["1"]["pod"] == "trainer-0"
    assert util["1"]["namespace"] == "research"
    assert util["1"]["container"] == "pytorch"
    assert "pod" not in util["0"] and "pod" not in util["2"]
    fb = families["DCGM_FI_DEV_FB_USED"].samples  # type: ignore[attr-defined]
    mig = next(s for s in fb if s.labels.get("GPU_I_ID") == str(gi))
    assert (mig.labels["pod"], mig.labels["namespace"], mig.labels["container"]) == (
        "notebook",
        "team-a",
        "jupyter",
    )


def test_a_missing_or_dead_socket_means_no_pod_labels(simulate: Simulate, short_tmp: Path) -> None:
    simulate("t4:1")
    dead = short_tmp / "dead.sock"
    dead.write_text("")  # exists, but nobody listens
    with Nvml() as nvml:
        for socket_path in (str(short_tmp / "absent.sock"), str(dead)):
            families = scrape(Exporter(nvml, hostname="n", pod_resources_socket=socket_path))
            assert all("pod" not in s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples)  # type: ignore[attr-defined]


def test_http_metrics_and_health(simulate: Simulate) -> None:
    simulate("h100-80gb:2")
    with Nvml() as nvml:
        ex = Exporter(nvml, hostname="n", interval_s=0.05, pod_resources_socket=None)
        server = exporter.make_server(ex, "127.0.0.1", 0)
        thread = Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            with pytest.raises(urllib.error.HTTPError) as unhealthy:
                urllib.request.urlopen(f"{base}/health")
            assert unhealthy.value.code == 503
            ex.start()
            with urllib.request.urlopen(f"{base}/health") as response:
                assert response.status == 200
            with urllib.request.urlopen(f"{base}/metrics") as response:
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                body = response.read().decode()
            names = {f.name for f in text_string_to_metric_families(body)}
            assert "DCGM_FI_DEV_SM_CLOCK" in names
            with pytest.raises(urllib.error.HTTPError) as missing:
                urllib.request.urlopen(f"{base}/nope")
            assert missing.value.code == 404
        finally:
            ex.stop()
            server.shutdown()
            server.server_close()


def test_collection_failure_keeps_the_last_snapshot(simulate: Simulate) -> None:
    import pynvml

    sim = simulate("t4:1")
    with Nvml() as nvml:
        ex = Exporter(nvml, hostname="n", pod_resources_socket=None)
        ex.collect_once()
        before = ex.render()
        sim.fail("nvmlDeviceGetCount_v2", pynvml.NVML_ERROR_GPU_IS_LOST)
        ex.inventory_refresh_s = 0
        ex.collect_once()
        assert ex.last_error.endswith("the GPU is lost")
        assert ex.render() == before


def test_label_values_are_escaped() -> None:
    from prometheus_client.metrics_core import Metric

    family = Metric("X", "help with \\ and\nnewline", "gauge")
    family.add_sample("X", {"modelName": 'a "quoted"\\name'}, 1.5)
    text = exporter.render([family])
    (parsed,) = text_string_to_metric_families(text)
    assert parsed.samples[0].labels["modelName"] == 'a "quoted"\\name'
    assert parsed.samples[0].value == 1.5
