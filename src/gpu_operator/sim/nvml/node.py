"""The simulated node the C entry points act on: GPUs, versions, state file, clock, events.

Entry points resolve their handle arguments here, which also re-reads a shared state file that
another process may have changed; changes to MIG state and faults go through
:meth:`SimNode.mutate`. A GPU that has fallen off the bus (an injected ``lost``) answers every
call on its handles, and a new handle, with ``NVML_ERROR_GPU_IS_LOST``; it is still counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml

from gpu_operator.sim.stubdriver.compute import SIM_DIR
from gpu_operator.sim.stubdriver.migstate import MigRow, write_mig_state

from . import telemetry
from .cabi import Kind, unpack_handle
from .devices import NvmlFault, SimCi, SimGi, SimGpu
from .faults import EventSets
from .persistence import StateFile


class SimNode:
    def __init__(
        self,
        gpus: list[SimGpu],
        *,
        driver_version: str,
        cuda_version: int,
        state: StateFile | None,
        clock: Callable[[], float],
    ) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.state = state
        self.events = EventSets()
        self.compute_modes: dict[str, int] = {}  # without a state file: by GPU UUID
        self.init_count = 0  # nvmlInit calls not yet matched by nvmlShutdown
        self._clock = clock
        self._t0 = clock()
        if state is not None and state.path.exists():
            self.sync()  # another process's state: read it (this view may be read-only)
        elif state is not None:
            try:
                with self.mutate():
                    pass  # the first process of the node writes the initial state
            except OSError:
                pass  # a read-only view before anyone wrote it: as booted until someone does

    # -- time --------------------------------------------------------------------------------
    def load(self, index: int) -> float:
        """GPU ``index``'s load now, 0.1..0.9."""
        return telemetry.load_factor(self.elapsed_s(), index)

    def elapsed_s(self) -> float:
        return self._clock() - self._t0

    # -- shared state ------------------------------------------------------------------------
    def dev_dir(self) -> Path | None:
        """The directory of the GPUs' device nodes when the state file is the stub driver's
        (``<dev>/gpu-operator-sim/``, where its C library keeps the compute policy too); None
        for a state file elsewhere (a kwok node's) or none."""
        folder = self.state.path.parent if self.state is not None else None
        return folder.parent if folder is not None and folder.name == SIM_DIR else None

    def sync(self) -> None:
        if self.state is not None:
            self.state.sync(self.gpus)

    @contextmanager
    def mutate(self) -> Iterator[None]:
        """Change MIG state or faults: from the latest shared state, written back unless it
        raises."""
        if self.state is None:
            yield
            return
        with self.state.update(self.gpus):
            yield
        self._export_mig()

    def _export_mig(self) -> None:
        """The MIG state where the stub driver's C library reads it (a stub driver's node
        only), so ``nvidia-smi -L`` lists what this NVML made."""
        dev = self.dev_dir()
        if dev is None:
            return
        for gpu in self.gpus:
            rows = [
                MigRow(gi.id, ci.id, gpu.profile_of(gi).name, gpu.mig_uuid(gi, ci))
                for gi, ci in gpu.mig_devices()
            ]
            write_mig_state(dev, gpu.uuid, gpu.mig_current, rows)

    # -- handles -----------------------------------------------------------------------------
    def gpu_at(self, index: int) -> SimGpu:
        """GPU ``index``, to make a handle for: it must be there and on the bus."""
        if not 0 <= index < len(self.gpus):
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._present(index)

    def gpu(self, handle: Any) -> SimGpu:
        """A full GPU's handle."""
        kind, index, _, _ = unpack_handle(handle)
        if kind != Kind.DEVICE or index >= len(self.gpus):
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._present(index)

    def device(self, handle: Any) -> tuple[SimGpu, SimGi | None, SimCi | None]:
        """A full GPU's or a MIG device's handle: (GPU, None, None) or (GPU, its GI, its CI)."""
        kind, index, gi_id, ci_id = unpack_handle(handle)
        if kind not in (Kind.DEVICE, Kind.MIG_DEVICE) or index >= len(self.gpus):
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._present(index)
        if kind == Kind.DEVICE:
            return gpu, None, None
        gi, ci = self._instances(gpu, gi_id, ci_id)
        return gpu, gi, ci

    def full_gpu(self, handle: Any) -> SimGpu:
        """Metric queries: full GPUs only, NVML does not support them on MIG devices."""
        gpu, gi, _ = self.device(handle)
        if gi is not None:
            raise NvmlFault(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def gpu_instance(self, handle: Any) -> tuple[SimGpu, SimGi]:
        kind, index, gi_id, _ = unpack_handle(handle)
        if kind != Kind.GPU_INSTANCE or index >= len(self.gpus):
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._present(index)
        gi = gpu.gi(gi_id)
        if gi is None:
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi

    def compute_instance(self, handle: Any) -> tuple[SimGpu, SimGi, SimCi]:
        kind, index, gi_id, ci_id = unpack_handle(handle)
        if kind != Kind.COMPUTE_INSTANCE or index >= len(self.gpus):
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._present(index)
        gi, ci = self._instances(gpu, gi_id, ci_id)
        return gpu, gi, ci

    def _present(self, index: int) -> SimGpu:
        """GPU ``index`` as the shared state has it now, unless it has fallen off the bus."""
        self.sync()
        gpu = self.gpus[index]
        if gpu.faults.lost:
            raise NvmlFault(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    @staticmethod
    def _instances(gpu: SimGpu, gi_id: int, ci_id: int) -> tuple[SimGi, SimCi]:
        gi = gpu.gi(gi_id)
        ci = gi.ci(ci_id) if gi else None
        if gi is None or ci is None:
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gi, ci
