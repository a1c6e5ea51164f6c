"""The NVML side of GPU health: :meth:`Nvml.health_readings` and :meth:`Nvml.gpu_processes`
through the real pynvml wrappers over the simulated library. Injected return codes make a GPU
lost; values the simulated library may not offer (ECC counts, clock event reasons, processes)
come from a thin fake at the pynvml function level, so these tests hold before and after the
simulated library learns them."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.nvml.health import HealthReading
from gpu_operator.sim.nvml import (
    SimulatedNvml,
    install_simulated_nvml,
    uninstall_simulated_nvml,
)

GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.fixture
def sim() -> Iterator[SimulatedNvml]:
    yield install_simulated_nvml("a100-40gb:2", seed="health")
    uninstall_simulated_nvml()


@pytest.fixture
def nvml(sim: SimulatedNvml) -> Iterator[Nvml]:
    with Nvml() as opened:
        yield opened


def _raise(code: int) -> Any:
    def fail(*_: Any) -> Any:
        raise pynvml.NVMLError(code)

    return fail


def test_a_healthy_gpu_reads_clean(nvml: Nvml) -> None:
    inventory = nvml.inventory()
    for reading in nvml.health_readings(inventory):
        assert reading.error is None
        assert not reading.remap_pending and not reading.remap_failure
        assert not reading.thermal_slowdown and not reading.power_brake
        assert reading.ecc_uncorrected in (None, 0)  # None: no such signal (yet) simulated


def test_not_supported_is_no_signal_not_a_fault(
    nvml: Nvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = nvml.inventory()
    for name in (
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        monkeypatch.setattr(pynvml, name, _raise(NOT_SUPPORTED))
    gpu = inventory.gpus[0]
    assert nvml.health_readings(inventory)[0] == HealthReading(gpu.index, gpu.uuid)


def test_the_signals_are_read_as_nvml_gives_them(
    nvml: Nvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = nvml.inventory()
    asked: list[tuple[int, int]] = []

    def ecc(handle: Any, error_type: int, counter: int) -> int:
        asked.append((error_type, counter))
        return 3

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEccErrors", ecc)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetRemappedRows", lambda h: (0, 2, 1, 0))
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetCurrentClocksEventReasons",
        lambda h: (
            pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        ),
    )
    reading = nvml.health_readings(inventory)[1]
    assert asked[0] == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    assert reading.ecc_uncorrected == 3
    assert (reading.remap_pending, reading.remap_failure) == (True, False)
    assert (reading.thermal_slowdown, reading.power_brake) == (True, False)


def test_an_old_library_gives_the_throttle_reasons_instead(
    nvml: Nvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = nvml.inventory()
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetCurrentClocksEventReasons",
        _raise(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
    )
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        lambda h: pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown,
    )
    reading = nvml.health_readings(inventory)[0]
    assert (reading.thermal_slowdown, reading.power_brake) == (False, True)


def test_a_lost_gpu_reads_as_an_error_and_answers_again_later(
    sim: SimulatedNvml, nvml: Nvml
) -> None:
    inventory = nvml.inventory()
    sim.fail("nvmlDeviceGetRemappedRows", GPU_IS_LOST)
    readings = nvml.health_readings(inventory)
    assert all(r.error and "lost" in r.error for r in readings)
    sim.clear_failures()
    assert all(r.error is None for r in nvml.health_readings(inventory))


def test_another_gpu_at_the_index_is_an_error(nvml: Nvml) -> None:
    inventory = nvml.inventory()
    gpu = inventory.gpus[0]
    swapped = type(inventory)(
        driver_version=inventory.driver_version,
        cuda_driver_version=inventory.cuda_driver_version,
        gpus=(type(gpu)(**{**gpu.__dict__, "uuid": "GPU-gone"}),),
    )
    (reading,) = nvml.health_readings(swapped)
    assert reading.error == f"GPU 0 is now {gpu.uuid}"


def test_processes_compute_and_graphics_or_unknown(
    nvml: Nvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml.inventory()
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetComputeRunningProcesses",
        lambda h: [SimpleNamespace(pid=42), SimpleNamespace(pid=7)],
    )
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda h: [SimpleNamespace(pid=42)]
    )
    assert nvml.gpu_processes(0) == (7, 42)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda h: [])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: [])
    assert nvml.gpu_processes(1) == ()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", _raise(NOT_SUPPORTED))
    assert nvml.gpu_processes(1) is None  # unknown: not idle


def test_injected_hardware_faults_when_the_simulated_library_has_them(
    sim: SimulatedNvml, nvml: Nvml
) -> None:
    inject = getattr(sim, "inject_fault", None)
    if inject is None:
        pytest.skip("the simulated library has no hardware fault injection yet")
    inventory = nvml.inventory()
    inject(0, "ecc", 2)
    inject(0, "remap-pending")
    inject(1, "thermal")
    first, second = nvml.health_readings(inventory)
    assert first.ecc_uncorrected == 2 and first.remap_pending
    assert second.thermal_slowdown and not second.power_brake


def test_an_xid_79_from_a_gpu_that_fell_off_the_bus_is_still_attributed_to_it(
    sim: SimulatedNvml, nvml: Nvml
) -> None:
    inventory = nvml.inventory()
    assert nvml.xid_events([0, 1]) == []  # the event set registers both GPUs
    sim.inject_fault(0, "lost")
    nvml.health_readings(inventory)  # finds GPU 0 lost and lets go of its handle
    sim.inject_xid(0, 79)
    (event,) = nvml.xid_events([0, 1])
    assert (event.gpu_index, event.xid) == (0, 79)
