"""Fixtures shared by the agents' and the simulation's unit tests: a simulated NVML per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_operator.sim.nvml import SimulatedNvml, install_simulated_nvml, uninstall_simulated_nvml

Simulate = Callable[..., SimulatedNvml]


@pytest.fixture
def simulate() -> Iterator[Simulate]:
    """Install a simulated NVML (``simulate("a100-40gb:8")``); removed after the test."""

    def install(spec: Any, **kwargs: Any) -> SimulatedNvml:
        kwargs.setdefault("seed", "test-node")
        return install_simulated_nvml(spec, **kwargs)

    yield install
    uninstall_simulated_nvml()
