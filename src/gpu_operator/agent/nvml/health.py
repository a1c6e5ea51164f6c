"""One health reading of a GPU, and the processes on it, over pynvml (used by :class:`Nvml`).

What a signal the GPU or driver does not offer reads as ``None`` (NOT_SUPPORTED, or a function
missing from an old library): no signal, never a fault. Any other NVML error (GPU_IS_LOST
above all) means the GPU did not answer, and the reading says so in ``error``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from .errors import NotSupported, NvmlError, call
from .names import text

T = TypeVar("T")

# Clock event reasons that mean the GPU protects itself from heat, or from its power supply.
THERMAL_REASONS = (
    pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    | pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
)
POWER_BRAKE_REASONS = pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown


@dataclass(frozen=True)
class HealthReading:
    """What one poll read of one GPU; ``None``: the GPU offers no such signal."""

    index: int
    uuid: str  # the GPU expected at ``index`` (from the inventory)
    error: str | None = None  # the GPU did not answer NVML, or another GPU is at its index
    ecc_uncorrected: int | None = None  # volatile double-bit ECC errors since the driver loaded
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    thermal_slowdown: bool | None = None
    power_brake: bool | None = None


def _signal(fn: Callable[..., T], *args: Any) -> T | None:
    try:
        return call(fn, *args)
    except NotSupported:
        return None


def _clock_reasons(dev: Any) -> int | None:
    """NVML 12.x calls them clock event reasons; older libraries only know "throttle"."""
    newer = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if newer is not None:
        try:
            return int(call(newer, dev))
        except NotSupported as exc:
            if exc.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                return None
    reasons = _signal(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, dev)
    return None if reasons is None else int(reasons)


def read_health(device: Callable[[int], Any], index: int, uuid: str) -> HealthReading:
    """One reading of the GPU at ``index``; ``device`` gives its NVML handle."""
    try:
        dev = device(index)
        found = text(call(pynvml.nvmlDeviceGetUUID, dev))
        if found != uuid:
            return HealthReading(index, uuid, error=f"GPU {index} is now {found}")
        ecc = _signal(
            pynvml.nvmlDeviceGetTotalEccErrors,
            dev,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        rows = _signal(pynvml.nvmlDeviceGetRemappedRows, dev)
        reasons = _clock_reasons(dev)
    except NvmlError as exc:
        return HealthReading(index, uuid, error=str(exc))
    return HealthReading(
        index,
        uuid,
        ecc_uncorrected=None if ecc is None else int(ecc),
        remap_pending=None if rows is None else bool(rows[2]),
        remap_failure=None if rows is None else bool(rows[3]),
        thermal_slowdown=None if reasons is None else bool(reasons & THERMAL_REASONS),
        power_brake=None if reasons is None else bool(reasons & POWER_BRAKE_REASONS),
    )


def running_pids(dev: Any) -> tuple[int, ...] | None:
    """The compute and graphics processes on a GPU; None when NVML cannot tell (unknown)."""
    pids: set[int] = set()
    for fn in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        try:
            found = call(fn, dev)
        except NvmlError:
            return None
        pids.update(int(p.pid) for p in found or ())
    return tuple(sorted(pids))
