"""Shared fixtures: NVIDIA's reference files, inventories (a simulated NVML per test:
``simulate``, from tests/unit/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent import migparted
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from tests import prerequisites
from tests.paths import REPO
from tests.unit.conftest import Simulate

__all__ = ["REPO", "Simulate"]  # the repository (the dashboard test), the fixture's type


def mig_configmap() -> Path:
    """NVIDIA's default mig-parted ConfigMap (a reference document: may skip the test)."""
    return prerequisites.nvidia("mig-parted-default-configmap.yaml")


def counters_csv() -> Path:
    """NVIDIA's default dcgm-exporter counters (a reference document: may skip the test)."""
    return prerequisites.nvidia("dcgm-exporter-default-counters.csv")


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
