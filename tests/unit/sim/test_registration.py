"""The simulation registered with the agents' NVML loader: ``--simulate`` and the stub driver's
hand-over reach it, and a process without it is told so in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpu_operator.agent.nvml import (
    Nvml,
    NvmlUnavailable,
    install_simulated,
    load_nvml,
    loader,
    simulated,
)
from gpu_operator.cli_errors import NO_DRIVER, explain
from gpu_operator.sim import operands, registration
from gpu_operator.sim.nvml import (
    ENV_SIMULATE,
    ENV_STATE,
    SimulatedNvml,
    uninstall_simulated_nvml,
)
from gpu_operator.sim.stubdriver import StubGpu, build_stubs, lay_out
from tests import prerequisites


@pytest.fixture(scope="module")
def artefacts() -> Path:
    prerequisites.gcc()
    return build_stubs()


@pytest.fixture(autouse=True)
def _no_nvml() -> Iterator[None]:
    yield
    uninstall_simulated_nvml()


@pytest.fixture
def unregistered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that never registered the simulation (an agent imported on its own)."""
    monkeypatch.setattr(loader, "_simulation", None)


def stub_root(root: Path) -> Path:
    """``root`` with the driver's control node (a plain file unless made as root)."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "dev" / "nvidiactl").touch()
    return root


def test_the_agents_and_the_simulation_spell_the_seam_alike() -> None:
    assert getattr(SimulatedNvml, loader.SIMULATED_MARKER) is True
    assert (loader.ENV_SIMULATE, loader.ENV_SIMULATE_STATE) == (ENV_SIMULATE, ENV_STATE)


def test_simulate_reaches_the_registered_simulation(tmp_path: Path) -> None:
    registration.register()
    state = tmp_path / "node.json"
    install_simulated("t4:2", str(state))
    assert simulated() and isinstance(pynvml.nvmlLib, SimulatedNvml)
    with Nvml() as nvml:
        assert [g.name for g in nvml.inventory().gpus] == ["Tesla T4"] * 2
    assert state.is_file()
    uninstall_simulated_nvml()
    assert not simulated()


def test_without_the_simulation_simulate_fails_in_one_line(unregistered: None) -> None:
    with pytest.raises(NvmlUnavailable) as caught:
        install_simulated("t4:1")
    code, line = explain(caught.value)
    assert code == NO_DRIVER and "\n" not in line
    assert "simulated GPUs (t4:1) need the simulation, and this process registered none" in line
    assert pynvml.nvmlLib is None


def test_the_stub_driver_is_handed_to_the_registered_simulation(
    tmp_path: Path, artefacts: Path, monkeypatch: pytest.MonkeyPatch, unregistered: None
) -> None:
    monkeypatch.setenv(operands.ENV_ARTEFACTS, str(artefacts))
    root = tmp_path / "driver"
    operands.install_driver("a100-40gb:2", root, seed="node-1")
    stub_root(root)
    with pytest.raises(
        NvmlUnavailable, match=r"the stub driver at \S+ needs the simulation"
    ) as caught:
        load_nvml(root)
    assert "\n" not in explain(caught.value)[1] and pynvml.nvmlLib is None
    registration.register()
    loaded = load_nvml(root)
    assert loaded.startswith("simulated NVML from the stub driver at "), loaded
    assert loaded.endswith("(a100-40gb:2)") and simulated()
    with Nvml() as nvml:
        assert len(nvml.inventory().gpus) == 2
    assert (root / "dev" / "gpu-operator-sim" / "nvml-state.json").is_file()


def test_a_stub_without_simulated_gpus_is_no_usable_driver(tmp_path: Path, artefacts: Path) -> None:
    gpu = StubGpu(0, "GPU-00000000-0000-4000-8000-000000000000", "Tesla T4", 15360, "0000:07:00.0")
    root = tmp_path / "driver"
    lay_out(root, version="580.95.05", cuda_version=13000, gpus=[gpu], artefacts=artefacts)
    stub_root(root)
    with pytest.raises(NvmlUnavailable, match="its GPU table names no simulated GPUs"):
        load_nvml(root)
