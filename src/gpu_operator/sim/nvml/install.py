"""Making a simulated library and putting it under pynvml.

:func:`build_simulated_nvml` is the one place a simulated node is made from its GPUs, driver
version and state file; the agents' ``--simulate`` flag and environment, tests and benchmarks
all come through it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pynvml

from gpu_operator.sim.stubdriver.compute import SIM_DIR

from .devices import new_gpus
from .fabric import SimFabric, fabric_of_spec
from .library import SimulatedNvml
from .node import SimNode
from .persistence import StateFile
from .profiles import GpuModel, SimulationError, parse_spec

ENV_SIMULATE = "GPU_OPERATOR_SIMULATE"
ENV_STATE = "GPU_OPERATOR_SIMULATE_STATE"
# What GPU UUIDs derive from, when not the node's name: set where NODE_NAME is not (a pod
# without it would otherwise see other UUIDs than its node's other agents).
ENV_SEED = "GPU_OPERATOR_SIMULATE_SEED"
# The driver version NVML reports, where not the default: the driver stand-in installing another
# version (its image's DRIVER_VERSION) says so in the descriptor every container then gets.
ENV_DRIVER = "GPU_OPERATOR_SIMULATE_DRIVER"
DEFAULT_DRIVER = "580.95.05"
DEFAULT_CUDA = 13000  # the 580 branch ships CUDA 13.0
# The simulated GPUs' own state (MIG mode and instances: what the hardware holds) under a driver
# root's dev/, beside the device nodes that stand for the GPUs: where the NVML loader's stub
# hand-over and the driver stand-in keep it.
SIM_STATE = f"{SIM_DIR}/nvml-state.json"

_installed_lock = threading.Lock()


def build_simulated_nvml(
    spec: str | Sequence[str] | Sequence[GpuModel],
    *,
    driver_version: str | None = None,
    cuda_version: int = DEFAULT_CUDA,
    state_file: str | Path | None = None,
    seed: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    fabric: SimFabric | None = None,
) -> SimulatedNvml:
    """A simulated library for one node, not yet installed.

    ``spec``: ``"a100-40gb:8"``, ``"a100-40gb:4,t4:2"``, a list of such strings, or models; a
    ``fabric=<cluster uuid>.<clique id>[/<state>[/<status>]]`` item (or ``fabric``) registers
    the node's NVLink fabric GPUs (gb200, gb300) in that clique (see :mod:`.fabric`).
    ``state_file``: MIG state shared with the node's other processes (read, or written now).
    ``seed``: what GPU UUIDs derive from; ``GPU_OPERATOR_SIMULATE_SEED``, else the node's name
    (``NODE_NAME``), else the host name. ``driver_version``: else ``GPU_OPERATOR_SIMULATE_DRIVER``,
    else DEFAULT_DRIVER.
    """
    if isinstance(spec, str) or (spec and isinstance(spec[0], str)):
        models = parse_spec(spec)  # type: ignore[arg-type]
        fabric = fabric or fabric_of_spec(spec)  # type: ignore[arg-type]
    else:
        models = list(spec)  # type: ignore[arg-type]
    if fabric is not None and not any(m.nvlink_fabric for m in models):
        raise SimulationError(
            f"a fabric for {spec!r}: none of its GPUs has an NVLink fabric (gb200, gb300 do)"
        )
    node_name = (
        seed
        if seed is not None
        else os.environ.get(ENV_SEED) or os.environ.get("NODE_NAME") or os.uname().nodename
    )
    node = SimNode(
        new_gpus(models, node_name, fabric),
        driver_version=driver_version or os.environ.get(ENV_DRIVER) or DEFAULT_DRIVER,
        cuda_version=cuda_version,
        state=StateFile(Path(state_file)) if state_file else None,
        clock=clock,
    )
    return SimulatedNvml(node)


def install_simulated_nvml(
    spec: str | Sequence[str] | Sequence[GpuModel],
    *,
    state_file: str | Path | None = None,
    seed: str | None = None,
    driver_version: str | None = None,
    cuda_version: int = DEFAULT_CUDA,
    clock: Callable[[], float] = time.monotonic,
    fabric: SimFabric | None = None,
) -> SimulatedNvml:
    """Put a simulated library (see :func:`build_simulated_nvml`) under pynvml; every later
    pynvml call reaches it, and ``nvmlInit`` never loads ``libnvidia-ml.so.1``."""
    sim = build_simulated_nvml(
        spec,
        driver_version=driver_version,
        cuda_version=cuda_version,
        state_file=state_file,
        seed=seed,
        clock=clock,
        fabric=fabric,
    )
    with _installed_lock, pynvml.libLoadLock:
        pynvml.nvmlLib = sim
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return sim


def uninstall_simulated_nvml() -> None:
    """Forget the simulated library: the next ``nvmlInit`` loads the real one (or fails)."""
    with _installed_lock, pynvml.libLoadLock:
        if isinstance(pynvml.nvmlLib, SimulatedNvml):
            pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def install_from_environment(spec: str | None = None) -> SimulatedNvml | None:
    """Honour ``--simulate`` / ``GPU_OPERATOR_SIMULATE`` and ``GPU_OPERATOR_SIMULATE_STATE``."""
    spec = spec or os.environ.get(ENV_SIMULATE)
    if not spec:
        return None
    return install_simulated_nvml(spec, state_file=os.environ.get(ENV_STATE) or None)
