"""Shared fixtures: a simulated NVML per test, NVIDIA's reference files, inventories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent import migparted
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.simulated import (
    SimulatedNvml,
    install_simulated_nvml,
    uninstall_simulated_nvml,
)

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / ".." / "shared" / "reference" / "nvidia"
MIG_CONFIGMAP = REFERENCE / "mig-parted-default-configmap.yaml"
COUNTERS_CSV = REFERENCE / "dcgm-exporter-default-counters.csv"

Simulate = Callable[..., SimulatedNvml]


@pytest.fixture
def simulate() -> Iterator[Simulate]:
    """Install a simulated NVML (``simulate("a100-40gb:8")``); removed after the test."""

    def install(spec: Any, **kwargs: Any) -> SimulatedNvml:
        kwargs.setdefault("seed", "test-node")
        return install_simulated_nvml(spec, **kwargs)

    yield install
    uninstall_simulated_nvml()


@pytest.fixture
def nvidia_mig_config() -> migparted.MigPartedConfig:
    if not MIG_CONFIGMAP.exists():
        pytest.skip(f"reference file missing: {MIG_CONFIGMAP}")
    return migparted.load_mig_config(MIG_CONFIGMAP)


def inventory_with(
    simulate: Simulate, spec: str, config: str | None = None, **kwargs: Any
) -> Inventory:
    """The inventory of simulated GPUs after applying one of NVIDIA's named MIG configs."""
    simulate(spec, **kwargs)
    with Nvml() as nvml:
        if config is not None:
            migparted.apply_config(nvml, migparted.load_mig_config(MIG_CONFIGMAP), config)
        return nvml.inventory()
