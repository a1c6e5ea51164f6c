"""Where NVML comes from: the driver root's ``libnvidia-ml.so.1``, loaded by path.

pynvml loads ``libnvidia-ml.so.1`` by soname, which inside a container works only if a runtime
hook (or CDI) put the library in a standard directory. The project's agents do not rely on that:
their DaemonSets mount the driver root, and :func:`load_nvml` finds the library there as NVIDIA's
toolkit would (the root's ld.so.cache, then the usual library directories) and puts it under
pynvml before ``nvmlInit``. A root without the library fails with one error naming every path
searched.

The testenv's stub driver (:mod:`gpu_operator.sim.stubdriver`) is found and loaded the same
way; once loaded it is recognised by its marker symbol and the simulated NVML takes over, built
from the GPU table the stub carries. Like the real library it needs the driver's control device
node (``nvidiactl``): in the driver root's ``dev/`` (a driver container's, or the simulated
driver's nodes), or in ``/dev``. Only that hand-over imports :mod:`gpu_operator.sim`, so an
agent on a real driver never loads the simulation.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pynvml

from gpu_operator.agent.driverroot import DriverNotFound, dev_root_of, find_library

from .errors import NvmlUnavailable

NVML_SONAME = "libnvidia-ml.so.1"
# NVIDIA's names: the driver root on the host, and where a container has it mounted.
ENV_DRIVER_ROOT = "NVIDIA_DRIVER_ROOT"
ENV_CONTAINER_DRIVER_ROOT = "CONTAINER_DRIVER_ROOT"
# The symbol every stub driver library exports (gpu_operator.sim.stubdriver's STUB_MARKER; a
# test keeps them equal): spelled here so that telling a stub from NVIDIA's needs no simulation.
STUB_MARKER = "gpu_operator_stub_driver"
_SIM_NVML = "gpu_operator.sim.nvml"


def driver_root_from_env(env: Mapping[str, str] = os.environ) -> str:
    """The driver root as this process sees it: where the pod mounts it, else the host's path
    (an agent run on the host), else ``/``."""
    return env.get(ENV_CONTAINER_DRIVER_ROOT) or env.get(ENV_DRIVER_ROOT) or "/"


_configured_root: str | None = None


def use_driver_root(root: str | None) -> None:
    """Where :func:`load_nvml` looks when given no root (an agent's ``--driver-root``)."""
    global _configured_root
    _configured_root = root


def simulated() -> bool:
    """Whether the NVML under pynvml is the simulated one (``--simulate``, or the stub driver
    handed over to it): the agents that stand in for NVIDIA's binaries run only then. Never
    imports the simulation: a process that has not imported it cannot be running it."""
    sim = sys.modules.get(_SIM_NVML)
    return sim is not None and isinstance(pynvml.nvmlLib, sim.SimulatedNvml)


def current_driver_root() -> str:
    """The driver root :func:`load_nvml` reads by default: ``--driver-root``, else the env."""
    return _configured_root or driver_root_from_env()


def load_nvml(root: str | Path | None = None) -> str:
    """Put the driver's NVML under pynvml; returns what was loaded (a path, or the simulation).

    Nothing happens when a library is already there (a simulated one installed by
    ``--simulate``, or an earlier call). Raises :class:`NvmlUnavailable` naming what was
    searched when the root holds no NVML, or when the stub driver's device nodes are missing.
    """
    current = pynvml.nvmlLib
    if current is not None:
        return "simulated NVML" if simulated() else "already loaded"
    root = Path(root or current_driver_root())
    try:
        path = find_library(root, NVML_SONAME)
    except DriverNotFound as exc:
        raise NvmlUnavailable(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "load", str(exc)) from exc
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NvmlUnavailable(
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "load", f"{path} cannot be loaded: {exc}"
        ) from exc
    if hasattr(lib, STUB_MARKER):
        return _simulate_from_stub(root, path)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return str(path)


def _simulate_from_stub(root: Path, path: Path) -> str:
    """The stub driver: the simulated NVML of the GPUs its table names."""
    from gpu_operator.sim.nvml import SIM_STATE, install_simulated_nvml
    from gpu_operator.sim.stubdriver import read_table

    dev_root = dev_root_of(root)
    if dev_root is None:
        raise NvmlUnavailable(
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
            "load",
            f"the driver's control node nvidiactl is neither in {root / 'dev'} nor in /dev",
        )
    table = read_table(path.resolve())
    if not table.simulate:
        raise NvmlUnavailable(
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "load",
            f"{path} is the stub driver but its GPU table names no simulated GPUs",
        )
    install_simulated_nvml(
        table.simulate,
        state_file=Path(dev_root, "dev", SIM_STATE),
        seed=table.seed,
        driver_version=table.driver_version,
        cuda_version=table.cuda_version,
    )
    return f"simulated NVML from the stub driver at {path} ({table.simulate})"
