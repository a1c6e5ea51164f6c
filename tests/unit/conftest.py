"""Fixtures shared by the agents' and the simulation's unit tests: the simulation registered
with the agents' NVML loader, as the command line registers it, a simulated NVML per test, and
a short temporary directory for unix sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.nvml import register_simulation
from gpu_operator.sim import registration
from gpu_operator.sim.nvml import SimulatedNvml, install_simulated_nvml, uninstall_simulated_nvml

Simulate = Callable[..., SimulatedNvml]


@pytest.fixture(autouse=True, scope="session")
def _simulation_registered() -> Iterator[None]:
    """Agents run in-process get ``--simulate`` and the stub driver's hand-over, as under
    ``gpu-operator``; a test of a process without the simulation takes it back itself."""
    registration.register()
    yield
    register_simulation(None)


@pytest.fixture
def simulate() -> Iterator[Simulate]:
    """Install a simulated NVML (``simulate("a100-40gb:8")``); removed after the test."""

    def install(spec: Any, **kwargs: Any) -> SimulatedNvml:
        kwargs.setdefault("seed", "test-node")
        return install_simulated_nvml(spec, **kwargs)

    yield install
    uninstall_simulated_nvml()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory for unix sockets, whose paths the kernel limits to 107 bytes: pytest's
    ``tmp_path`` under xdist, with a long test name, is longer than that."""
    path = Path(tempfile.mkdtemp(prefix="gpuop-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
