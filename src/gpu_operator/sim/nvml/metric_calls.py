"""C entry points for the readings an exporter scrapes; full GPUs only, as on hardware."""

from __future__ import annotations

import time
from typing import Any

import pynvml

from . import telemetry
from .cabi import EntryPoints, as_int, dest
from .devices import NvmlFault
from .node import SimNode

ENTRY_POINTS = EntryPoints()


@ENTRY_POINTS.add
def nvmlDeviceGetClockInfo(node: SimNode, handle: Any, clock_type: Any, out: Any) -> None:
    gpu = node.full_gpu(handle)
    kind = as_int(clock_type)
    if kind in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
        dest(out).value = telemetry.sm_clock_mhz(gpu.model, node.load(gpu.index))
    elif kind == pynvml.NVML_CLOCK_MEM:
        dest(out).value = gpu.model.clocks["mem"]
    else:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)


@ENTRY_POINTS.add
def nvmlDeviceGetTemperature(node: SimNode, handle: Any, sensor: Any, out: Any) -> None:
    gpu = node.full_gpu(handle)
    if as_int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    dest(out).value = telemetry.gpu_temperature_c(gpu.model, node.load(gpu.index))


@ENTRY_POINTS.add
def nvmlDeviceGetFieldValues(node: SimNode, handle: Any, count: Any, values: Any) -> None:
    """Memory temperature where the model has a sensor (HBM); every other field unsupported."""
    gpu = node.full_gpu(handle)
    array = dest(values)
    now_us = int(time.time() * 1_000_000)
    for i in range(as_int(count)):
        entry = array[i]
        entry.timestamp = now_us
        entry.latencyUsec = 0
        if entry.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP and gpu.model.memory_temperature:
            entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            entry.value.uiVal = telemetry.memory_temperature_c(gpu.model, node.load(gpu.index))
            entry.nvmlReturn = pynvml.NVML_SUCCESS
        else:
            entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED


@ENTRY_POINTS.add
def nvmlDeviceGetPowerUsage(node: SimNode, handle: Any, out: Any) -> None:
    gpu = node.full_gpu(handle)
    dest(out).value = int(telemetry.power_w(gpu.model, node.load(gpu.index)) * 1000)


@ENTRY_POINTS.add
def nvmlDeviceGetTotalEnergyConsumption(node: SimNode, handle: Any, out: Any) -> None:
    gpu = node.full_gpu(handle)
    dest(out).value = int(telemetry.energy_mj(gpu.model, gpu.index, node.elapsed_s()))


@ENTRY_POINTS.add
def nvmlDeviceGetPcieReplayCounter(node: SimNode, handle: Any, out: Any) -> None:
    node.full_gpu(handle)
    dest(out).value = 0


@ENTRY_POINTS.add
def nvmlDeviceGetUtilizationRates(node: SimNode, handle: Any, out: Any) -> None:
    gpu = node.full_gpu(handle)
    util = dest(out)
    util.gpu, util.memory = telemetry.utilization_pct(node.load(gpu.index))


@ENTRY_POINTS.add
def nvmlDeviceGetEncoderUtilization(node: SimNode, handle: Any, util: Any, period: Any) -> None:
    _codec(node, handle, util, period, 1.0)


@ENTRY_POINTS.add
def nvmlDeviceGetDecoderUtilization(node: SimNode, handle: Any, util: Any, period: Any) -> None:
    _codec(node, handle, util, period, 0.5)


def _codec(node: SimNode, handle: Any, util: Any, period: Any, share: float) -> None:
    gpu = node.full_gpu(handle)
    dest(util).value = telemetry.codec_utilization_pct(gpu.model, node.load(gpu.index), share)
    dest(period).value = 167000
