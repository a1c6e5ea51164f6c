"""C entry points of a GPU's compute mode. With a state file, the mode is the one the stub
driver's C library keeps beside it (:mod:`gpu_operator.sim.stubdriver.compute`), so an
agent's NVML, ``nvidia-smi -c`` and a test read one value; without one, the GPU's own, in
memory, Default after boot."""

from __future__ import annotations

from typing import Any

import pynvml

from gpu_operator.sim.stubdriver.compute import (
    COMPUTE_MODES,
    read_compute_policy,
    write_compute_policy,
)

from .cabi import EntryPoints, as_int, dest
from .devices import NvmlFault
from .node import SimNode

ENTRY_POINTS = EntryPoints()


@ENTRY_POINTS.add
def nvmlDeviceGetComputeMode(node: SimNode, handle: Any, out: Any) -> None:
    gpu = node.full_gpu(handle)
    dev_dir = node.dev_dir()
    if dev_dir is None:
        dest(out).value = node.compute_modes.get(gpu.uuid, pynvml.NVML_COMPUTEMODE_DEFAULT)
        return
    dest(out).value = COMPUTE_MODES.index(read_compute_policy(dev_dir, gpu.uuid).compute_mode)


@ENTRY_POINTS.add
def nvmlDeviceSetComputeMode(node: SimNode, handle: Any, mode: Any) -> None:
    gpu = node.full_gpu(handle)
    value = as_int(mode)
    if not 0 <= value < len(COMPUTE_MODES):
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    dev_dir = node.dev_dir()
    if dev_dir is None:
        node.compute_modes[gpu.uuid] = value
        return
    try:
        write_compute_policy(dev_dir, gpu.uuid, compute_mode=COMPUTE_MODES[value])
    except PermissionError:  # a read-only driver root, as NVML answers a non-root caller
        raise NvmlFault(pynvml.NVML_ERROR_NO_PERMISSION) from None
