"""Metric readings of a simulated GPU: smooth curves of time, so a scrape sees them move.

Each GPU's load follows a two-minute sine, phase-shifted per GPU; power, clocks, temperature,
utilization and memory use follow the load within the model's range. Energy is the closed-form
integral of power, so it only grows, as a counter must.
"""

from __future__ import annotations

import math

from .devices import SimGi, SimGpu
from .profiles import GpuModel

PERIOD_S = 120.0
MIB = 1024 * 1024


def load_factor(elapsed_s: float, index: int) -> float:
    """A smooth 0.1..0.9 load for GPU ``index``."""
    return 0.5 + 0.4 * math.sin(2 * math.pi * elapsed_s / PERIOD_S + index * 0.7)


def power_w(model: GpuModel, load: float) -> float:
    idle, peak = model.power["idle_w"], model.power["max_w"]
    return idle + (peak * 0.75 - idle) * load


def energy_mj(model: GpuModel, index: int, elapsed_s: float) -> float:
    """Energy since boot in mJ: the integral of :func:`power_w`, strictly increasing."""
    idle, peak = model.power["idle_w"], model.power["max_w"]
    span = peak * 0.75 - idle
    w = 2 * math.pi / PERIOD_S
    phase = index * 0.7
    joules = (idle + 0.5 * span) * elapsed_s - span * 0.4 / w * (
        math.cos(w * elapsed_s + phase) - math.cos(phase)
    )
    boot = 1_000_000_000.0 + 7_000_000.0 * index  # what the GPU had used before we started
    return boot + joules * 1000.0


def sm_clock_mhz(model: GpuModel, load: float) -> int:
    """SM clock, rising to its maximum at 60 % load, in the 15 MHz steps GPUs report."""
    idle, top = model.clocks["sm_idle"], model.clocks["sm_max"]
    value = idle + (top - idle) * min(1.0, load * 1.6)
    return int(round(value / 15.0) * 15)


def gpu_temperature_c(model: GpuModel, load: float) -> int:
    t = model.temperature
    return int(t["idle_c"] + (t["max_c"] - t["idle_c"]) * load)


def memory_temperature_c(model: GpuModel, load: float) -> int:
    t = model.temperature
    return int(t["idle_c"] + 4 + (t["max_c"] - t["idle_c"]) * load)


def utilization_pct(load: float) -> tuple[int, int]:
    """(GPU, memory) utilization."""
    return int(100 * load), int(55 * load)


def codec_utilization_pct(model: GpuModel, load: float, share: float) -> int:
    return int(20 * share * load) if model.encoder else 0


def memory_bytes(gpu: SimGpu, gi: SimGi | None, load: float) -> tuple[int, int, int, int]:
    """(total, free, used, reserved) in bytes, of a GPU or of the MIG device in ``gi``.

    Only GPU instances with a compute instance run work; with MIG on, the GPU's use is theirs.
    """
    if gi is not None:
        total, reserved = gpu.profile_of(gi).memory_mib, 0
        used = int(total * 0.3 * load) if gi.cis else 0
    else:
        total, reserved = gpu.model.memory_mib, gpu.model.memory_reserved_mib
        if gpu.mig_current:
            busy = [gpu.profile_of(g).memory_mib for g in gpu.gis if g.cis]
            used = sum(int(m * 0.3 * load) for m in busy)
        else:
            used = int((total - reserved) * 0.3 * load)
    free = total - reserved - used
    return total * MIB, free * MIB, used * MIB, reserved * MIB
