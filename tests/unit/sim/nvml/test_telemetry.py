"""Metric curves: within each model's range, moving with time, energy the integral of power."""

from __future__ import annotations

import pytest

from gpu_operator.sim.nvml import telemetry
from gpu_operator.sim.nvml.devices import SimCi, SimGi, new_gpus
from gpu_operator.sim.nvml.profiles import available_profiles, load_model

MIB = 1024 * 1024
TIMES = [i * 7.3 for i in range(40)]  # a little over two periods


def test_load_stays_between_a_tenth_and_nine_tenths_and_moves() -> None:
    for index in range(8):
        loads = [telemetry.load_factor(t, index) for t in TIMES]
        assert all(0.1 - 1e-9 <= v <= 0.9 + 1e-9 for v in loads)
        assert max(loads) - min(loads) > 0.7
    # GPUs are phase-shifted: not all at the same load at once
    assert len({round(telemetry.load_factor(10.0, i), 6) for i in range(8)}) == 8


@pytest.mark.parametrize("key", available_profiles())
def test_energy_is_the_integral_of_power(key: str) -> None:
    """Between two readings energy grows by power x time, as a counter of power must."""
    model = load_model(key)
    for index in (0, 5):
        for t in TIMES:
            dt = 0.01
            watts = telemetry.power_w(model, telemetry.load_factor(t + dt / 2, index))
            grown_mj = telemetry.energy_mj(model, index, t + dt) - telemetry.energy_mj(
                model, index, t
            )
            assert grown_mj == pytest.approx(watts * dt * 1000, rel=1e-4)
            assert grown_mj > 0


@pytest.mark.parametrize("key", available_profiles())
def test_readings_stay_within_the_model(key: str) -> None:
    model = load_model(key)
    for load in (0.1, 0.3, 0.5, 0.9):
        assert model.power["idle_w"] <= telemetry.power_w(model, load) <= model.power["max_w"]
        clock = telemetry.sm_clock_mhz(model, load)
        assert clock % 15 == 0
        assert model.clocks["sm_idle"] - 15 <= clock <= model.clocks["sm_max"] + 15
        t = model.temperature
        assert t["idle_c"] <= telemetry.gpu_temperature_c(model, load) <= t["max_c"]
        assert telemetry.memory_temperature_c(model, load) > telemetry.gpu_temperature_c(
            model, load
        )
        gpu_pct, memory_pct = telemetry.utilization_pct(load)
        assert 0 < memory_pct < gpu_pct < 100
        encoder = telemetry.codec_utilization_pct(model, load, 1.0)
        assert encoder == 0 if not model.encoder else 0 < encoder <= 20
    assert telemetry.sm_clock_mhz(model, 0.9) == pytest.approx(model.clocks["sm_max"], abs=8)


def test_memory_of_a_full_gpu_adds_up() -> None:
    gpu = new_gpus([load_model("a100-40gb")], "telemetry")[0]
    total, free, used, reserved = telemetry.memory_bytes(gpu, None, 0.5)
    assert (total, reserved) == (40960 * MIB, 589 * MIB)
    assert free + used + reserved == total
    assert used == int((40960 - 589) * 0.3 * 0.5) * MIB


def test_with_mig_only_instances_running_work_use_memory() -> None:
    gpu = new_gpus([load_model("a100-40gb")], "telemetry")[0]
    gpu.mig_current = True
    busy = SimGi(1, 2, 0, 4, [SimCi(0, 2)])  # 3g.20gb with a compute instance
    idle = SimGi(2, 2, 4, 4)  # 3g.20gb without one
    gpu.gis = [busy, idle]
    assert telemetry.memory_bytes(gpu, idle, 0.5)[2] == 0
    total, free, used, reserved = telemetry.memory_bytes(gpu, busy, 0.5)
    assert (total, reserved) == (19968 * MIB, 0)
    assert used == int(19968 * 0.3 * 0.5) * MIB and free == total - used
    assert telemetry.memory_bytes(gpu, None, 0.5)[2] == used  # the GPU's use is the busy one's
