"""The simulation as the agents ask for it (:class:`gpu_operator.agent.nvml.Simulation`):
``--simulate``'s simulated GPUs and the stub driver's hand-over to its simulated NVML.

The agents sit below the simulation and never import it; :func:`register` hands it to their
NVML loader. The command line (:mod:`gpu_operator.cli`) calls it at start, and so does any
process that runs agents in-process on a stub driver or with ``--simulate`` (tests,
benchmarks). The simulated NVML is imported only when one is asked for.
"""

from __future__ import annotations

from pathlib import Path

import pynvml

from gpu_operator.agent.dra.vfio import PciBus, register_pci_bus
from gpu_operator.agent.nvml import NvmlUnavailable, Simulation, register_simulation


def install_simulated(spec: str, state_file: str | None) -> None:
    """``--simulate SPEC`` (and ``--simulate-state FILE``): the simulated GPUs under pynvml."""
    from gpu_operator.sim.nvml import install_simulated_nvml

    install_simulated_nvml(spec, state_file=state_file)


def stub_driver_nvml(library: Path, dev_root: Path) -> str:
    """The stub driver at ``library`` (its ``nvidiactl`` under ``dev_root``): the simulated NVML
    of the GPUs its table names, their state kept beside its device nodes."""
    from gpu_operator.sim.nvml import SIM_STATE, install_simulated_nvml
    from gpu_operator.sim.stubdriver import read_table

    table = read_table(library.resolve())
    if not table.simulate:
        raise NvmlUnavailable(
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "load",
            f"{library} is the stub driver but its GPU table names no simulated GPUs",
        )
    install_simulated_nvml(
        table.simulate,
        state_file=dev_root / "dev" / SIM_STATE,
        seed=table.seed,
        driver_version=table.driver_version,
        cuda_version=table.cuda_version,
    )
    return f"simulated NVML from the stub driver at {library} ({table.simulate})"


SIMULATION = Simulation(install_simulated=install_simulated, stub_driver_nvml=stub_driver_nvml)


def simulated_pci_bus(root: Path) -> PciBus:
    """The simulated node's PCI bus under ``root``: sysfs whose writes the simulation applies."""
    from gpu_operator.sim.pci import SimulatedPciBus

    return SimulatedPciBus(root)


def register() -> None:
    """Register the simulation with the agents' NVML loader and the DRA plugin's PCI bus
    (again: no change)."""
    register_simulation(SIMULATION)
    register_pci_bus(simulated_pci_bus)
