"""DynamicMIG's MIG devices, created at Prepare and destroyed at Unprepare (the I/O of
:mod:`gpu_operator.agent.dra.partitions`).

Create: MIG mode on where the GPU is not in it yet (only a GPU that needs no reset for it: the
plugin never resets a GPU), the GPU instance at the allocated placement, then one compute
instance over all of it; a compute instance that fails takes its GPU instance with it, so a
refused Prepare leaves the GPU as it found it. Destroy: the compute and GPU instance, then MIG
mode off once the GPU holds no instance and can switch back by itself. At start the plugin
destroys every instance no checkpointed claim holds: what a plugin killed between creating a
GPU instance and its compute instance, or down while a claim went, left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from gpu_operator.agent.dra.partitions import offers_partitions, switches_mig_without_reset
from gpu_operator.agent.dra.prepare import CreatedMig, PrepareError
from gpu_operator.agent.inventory import Gpu, Inventory, Placement

log = logging.getLogger(__name__)


class MigDevices(Protocol):
    """What DynamicMIG needs of NVML (:class:`gpu_operator.agent.nvml.Nvml` has it)."""

    def inventory(self) -> Inventory: ...

    def gpu(self, index: int) -> Gpu: ...

    def set_mig_mode(self, index: int, enabled: bool) -> tuple[bool, bool]: ...

    def create_gpu_instance(self, index: int, profile_index: int, placement: Placement) -> int: ...

    def create_compute_instance(self, index: int, gi_id: int, slices: int) -> int: ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...


class MigControl:
    """Creates and destroys claims' MIG devices; callers serialise the calls (the plugin's
    lock), so two claims never race for one GPU's MIG mode."""

    def __init__(self, nvml: MigDevices) -> None:
        self.nvml = nvml

    def _find(self, uuid: str) -> Gpu | None:
        return next((g for g in self.nvml.inventory().gpus if g.uuid == uuid), None)

    def _gpu(self, uuid: str) -> Gpu:
        gpu = self._find(uuid)
        if gpu is None:
            raise PrepareError(f"GPU {uuid} is not on this node (any more)")
        return gpu

    def create(self, mig: CreatedMig) -> CreatedMig:
        """``mig`` created: its ids and UUID filled in."""
        gpu = self._gpu(mig.gpu_uuid)
        part = mig.partition
        where = f"a {part.profile} MIG device at placement {part.placement.start} of {gpu.uuid}"
        if not gpu.mig_current:
            if not switches_mig_without_reset(gpu):
                raise PrepareError(
                    f"{where}: the GPU is not in MIG mode and needs a reset to switch; "
                    "enable MIG on it (nvidia.com/mig.config) first"
                )
            current, _ = self.nvml.set_mig_mode(gpu.index, True)
            if not current:
                raise PrepareError(f"{where}: MIG mode did not turn on")
        try:
            gi = self.nvml.create_gpu_instance(gpu.index, part.profile_index, part.placement)
        except Exception as exc:
            self._mig_off_if_idle(gpu.index)
            raise PrepareError(f"creating {where}: {exc}") from None
        try:
            ci = self.nvml.create_compute_instance(gpu.index, gi, part.slices)
        except Exception as exc:
            self.nvml.destroy_gpu_instance(gpu.index, gi)
            self._mig_off_if_idle(gpu.index)
            raise PrepareError(f"creating the compute instance of {where}: {exc}") from None
        found = self.nvml.gpu(gpu.index).mig_devices
        device = next((m for m in found if (m.gi_id, m.ci_id) == (gi, ci)), None)
        if device is None:
            self.nvml.destroy_gpu_instance(gpu.index, gi)
            raise PrepareError(f"{where}: created, but NVML lists no such MIG device")
        log.info("created MIG device %s (%s, GI %d, CI %d)", device.uuid, part.profile, gi, ci)
        return replace(mig, gi_id=gi, ci_id=ci, uuid=device.uuid)

    def destroy(self, mig: CreatedMig) -> None:
        """``mig``'s instances gone (already gone is fine), then MIG mode off if idle."""
        gpu = self._find(mig.gpu_uuid)
        if gpu is None:
            return
        if any(gi.id == mig.gi_id for gi in gpu.gpu_instances):
            self.nvml.destroy_gpu_instance(gpu.index, mig.gi_id)
            log.info("destroyed MIG device %s", mig.uuid)
        self._mig_off_if_idle(gpu.index)

    def whole_gpu(self, uuid: str) -> None:
        """A whole GPU handed out under DynamicMIG: out of MIG mode first (the scheduler's
        counters leave no partition of it allocated, so an instance still there is a leak)."""
        gpu = self._gpu(uuid)
        if not gpu.mig_current:
            return
        if gpu.gpu_instances:
            raise PrepareError(f"GPU {uuid} still holds MIG devices no claim was given")
        if not switches_mig_without_reset(gpu):
            raise PrepareError(f"GPU {uuid} is in MIG mode and needs a reset to leave it")
        self.nvml.set_mig_mode(gpu.index, False)

    def destroy_unheld(self, held: Iterable[CreatedMig]) -> list[str]:
        """Destroy every instance on a partitioned GPU that no claim in ``held`` has; returns
        them as ``<GPU UUID>/gi<id>``."""
        keep = {(m.gpu_uuid, m.gi_id) for m in held}
        gone = []
        for gpu in self.nvml.inventory().gpus:
            if not (gpu.mig_current and offers_partitions(gpu)):
                continue
            for gi in gpu.gpu_instances:
                if (gpu.uuid, gi.id) not in keep:
                    self.nvml.destroy_gpu_instance(gpu.index, gi.id)
                    gone.append(f"{gpu.uuid}/gi{gi.id}")
            self._mig_off_if_idle(gpu.index)
        if gone:
            log.info("destroyed MIG devices no claim holds: %s", ", ".join(gone))
        return gone

    def _mig_off_if_idle(self, index: int) -> None:
        """GPU ``index`` out of MIG mode, as read now, when it holds no instance and can leave
        the mode without a reset."""
        gpu = self.nvml.gpu(index)
        if gpu.mig_current and not gpu.gpu_instances and switches_mig_without_reset(gpu):
            self.nvml.set_mig_mode(index, False)
