"""Simulated nodes' DRA pools, published in-process: kwok nodes have no plugin and no kubelet,
so the e2e tests and ``benchmarks/bench_dra.py`` publish for them what their plugins would, from
the simulated NVML of each node's GPUs (the agents' publisher, :mod:`gpu_operator.agent.dra`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_operator.agent.dra import slices
from gpu_operator.agent.dra.agent import node_owner, pool_of, publish
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml

if TYPE_CHECKING:
    from gpu_operator.kube import Kube


def simulated_inventory(spec: str, node: str, state_file: str | Path | None = None) -> Inventory:
    """The inventory a simulated node's NVML reports (its MIG state from ``state_file``)."""
    install_simulated_nvml(spec, seed=node, state_file=state_file)
    try:
        with Nvml() as nvml:
            return nvml.inventory()
    finally:
        uninstall_simulated_nvml()


def publish_simulated(
    kube: Kube,
    nodes: Mapping[str, str],
    state_dir: Path | None = None,
    dynamic_mig: bool = False,
) -> dict[str, slices.SlicePlan]:
    """Publish pools for simulated nodes (name -> ``a100-40gb:8``), as their plugins would
    (with ``dynamic_mig``, as with the DynamicMIG gate on).

    ``state_dir``: where ``<node>.json`` MIG state files live (shared with MIG managers).
    """
    shape = slices.dynamic_layout(kube.server_version()) if dynamic_mig else None
    plans = {}
    for node, spec in nodes.items():
        state = state_dir / f"{node}.json" if state_dir else None
        inventory = simulated_inventory(spec, node, state)
        pool = pool_of(inventory, shape)
        plans[node] = publish(kube, node, inventory, node_owner(kube, node), None, pool)
    return plans
