"""The simulated ``libnvidia-ml`` object pynvml calls: a name lookup over the entry points.

pynvml resolves every C function with ``getattr(nvmlLib, name)`` (an ``AttributeError`` is its
``FUNCTION_NOT_FOUND``), may set ``restype`` on what it gets, and calls it with ctypes
arguments. Each call here is counted, may return an injected failure, is refused before
``nvmlInit``, and runs the entry point on the node under one lock: NVML is thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pynvml

from . import (
    compute_calls,
    device_calls,
    event_calls,
    fabric,
    fabric_calls,
    health_calls,
    hwfaults,
    metric_calls,
    mig,
    mig_calls,
    system_calls,
)
from .cabi import EntryPoint
from .devices import NvmlFault, SimGpu
from .faults import InjectedFailures
from .node import SimNode


def _merge(*tables: Mapping[str, EntryPoint]) -> dict[str, EntryPoint]:
    merged: dict[str, EntryPoint] = {}
    for table in tables:
        twice = merged.keys() & table.keys()
        assert not twice, f"C functions simulated twice: {sorted(twice)}"
        merged.update(table)
    return merged


ENTRY_POINTS = _merge(
    system_calls.ENTRY_POINTS,
    compute_calls.ENTRY_POINTS,
    device_calls.ENTRY_POINTS,
    metric_calls.ENTRY_POINTS,
    health_calls.ENTRY_POINTS,
    event_calls.ENTRY_POINTS,
    mig_calls.ENTRY_POINTS,
    fabric_calls.ENTRY_POINTS,
)


class _CFunction:
    """One simulated C entry point; a plain object so pynvml may set ``restype`` on it."""

    def __init__(self, library: SimulatedNvml, name: str, impl: EntryPoint) -> None:
        self.name = name
        self._library = library
        self._impl = impl
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._library._invoke(self.name, self._impl, args)


class SimulatedNvml:
    """The fake ``libnvidia-ml``: made by :func:`~.install.build_simulated_nvml`.

    Tests use :meth:`fail` to make a named C function return an NVML error code, ``calls`` to
    count C calls (e.g. no GPU-instance create/destroy on a re-apply), :meth:`inject_xid` and
    :meth:`inject_fault` for hardware faults and :meth:`set_fabric` for the NVLink fabric, which
    the node's other processes see too (through the state file; :func:`~.injection.inject_fault`
    and :func:`~.injection.set_fabric` do the same from outside).
    """

    # How the agents' NVML loader tells a simulated library without importing this module
    # (gpu_operator.agent.nvml.loader.SIMULATED_MARKER; a test keeps the names equal).
    gpu_operator_simulated_nvml = True

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.calls: Counter[str] = Counter()
        self._failures = InjectedFailures()
        self._lock = threading.RLock()
        self._functions: dict[str, _CFunction] = {}

    @property
    def gpus(self) -> list[SimGpu]:
        return self.node.gpus

    @property
    def driver_version(self) -> str:
        return self.node.driver_version

    @property
    def cuda_version(self) -> int:
        return self.node.cuda_version

    # -- the library surface pynvml sees -----------------------------------------------------
    def __getattr__(self, name: str) -> _CFunction:
        impl = ENTRY_POINTS.get(name) if name.startswith("nvml") else None
        if impl is None:
            raise AttributeError(name)  # pynvml turns this into NVML_ERROR_FUNCTION_NOT_FOUND
        fn = self._functions.get(name)
        if fn is None:
            fn = _CFunction(self, name, impl)
            self._functions[name] = fn
        return fn

    def _invoke(self, name: str, impl: EntryPoint, args: tuple[Any, ...]) -> Any:
        with self._lock:
            self.calls[name] += 1
            failure = self._failures.take(name)
            if failure is not None:
                return failure
            if name not in system_calls.NO_INIT_NEEDED and self.node.init_count == 0:
                return pynvml.NVML_ERROR_UNINITIALIZED
            try:
                result = impl(self.node, *args)
            except NvmlFault as fault:
                return fault.code
            return pynvml.NVML_SUCCESS if result is None else result

    # -- test controls -----------------------------------------------------------------------
    def fail(self, function: str, code: int, *, times: int | None = None) -> None:
        """Make C function ``function`` (e.g. ``nvmlDeviceGetPowerUsage``) return ``code``."""
        self._failures.add(function, code, times)

    def clear_failures(self) -> None:
        self._failures.clear()

    def inject_xid(self, index: int, xid: int) -> None:
        self.inject_fault(index, hwfaults.XID, xid)

    def inject_fault(self, index: int, kind: str, value: int | None = None) -> None:
        """Inject a hardware fault (:data:`~.hwfaults.FAULT_KINDS`) into GPU ``index``."""
        with self._lock, self.node.mutate():
            gpu = self.node.gpus[index]  # IndexError: the node has no such GPU
            hwfaults.check(gpu.model, kind, value)
            gpu.faults = hwfaults.inject(gpu.faults, kind, value)

    def clear_faults(self, index: int, kind: str | None = None) -> None:
        """Take fault ``kind`` (None: all) off GPU ``index``."""
        with self._lock, self.node.mutate():
            gpu = self.node.gpus[index]
            gpu.faults = hwfaults.clear(gpu.faults, kind)

    def set_fabric(
        self, index: int | None = None, *, state: str | None = None, status: str | None = None
    ) -> None:
        """Put GPU ``index``'s NVLink fabric (None: every fabric GPU's) in ``state``
        (``not-started``, ``in-progress``, ``completed``) and/or ``status`` (``success``,
        ``not-ready``...): what makes one node's fabric fail in a test."""
        with self._lock, self.node.mutate():
            gpus = self.node.gpus if index is None else [self.node.gpus[index]]
            for gpu in gpus:
                if index is None and gpu.fabric is None:
                    continue
                gpu.fabric = fabric.changed(gpu.fabric, state=state, status=status)

    def simulated_gpu_reset(self, index: int) -> None:
        """What ``nvidia-smi --gpu-reset`` does: pending MIG mode applies, instances go, the GPU
        is back on the bus, volatile ECC counts and a pending row remapping are done with."""
        self.reset_gpu(index)

    def reset_gpu(self, index: int) -> None:
        with self._lock, self.node.mutate():
            gpu = self.node.gpus[index]
            mig.reset(gpu)
            gpu.faults = hwfaults.reset(gpu.faults)
