"""The driver's nvidia-smi sets a GPU's time-slice (here the stub driver's, whose GPUs keep
it); without one, the setting fails naming where it looked."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.agent.dra.prepare import PrepareError
from gpu_operator.agent.dra.sharing import NvidiaSmi
from gpu_operator.agent.driver_cdi import find_host_driver
from gpu_operator.sim import stubdriver as sd
from tests import prerequisites
from tests.unit.agent.dra.test_plugin import no_driver
from tests.unit.sim.test_stubdriver import GPUS, lay_driver

GPU = GPUS[1]  # the A100, minor 0


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    prerequisites.gcc()
    return lay_driver(tmp_path / "driver", sd.build_stubs())


def test_the_drivers_nvidia_smi_sets_the_time_slice_the_gpu_then_holds(driver_root: Path) -> None:
    driver, missing = find_host_driver(str(driver_root), "/")
    assert missing is None
    smi = NvidiaSmi(driver)
    smi.set_time_slice(GPU.uuid, "Long")
    assert sd.read_compute_policy(driver_root / "dev", GPU.uuid).time_slice == "Long"
    smi.set_time_slice(GPU.uuid, "Default")
    assert sd.read_compute_policy(driver_root / "dev", GPU.uuid) == sd.ComputePolicy()
    with pytest.raises(PrepareError, match=r"exited 6: No devices were found"):
        smi.set_time_slice("GPU-not-here", "Short")
    smi.set_compute_mode(GPU.uuid, "EXCLUSIVE_PROCESS")  # what an MPS claim's daemon needs
    assert sd.read_compute_policy(driver_root / "dev", GPU.uuid).compute_mode == "Exclusive_Process"
    smi.set_compute_mode(GPU.uuid, "DEFAULT")
    assert sd.read_compute_policy(driver_root / "dev", GPU.uuid) == sd.ComputePolicy()


def test_without_nvidia_smi_the_setting_fails_naming_where_it_looked() -> None:
    with pytest.raises(PrepareError, match="no nvidia-smi in the driver root"):
        NvidiaSmi(no_driver()).set_time_slice(GPU.uuid, "Long")
