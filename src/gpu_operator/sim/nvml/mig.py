"""MIG rules as the hardware applies them, as plain functions over a :class:`SimGpu`.

A GPU instance takes a run of memory slices at one of its profile's placements and a share of
the compute slices; it may not overlap another, exceed the GPU's compute slices or its
profile's maximum count. Compute instances split a GPU instance's compute slices. MIG mode
changes at once (``mode_change: immediate``, Hopper) or stays pending until a reset (A100); a
reset also destroys every GPU instance. A rule that refuses raises :class:`NvmlFault` and leaves
the GPU unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import pynvml

from .devices import CI_SLICES, NvmlFault, SimCi, SimGi, SimGpu
from .profiles import GiProfileSpec, GpuModel


def require_mig_capable(gpu: SimGpu) -> None:
    if not gpu.model.mig_capable:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)


def set_mig_mode(gpu: SimGpu, enable: bool) -> bool:
    """Request MIG on or off; True when the change waits for a GPU reset."""
    if not enable and gpu.gis:
        raise NvmlFault(pynvml.NVML_ERROR_IN_USE)
    gpu.mig_pending = enable
    if gpu.model.mig_mode_change == "immediate":
        gpu.mig_current = enable
    return gpu.mig_current != gpu.mig_pending


def reset(gpu: SimGpu) -> None:
    """What a GPU reset does to MIG: the pending mode applies and every instance is gone."""
    gpu.mig_current = gpu.mig_pending
    gpu.gis.clear()


def fits(model: GpuModel, gis: Sequence[SimGi], profile: GiProfileSpec, start: int) -> bool:
    """Whether a ``profile`` instance at ``start`` fits beside ``gis``."""
    taken = {s for gi in gis for s in range(gi.start, gi.start + gi.size)}
    wanted = set(range(start, start + profile.size))
    compute = 0
    for gi in gis:
        placed = model.gi_profile(index=gi.profile_index)
        assert placed is not None
        compute += placed.slices
    same = sum(1 for gi in gis if gi.profile_index == profile.index)
    if taken & wanted or same >= profile.max:
        return False
    return compute + profile.slices <= model.compute_slices


def remaining_gpu_instances(gpu: SimGpu, profile: GiProfileSpec) -> int:
    """How many more ``profile`` instances fit, placed greedily in placement order."""
    occupied = list(gpu.gis)
    for start in profile.starts:
        if fits(gpu.model, occupied, profile, start):
            occupied.append(SimGi(-1, profile.index, start, profile.size))
    return len(occupied) - len(gpu.gis)


def gpu_instance_id(gis: Sequence[SimGi], size: int, start: int) -> int:
    """Hardware-like GI ids: 7g -> 0, halves -> 1-2, quarters -> 3-6, eighths -> 7-14."""
    preferred = {8: 0, 4: 1 + start // 4, 2: 3 + start // 2, 1: 7 + start}.get(size, 15)
    used = {gi.id for gi in gis}
    if preferred not in used:
        return preferred
    return next(i for i in range(16, 64) if i not in used)


def create_gpu_instance(gpu: SimGpu, profile: GiProfileSpec, start: int | None) -> SimGi:
    """Place a GPU instance at ``start``, or at the first placement that fits when None."""
    if not gpu.mig_current:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if start is None:
        start = next((s for s in profile.starts if fits(gpu.model, gpu.gis, profile, s)), None)
        if start is None:
            raise NvmlFault(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    elif start not in profile.starts:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if not fits(gpu.model, gpu.gis, profile, start):
        raise NvmlFault(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    gi = SimGi(gpu_instance_id(gpu.gis, profile.size, start), profile.index, start, profile.size)
    gpu.gis.append(gi)
    return gi


def destroy_gpu_instance(gpu: SimGpu, gi_id: int) -> None:
    gi = gpu.gi(gi_id)
    if gi is None:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if gi.cis:
        raise NvmlFault(pynvml.NVML_ERROR_IN_USE)
    gpu.gis.remove(gi)


def compute_slices(gpu: SimGpu, gi: SimGi, profile_index: int) -> int:
    """Compute slices of compute-instance profile ``profile_index``, if ``gi`` can hold one."""
    slices = CI_SLICES.get(profile_index)
    if slices is None:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if slices > gpu.profile_of(gi).slices:
        raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return slices


def free_compute_slices(gpu: SimGpu, gi: SimGi) -> int:
    return gpu.profile_of(gi).slices - sum(c.slices for c in gi.cis)


def create_compute_instance(gpu: SimGpu, gi_id: int, profile_index: int) -> SimCi:
    """Add a compute instance to GPU instance ``gi_id``: the lowest free id, if slices remain."""
    gi = gpu.gi(gi_id)
    if gi is None:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if compute_slices(gpu, gi, profile_index) > free_compute_slices(gpu, gi):
        raise NvmlFault(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    used = {c.id for c in gi.cis}
    ci = SimCi(next(i for i in range(64) if i not in used), profile_index)
    gi.cis.append(ci)
    return ci


def destroy_compute_instance(gpu: SimGpu, gi_id: int, ci_id: int) -> None:
    gi = gpu.gi(gi_id)
    if gi is None:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    gi.cis = [c for c in gi.cis if c.id != ci_id]


def compute_instance_start(gi: SimGi, ci: SimCi) -> int:
    """A compute instance's first slice: the slices of the instances created before it."""
    return sum(c.slices for c in gi.cis if c.id < ci.id)
