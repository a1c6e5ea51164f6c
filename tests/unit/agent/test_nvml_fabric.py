"""The node's NVLink clique from its GPUs' fabric info, decided as NVIDIA's compute-domain
plugin does: no fabric is no clique, a fabric not ready is an error that says which GPU."""

from __future__ import annotations

import pynvml
import pytest

from gpu_operator.agent.nvml.fabric import (
    NO_FABRIC,
    FabricError,
    GpuFabric,
    from_nvml,
    node_clique,
    status_name,
)

CLUSTER = "6f2e2f0a-5d4c-4b7e-9a51-0c2d4e6f8a10"
OTHER = "1b0c9d8e-7f6a-4b5c-8d9e-0f1a2b3c4d5e"


def done(cluster: str = CLUSTER, clique: int = 1) -> GpuFabric:
    return GpuFabric(cluster_uuid=cluster, clique_id=clique, state="completed", status="success")


def test_gpus_of_one_clique_give_it() -> None:
    assert node_clique([done(), done(), done(), done()]) == f"{CLUSTER}.1"


def test_no_gpus_no_call_and_no_fabric_give_no_clique() -> None:
    assert node_clique([]) is None
    assert node_clique([None, None]) is None
    assert node_clique([NO_FABRIC, NO_FABRIC]) is None


def test_a_completed_fabric_with_the_zero_cluster_uuid_is_nvlink_without_multi_node() -> None:
    single_node = GpuFabric(NO_FABRIC.cluster_uuid, 0, "completed", "success")
    assert node_clique([single_node, single_node]) is None


def test_gpus_without_a_fabric_are_passed_over() -> None:
    assert node_clique([NO_FABRIC, done(clique=7), None]) == f"{CLUSTER}.7"


@pytest.mark.parametrize("state", ["not-started", "in-progress"])
def test_a_fabric_not_yet_registered_is_an_error_naming_the_gpu(state: str) -> None:
    with pytest.raises(FabricError, match=f"^GPU fabric state {state} on GPU 1$") as err:
        node_clique([done(), GpuFabric(CLUSTER, 1, state, "success")])
    assert err.value.gpu == 1


def test_a_failed_registration_is_an_error_with_its_status() -> None:
    failed = GpuFabric(CLUSTER, 1, "completed", "not-ready")
    with pytest.raises(FabricError, match="registration failed on GPU 0: not-ready") as err:
        node_clique([failed, done()])
    assert err.value.gpu == 0


@pytest.mark.parametrize("other", [done(clique=2), done(cluster=OTHER)])
def test_gpus_that_disagree_are_an_error_naming_both_cliques(other: GpuFabric) -> None:
    with pytest.raises(FabricError, match="disagree") as err:
        node_clique([done(), other])
    assert err.value.gpu is None
    assert f"{CLUSTER}.1" in str(err.value) and other.clique in str(err.value)


def test_nvml_fields_become_names_and_a_uuid_string() -> None:
    raw = bytes(range(16))
    fabric = from_nvml(raw, 3, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS)
    assert fabric == GpuFabric("00010203-0405-0607-0809-0a0b0c0d0e0f", 3, "in-progress", "success")
    assert status_name(pynvml.NVML_ERROR_NOT_READY) == "not-ready"
    assert status_name(pynvml.NVML_ERROR_UNKNOWN) == "unknown"
    assert status_name(123456) == "error-123456"
