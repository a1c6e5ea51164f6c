"""Where NVML comes from: the driver root's ``libnvidia-ml.so.1``, loaded by path.

pynvml loads ``libnvidia-ml.so.1`` by soname, which inside a container works only if a runtime
hook (or CDI) put the library in a standard directory. The project's agents do not rely on that:
their DaemonSets mount the driver root, and :func:`load_nvml` finds the library there as NVIDIA's
toolkit would (the root's ld.so.cache, then the usual library directories) and puts it under
pynvml before ``nvmlInit``. A root without the library fails with one error naming every path
searched.

The testenv's stub driver is found and loaded the same way; once loaded it is recognised by its
marker symbol and the simulated NVML takes over, built from the GPU table the stub carries. Like
the real library it needs the driver's control device node (``nvidiactl``): in the driver root's
``dev/`` (a driver container's, or the simulated driver's nodes), or in ``/dev``.

Simulation sits above the agents (:mod:`gpu_operator.sim`), so they never import it: the command
line registers it here (:func:`register_simulation`) as a :class:`Simulation`, which the stub
hand-over and ``--simulate`` (:func:`install_simulated`) call. An agent on a real driver never
loads the simulation; a process that registered none and asks for it gets one
:class:`NvmlUnavailable` saying so.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
# The class attribute (True) of every simulated library put under pynvml (gpu_operator.sim.nvml's
# SimulatedNvml; a test keeps them equal): how :func:`simulated` knows one without importing it.
SIMULATED_MARKER = "gpu_operator_simulated_nvml"
# The agents' --simulate and --simulate-state defaults (gpu_operator.sim.nvml reads the same).
ENV_SIMULATE = "GPU_OPERATOR_SIMULATE"
ENV_SIMULATE_STATE = "GPU_OPERATOR_SIMULATE_STATE"


@dataclass(frozen=True)
class Simulation:
    """What the agents ask of the simulation: the command line registers one at start
    (:func:`register_simulation`), so that the agents, below it, never import it.

    ``install_simulated(spec, state_file)``: put the simulated GPUs of ``spec``
    (``a100-40gb:8``) under pynvml, their MIG state shared through ``state_file`` (``--simulate``).
    ``stub_driver_nvml(library, dev_root)``: the stub driver's ``library`` was found, its
    ``nvidiactl`` under ``dev_root``: put the simulated NVML of the GPUs its table names under
    pynvml and say what was loaded, or raise :class:`NvmlUnavailable`.
    """

    install_simulated: Callable[[str, str | None], None]
    stub_driver_nvml: Callable[[Path, Path], str]


_simulation: Simulation | None = None


def register_simulation(simulation: Simulation | None) -> None:
    """Hand the agents the simulation (``None``: take it back, as a process without one)."""
    global _simulation
    _simulation = simulation


def _registered(function: str, wanting: str) -> Simulation:
    """The registered simulation; else one NvmlUnavailable line: ``wanting`` (what needs it,
    with its verb), and where it is registered."""
    if _simulation is None:
        raise NvmlUnavailable(
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            function,
            f"{wanting} the simulation, and this process registered none: the gpu-operator "
            "command line does (in-process: gpu_operator.sim.registration.register())",
        )
    return _simulation


def install_simulated(spec: str, state_file: str | None = None) -> None:
    """Put simulated GPUs (``a100-40gb:8``) under pynvml through the registered simulation."""
    _registered("simulate", f"simulated GPUs ({spec}) need").install_simulated(spec, state_file)


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
    handed over to it): the agents that stand in for NVIDIA's binaries run only then. Read from
    the library's class (:data:`SIMULATED_MARKER`), never from the simulation's modules."""
    return getattr(type(pynvml.nvmlLib), SIMULATED_MARKER, False) is True


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
    """The stub driver: the simulated NVML of the GPUs its table names (the registered
    simulation's), once its control node is found."""
    dev_root = dev_root_of(root)
    if dev_root is None:
        raise NvmlUnavailable(
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
            "load",
            f"the driver's control node nvidiactl is neither in {root / 'dev'} nor in /dev",
        )
    simulation = _registered("load", f"the stub driver at {path} needs")
    return simulation.stub_driver_nvml(path, Path(dev_root))
