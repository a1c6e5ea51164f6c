"""C entry points a GPU health check reads: ECC, row remapping, why clocks are slowed down.

A healthy simulated GPU reports what a healthy board does (ECC on, no errors, nothing remapped,
no slowdown); injected faults (:mod:`.hwfaults`) change the readings. Full GPUs only: a MIG
device's handle is ``NOT_SUPPORTED`` here.
"""

from __future__ import annotations

from typing import Any

import pynvml

from .cabi import EntryPoints, as_int, dest
from .devices import NvmlFault, SimGpu
from .node import SimNode

ENTRY_POINTS = EntryPoints()

THERMAL_REASONS = (
    pynvml.nvmlClocksEventReasonHwSlowdown
    | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    | pynvml.nvmlClocksEventReasonSwThermalSlowdown
)
"""Too hot: the driver slows the clocks (SW thermal), then the board does (HW slowdown, which
NVML reports beside its cause)."""
POWER_BRAKE_REASONS = (
    pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
)
"""The system's power brake asserted: a HW slowdown, and its cause."""


def _with_ecc(node: SimNode, handle: Any) -> SimGpu:
    gpu = node.full_gpu(handle)
    if not gpu.model.ecc:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return gpu


@ENTRY_POINTS.add
def nvmlDeviceGetEccMode(node: SimNode, handle: Any, current: Any, pending: Any) -> None:
    _with_ecc(node, handle)
    dest(current).value = pynvml.NVML_FEATURE_ENABLED
    dest(pending).value = pynvml.NVML_FEATURE_ENABLED


@ENTRY_POINTS.add
def nvmlDeviceGetTotalEccErrors(
    node: SimNode, handle: Any, error_type: Any, counter_type: Any, out: Any
) -> None:
    """Uncorrected errors as injected (volatile: since the last reset); no corrected ones."""
    faults = _with_ecc(node, handle).faults
    kind, counter = as_int(error_type), as_int(counter_type)
    if counter not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
        dest(out).value = 0
    elif kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        volatile = counter == pynvml.NVML_VOLATILE_ECC
        dest(out).value = faults.ecc_volatile if volatile else faults.ecc_aggregate
    else:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)


@ENTRY_POINTS.add
def nvmlDeviceGetRemappedRows(
    node: SimNode, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any
) -> None:
    gpu = node.full_gpu(handle)
    if not gpu.model.row_remapping:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    faults = gpu.faults
    dest(corr).value = 0
    dest(unc).value = faults.remapped_rows
    dest(pending).value = int(faults.remap_pending)
    dest(failure).value = int(faults.remap_failure)


def clocks_event_reasons(gpu: SimGpu) -> int:
    """NVML's bit mask of why the clocks are below their maximum now: none when healthy (the
    simulated load never idles the GPU)."""
    reasons: int = pynvml.nvmlClocksEventReasonNone
    if gpu.faults.thermal:
        reasons |= THERMAL_REASONS
    if gpu.faults.power:
        reasons |= POWER_BRAKE_REASONS
    return reasons


@ENTRY_POINTS.add
def nvmlDeviceGetCurrentClocksEventReasons(node: SimNode, handle: Any, out: Any) -> None:
    dest(out).value = clocks_event_reasons(node.full_gpu(handle))


@ENTRY_POINTS.add
def nvmlDeviceGetCurrentClocksThrottleReasons(node: SimNode, handle: Any, out: Any) -> None:
    """The name before NVML 12.2; the same bits (``nvmlClocksThrottleReason*``)."""
    dest(out).value = clocks_event_reasons(node.full_gpu(handle))
