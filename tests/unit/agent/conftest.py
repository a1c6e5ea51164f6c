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
from tests import prerequisites
from tests.paths import REPO

__all__ = ["REPO"]  # the dashboard test finds the repository here

Simulate = Callable[..., SimulatedNvml]


def mig_configmap() -> Path:
    """NVIDIA's default mig-parted ConfigMap (a reference document: may skip the test)."""
    return prerequisites.nvidia("mig-parted-default-configmap.yaml")


def counters_csv() -> Path:
    """NVIDIA's default dcgm-exporter counters (a reference document: may skip the test)."""
    return prerequisites.nvidia("dcgm-exporter-default-counters.csv")


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
    return migparted.load_mig_config(mig_configmap())


def inventory_with(
    simulate: Simulate, spec: str, config: str | None = None, **kwargs: Any
) -> Inventory:
    """The inventory of simulated GPUs after applying one of NVIDIA's named MIG configs."""
    simulate(spec, **kwargs)
    with Nvml() as nvml:
        if config is not None:
            migparted.apply_config(nvml, migparted.load_mig_config(mig_configmap()), config)
        return nvml.inventory()
