"""C entry points of a GPU's NVLink fabric info (``nvmlDeviceGetGpuFabricInfo`` and its
versioned ``...V``), from the GPU's :class:`~.fabric.SimFabric`.

A GPU without a fabric answers success with state NOT_SUPPORTED and a zero cluster UUID. The
versioned call takes ``nvmlGpuFabricInfo_v2`` (health mask) and ``_v3`` (and health summary);
a simulated fabric is healthy, so both read as NVML's "not supported" health values, 0.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from . import fabric
from .cabi import EntryPoints, dest
from .devices import NvmlFault
from .node import SimNode

ENTRY_POINTS = EntryPoints()

VERSIONS = (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3)


def _fill(node: SimNode, handle: Any, info: Any) -> None:
    cluster, clique, state, status = fabric.nvml_fields(node.full_gpu(handle).fabric)
    ctypes.memmove(info.clusterUuid, cluster, len(cluster))
    info.cliqueId, info.state, info.status = clique, state, status


@ENTRY_POINTS.add
def nvmlDeviceGetGpuFabricInfo(node: SimNode, handle: Any, out: Any) -> None:
    _fill(node, handle, dest(out))


@ENTRY_POINTS.add
def nvmlDeviceGetGpuFabricInfoV(node: SimNode, handle: Any, out: Any) -> None:
    info = dest(out)
    if info.version not in VERSIONS:
        raise NvmlFault(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    _fill(node, handle, info)
    info.healthMask = 0
    if info.version == pynvml.nvmlGpuFabricInfo_v3:
        info.healthSummary = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
