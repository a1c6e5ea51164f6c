"""The simulated NVLink fabric: the spec's fabric item, NVML's fabric calls through the real
pynvml wrappers, a fabric made to fail in-process and from outside, and the agent's reading."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest

from gpu_operator.agent.nvml import FabricError, Nvml, node_clique
from gpu_operator.agent.nvml.fabric import NO_FABRIC, GpuFabric
from gpu_operator.sim.nvml import (
    DEFAULT_CLUSTER_UUID,
    SimFabric,
    SimulationError,
    available_profiles,
    fabric_of_spec,
    load_model,
    parse_fabric,
    parse_spec,
    set_fabric,
)
from tests.unit.conftest import Simulate

CLUSTER = "6f2e2f0a-5d4c-4b7e-9a51-0c2d4e6f8a10"
NVL72_NODE = f"gb200:4,fabric={CLUSTER}.3"


def fabric_info(index: int, versioned: bool = True) -> pynvml.c_nvmlGpuFabricInfo_v2_t:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    if versioned:
        info = pynvml.c_nvmlGpuFabricInfo_v2_t()
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    else:
        info = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    return info


def test_only_the_nvl72_profiles_have_an_nvlink_fabric() -> None:
    with_fabric = {key for key in available_profiles() if load_model(key).nvlink_fabric}
    assert with_fabric == {"gb200", "gb300"}
    gb200, gb300 = load_model("gb200"), load_model("gb300")
    assert (gb200.name, gb200.compute_capability) == ("NVIDIA GB200", (10, 0))
    assert (gb300.name, gb300.compute_capability) == ("NVIDIA GB300", (10, 3))
    assert gb200.gi_profile(index=4).name == "7g.186gb"  # type: ignore[union-attr]
    assert gb300.gi_profile(index=4).name == "7g.278gb"  # type: ignore[union-attr]


@pytest.mark.parametrize("versioned", [True, False])
def test_a_gb200_reports_its_cluster_and_clique(simulate: Simulate, versioned: bool) -> None:
    simulate(NVL72_NODE)
    pynvml.nvmlInit()
    try:
        info = fabric_info(1, versioned)
    finally:
        pynvml.nvmlShutdown()
    assert bytes(info.clusterUuid) == bytes.fromhex(CLUSTER.replace("-", ""))
    assert info.cliqueId == 3
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert info.status == pynvml.NVML_SUCCESS


def test_the_versioned_call_takes_v3_and_refuses_an_unknown_version(simulate: Simulate) -> None:
    simulate(NVL72_NODE)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
        v3.healthSummary = 9
        pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(v3))
        assert (v3.cliqueId, v3.healthSummary) == (3, 0)
        bad = pynvml.c_nvmlGpuFabricInfo_v2_t()
        bad.version = 0x01000024
        with pytest.raises(pynvml.NVMLError) as err:
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(bad))
        assert err.value.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    finally:
        pynvml.nvmlShutdown()


def test_gpus_without_a_fabric_say_not_supported(simulate: Simulate) -> None:
    simulate("h100-80gb:2,b200-180gb:1")
    pynvml.nvmlInit()
    try:
        infos = [fabric_info(i) for i in range(3)]
    finally:
        pynvml.nvmlShutdown()
    assert {i.state for i in infos} == {pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED}
    assert {bytes(i.clusterUuid) for i in infos} == {bytes(16)}
    with Nvml() as nvml:
        assert [nvml.gpu_fabric(i) for i in range(3)] == [NO_FABRIC] * 3


def test_the_agent_reads_the_clique_of_a_gb200_node(simulate: Simulate) -> None:
    simulate(NVL72_NODE)
    with Nvml() as nvml:
        fabrics = [nvml.gpu_fabric(i) for i in range(nvml.device_count())]
    assert fabrics == [GpuFabric(CLUSTER, 3, "completed", "success")] * 4
    assert node_clique(fabrics) == f"{CLUSTER}.3"


def test_without_a_fabric_item_gb200_nodes_share_the_default_rack(simulate: Simulate) -> None:
    simulate("gb300:4")
    with Nvml() as nvml:
        assert node_clique([nvml.gpu_fabric(i) for i in range(4)]) == f"{DEFAULT_CLUSTER_UUID}.1"


def test_a_driver_without_the_calls_gives_none(simulate: Simulate) -> None:
    sim = simulate(NVL72_NODE)
    with Nvml() as nvml:
        sim.fail("nvmlDeviceGetGpuFabricInfoV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert nvml.gpu_fabric(0) == GpuFabric(CLUSTER, 3, "completed", "success")  # older call
        sim.fail("nvmlDeviceGetGpuFabricInfoV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        sim.fail("nvmlDeviceGetGpuFabricInfo", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert nvml.gpu_fabric(0) is None


@pytest.mark.parametrize(
    ("item", "fabric"),
    [
        (f"{CLUSTER}.3", SimFabric(CLUSTER, 3)),
        (f"{CLUSTER}.0/not-started", SimFabric(CLUSTER, 0, "not-started")),
        (f"{CLUSTER}.7/completed/not-ready", SimFabric(CLUSTER, 7, "completed", "not-ready")),
    ],
)
def test_the_fabric_item_of_a_spec(item: str, fabric: SimFabric) -> None:
    assert parse_fabric(item) == fabric
    assert fabric_of_spec(f"gb200:4,fabric={item}") == fabric
    assert [m.key for m in parse_spec(f"gb200:2,fabric={item}")] == ["gb200", "gb200"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gb200:4,fabric=not-a-uuid.1", "no UUID"),
        (f"gb200:4,fabric={CLUSTER}", "expected <cluster uuid>.<clique id>"),
        (f"gb200:4,fabric={CLUSTER}.1/broken", "fabric state 'broken'"),
        (f"gb200:4,fabric={CLUSTER}.1/completed/no-such-code", "not an NVML return code"),
        (f"gb200:4,fabric={CLUSTER}.1,fabric={CLUSTER}.2", "a node has one fabric"),
        (f"h100-80gb:8,fabric={CLUSTER}.1", "none of its GPUs has an NVLink fabric"),
    ],
)
def test_a_bad_fabric_item_is_refused(simulate: Simulate, spec: str, message: str) -> None:
    with pytest.raises(SimulationError, match=message):
        simulate(spec)


def test_one_gpu_made_to_fail_fails_the_node_clique(simulate: Simulate) -> None:
    sim = simulate(NVL72_NODE)
    with Nvml() as nvml:
        sim.set_fabric(2, state="not-started")
        with pytest.raises(FabricError, match="GPU fabric state not-started on GPU 2"):
            node_clique([nvml.gpu_fabric(i) for i in range(4)])
        sim.set_fabric(state="completed", status="not-ready")
        with pytest.raises(FabricError, match="registration failed on GPU 0: not-ready"):
            node_clique([nvml.gpu_fabric(i) for i in range(4)])
        with pytest.raises(SimulationError, match="not-supported"):
            sim.set_fabric(0, state="not-supported")


def test_a_gpu_without_a_fabric_cannot_be_given_a_state(simulate: Simulate) -> None:
    sim = simulate(f"t4:1,gb200:1,fabric={CLUSTER}.3")
    with pytest.raises(SimulationError, match="no NVLink fabric"):
        sim.set_fabric(0, state="not-started")
    sim.set_fabric(state="in-progress")  # every GPU that has one
    with Nvml() as nvml:
        assert nvml.gpu_fabric(0) == NO_FABRIC
        assert nvml.gpu_fabric(1) == GpuFabric(CLUSTER, 3, "in-progress", "success")


def test_a_fabric_set_from_outside_reaches_the_running_agents(
    simulate: Simulate, tmp_path: Path
) -> None:
    state = tmp_path / "nvml-state.json"
    simulate(NVL72_NODE, state_file=state)
    with Nvml() as nvml:
        assert node_clique([nvml.gpu_fabric(i) for i in range(4)]) == f"{CLUSTER}.3"
        assert set_fabric(state, 1, state="in-progress") == [1]
        assert nvml.gpu_fabric(1) == GpuFabric(CLUSTER, 3, "in-progress", "success")
        assert set_fabric(state, state="completed") == [0, 1, 2, 3]
        assert node_clique([nvml.gpu_fabric(i) for i in range(4)]) == f"{CLUSTER}.3"
