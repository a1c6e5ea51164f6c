"""NVML through the project's loader (the driver root's libnvidia-ml.so.1, loaded by path): the
inventory agrees with nvidia-smi, GPU by GPU."""

from __future__ import annotations

import pynvml

from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml, simulated
from tests.gpu.conftest import Driver
from tests.gpu.host import SmiGpu

MEMORY_TOLERANCE = 0.01  # NVML's total and nvidia-smi's memory.total: the same figure


def test_the_inventory_is_nvidia_smis(
    driver: Driver, inventory: Inventory, smi_gpus: list[SmiGpu]
) -> None:
    assert not simulated(), "the loader handed over to the simulated NVML on a real driver"
    assert pynvml.nvmlLib is not None
    assert inventory.driver_version == smi_gpus[0].driver_version
    cuda = driver.smi.cuda_version()
    assert f"{inventory.cuda_major}.{inventory.cuda_minor}" == cuda
    assert len(inventory.gpus) == len(smi_gpus)
    by_index = {g.index: g for g in smi_gpus}
    for gpu in inventory.gpus:
        smi = by_index[gpu.index]
        print(
            f"GPU {gpu.index}: {gpu.name} {gpu.uuid} {gpu.memory_mib} MiB "
            f"cc {gpu.compute_major}.{gpu.compute_minor} {gpu.architecture} "
            f"pci {gpu.pci_bus_id} minor {gpu.minor_number} brand {gpu.brand} "
            f"MIG capable {gpu.mig_capable} current {gpu.mig_current} "
            f"({len(gpu.mig_profiles)} profiles); driver {inventory.driver_version}, CUDA {cuda}"
        )
        assert gpu.name == smi.name
        assert gpu.uuid.startswith("GPU-") and gpu.uuid == smi.uuid
        assert gpu.memory_mib > 0
        assert abs(gpu.memory_mib - smi.memory_mib) <= MEMORY_TOLERANCE * smi.memory_mib, (
            f"NVML {gpu.memory_mib} MiB, nvidia-smi {smi.memory_mib} MiB"
        )
        assert f"{gpu.compute_major}.{gpu.compute_minor}" == smi.compute_cap
        assert gpu.pci_bus_id.lower() == smi.pci_bus_id.lower()
        assert gpu.architecture != "unknown"
        assert gpu.mig_capable == smi.mig_capable
        assert gpu.mig_current == (smi.mig_mode == "Enabled")


def test_metrics_read(nvml: Nvml, inventory: Inventory) -> None:
    """One reading of every GPU: the fields the exporter serves are there on a data-centre GPU."""
    readings, _ = nvml.metrics(inventory)
    for reading in readings:
        print(f"GPU {reading.index}: {reading}")
        assert reading.fb_used_mib is not None and reading.fb_used_mib >= 0
        assert reading.fb_free_mib is not None and reading.fb_free_mib > 0
        assert reading.power_w is not None and reading.power_w > 0
        assert reading.gpu_temp_c is not None and 0 < reading.gpu_temp_c < 120
        assert reading.sm_clock_mhz is not None and reading.sm_clock_mhz > 0


def test_the_fabric_reads_and_gives_a_clique_or_none(nvml: Nvml, inventory: Inventory) -> None:
    """Read-only: each GPU's fabric info from the real driver is one NVML state, and the node's
    clique is decided from them (None on a GPU without multi-node NVLink, such as an H200)."""
    from gpu_operator.agent.nvml import FabricError, node_clique
    from gpu_operator.agent.nvml.fabric import STATES

    fabrics = nvml.gpu_fabrics()
    assert len(fabrics) == len(inventory.gpus)
    for index, fabric in enumerate(fabrics):
        print(f"GPU {index}: fabric {fabric}")
        assert fabric is None or fabric.state in STATES.values()
    try:
        print(f"clique: {node_clique(fabrics)}")
    except FabricError as exc:  # a fabric GPU whose registration is not done: said, not raised
        print(f"no clique: {exc}")
