"""GPU health on the real driver, read only: the signals the device-plugin agent turns into the
``GPUHealthy`` Node condition (ECC, row remaps, clock event reasons, XID events) read through
the project's NVML adapter agree with nvidia-smi, and a healthy GPU gives a True condition."""

from __future__ import annotations

from gpu_operator.agent.gpuhealth.condition import node_condition
from gpu_operator.agent.gpuhealth.settings import HealthSettings
from gpu_operator.agent.gpuhealth.state import observe
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from tests.gpu.conftest import Driver

FIELDS = (
    "index",
    "ecc.errors.uncorrected.volatile.total",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown",
)


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _flag(text: str) -> bool | None:
    return {"Active": True, "Not Active": False, "Yes": True, "No": False}.get(text)


def test_health_signals_are_nvidia_smis_and_a_healthy_gpu_reads_healthy(
    driver: Driver, nvml: Nvml, inventory: Inventory
) -> None:
    smi = {int(row[0]): row for row in driver.smi.query(FIELDS)}
    readings = nvml.health_readings(inventory)
    assert len(readings) == len(inventory.gpus)
    faulty = False
    for reading in readings:
        row = smi[reading.index]
        print(f"GPU {reading.index}: {reading}; nvidia-smi {row[1:]}")
        assert reading.error is None, reading.error  # every GPU answers
        if reading.ecc_uncorrected is not None and _number(row[1]) is not None:
            assert reading.ecc_uncorrected == _number(row[1])
        if reading.remap_pending is not None and _flag(row[2]) is not None:
            assert reading.remap_pending == _flag(row[2])
        if reading.remap_failure is not None and _flag(row[3]) is not None:
            assert reading.remap_failure == _flag(row[3])
        if reading.thermal_slowdown is not None and None not in (_flag(row[4]), _flag(row[5])):
            assert reading.thermal_slowdown == (bool(_flag(row[4])) or bool(_flag(row[5])))
        faulty = faulty or bool(reading.remap_pending or reading.remap_failure)
    # Registering for XID events needs no privilege a read-only tier lacks; none is pending.
    events = nvml.xid_events([g.index for g in inventory.gpus], 100)
    print(f"XID events pending: {events}")
    gpus = {g.uuid: g.index for g in inventory.gpus}
    state = observe({}, gpus, readings, events, 0.0, HealthSettings())
    condition = node_condition(state)
    print(f"GPUHealthy {condition}")
    # The first reading only sets the ECC baseline; remaps and XIDs count at once.
    expected = "False" if faulty or events else "True"
    assert condition.status == expected, condition
