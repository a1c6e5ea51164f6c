"""A GPU's multi-node NVLink fabric (GB200/GB300 NVL72) as NVML reports it, and the node's
clique: ``<cluster UUID>.<clique id>``, what NVIDIA labels ``nvidia.com/gpu.clique`` and what
its compute-domain plugin and IMEX daemon group nodes by.

:func:`node_clique` decides as NVIDIA's compute-domain kubelet plugin does with
``CrashOnNVLinkFabricErrors`` on (its default): GPUs without a fabric are passed over, and a
fabric that is present but not usable is an error (:class:`FabricError`), never a silent "no
clique": a node whose NVLink registration failed must not look like one without NVLink.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pynvml

NOT_SUPPORTED = "not-supported"
NOT_STARTED = "not-started"
IN_PROGRESS = "in-progress"
COMPLETED = "completed"

STATES: dict[int, str] = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: NOT_SUPPORTED,
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: NOT_STARTED,
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: IN_PROGRESS,
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: COMPLETED,
}

SUCCESS = "success"
ZERO_UUID = str(uuid.UUID(int=0))


@dataclass(frozen=True)
class GpuFabric:
    """One GPU's fabric info. ``state``: one of :data:`STATES`' values; ``status``: the NVML
    return code of the fabric registration, ``"success"`` or e.g. ``"not-ready"`` (see
    :func:`status_name`), meaningful once ``state`` is completed."""

    cluster_uuid: str
    clique_id: int
    state: str
    status: str = SUCCESS

    @property
    def clique(self) -> str:
        """``<cluster UUID>.<clique id>``, as NVIDIA writes it."""
        return f"{self.cluster_uuid}.{self.clique_id}"


NO_FABRIC = GpuFabric(cluster_uuid=ZERO_UUID, clique_id=0, state=NOT_SUPPORTED, status=SUCCESS)
"""What a GPU without an NVLink fabric reports (or the driver says NOT_SUPPORTED for)."""


class FabricError(ValueError):
    """The node has an NVLink fabric but no usable clique: a GPU's registration is not
    completed or failed, or the GPUs disagree. ``gpu``: the GPU's index, None when the GPUs
    disagree. The message is one line, fit for a termination message or an Event."""

    def __init__(self, message: str, gpu: int | None = None) -> None:
        super().__init__(message)
        self.gpu = gpu


def status_name(code: int) -> str:
    """An NVML return code as a short name: 0 -> ``success``, NVML_ERROR_NOT_READY ->
    ``not-ready``; an unknown code -> ``error-<code>``."""
    return _STATUS_NAMES.get(code, f"error-{code}")


def status_code(name: str) -> int | None:
    """The NVML return code of a :func:`status_name`; None for a name NVML does not have."""
    return next((code for code, known in _STATUS_NAMES.items() if known == name), None)


def _status_names() -> dict[int, str]:
    names = {int(pynvml.NVML_SUCCESS): SUCCESS}
    for name, value in sorted(vars(pynvml).items()):
        if str(name).startswith("NVML_ERROR_") and isinstance(value, int):
            names.setdefault(value, str(name)[len("NVML_ERROR_") :].lower().replace("_", "-"))
    return names


_STATUS_NAMES = _status_names()


def from_nvml(cluster_uuid: bytes, clique_id: int, state: int, status: int) -> GpuFabric:
    """A GpuFabric from the fields of NVML's ``nvmlGpuFabricInfo*_t``."""
    return GpuFabric(
        cluster_uuid=str(uuid.UUID(bytes=bytes(cluster_uuid))),
        clique_id=int(clique_id),
        state=STATES.get(int(state), f"unknown-{int(state)}"),
        status=status_name(int(status)),
    )


def node_clique(fabrics: Sequence[GpuFabric | None]) -> str | None:
    """The node's clique ``<cluster uuid>.<clique id>``, from each GPU's fabric in index order.

    None when no GPU has a fabric (no GPUs, the driver lacks the call (None), state
    not-supported, or a completed registration with the zero cluster UUID: NVLink but no
    multi-node NVLink). Raises :class:`FabricError` when a GPU's fabric is not-started,
    in-progress or completed with a failed status, or when GPUs name different cliques.
    """
    found: set[str] = set()
    for index, fabric in enumerate(fabrics):
        if fabric is None or fabric.state == NOT_SUPPORTED:
            continue
        if fabric.state != COMPLETED:
            raise FabricError(f"GPU fabric state {fabric.state} on GPU {index}", index)
        if fabric.status != SUCCESS:
            raise FabricError(
                f"GPU fabric registration failed on GPU {index}: {fabric.status}", index
            )
        if fabric.cluster_uuid == ZERO_UUID:
            continue
        found.add(fabric.clique)
    if len(found) > 1:
        raise FabricError(f"GPUs disagree on their fabric clique: {', '.join(sorted(found))}")
    return next(iter(found), None)
