"""The real-GPU tier: the project's agents against NVIDIA's driver on this machine, read only.

Every test here skips, with one line in the session's summary, where this machine has no NVIDIA
driver, CI included (CI has no GPU: this tier is never a CI failure). Nothing here changes the
GPU: no MIG mode, clocks, persistence or application clocks, no reset, no MIG instances.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml, load_nvml, use_driver_root
from gpu_operator.sim.stubdriver import PROBE, StubDriverError, build_stubs
from tests.gpu import container, host
from tests.prerequisites import NO_NVIDIA_DEVICE, NO_NVIDIA_DRIVER

NO_PROBE = (
    f"needs the CUDA probe: ${host.ENV_ARTEFACTS} naming a prebuilt one (make gpu-test), "
    "or gcc to build it"
)


@dataclass(frozen=True)
class Driver:
    """The NVIDIA driver this tier reads: its root, where its libraries are, nvidia-smi."""

    root: str
    library_dir: str
    smi: host.Smi


@pytest.fixture(scope="session")
def driver() -> Driver:
    root = host.find_driver_root()
    if root is None:
        pytest.skip(NO_NVIDIA_DRIVER)
    if not host.driver_loaded(root):
        pytest.skip(NO_NVIDIA_DEVICE)
    smi = host.nvidia_smi(root)
    if smi is None:
        pytest.fail(f"the driver under {root} has no nvidia-smi, on PATH or in its bin dirs")
    return Driver(root, host.library_dir(root), host.Smi(smi))


@pytest.fixture(autouse=True)
def _nvidia_driver(driver: Driver) -> None:
    """Every test of the tier needs the driver (a skip where there is none)."""


@pytest.fixture(scope="session")
def smi_gpus(driver: Driver) -> list[host.SmiGpu]:
    gpus = driver.smi.gpus()
    assert gpus, "nvidia-smi lists no GPU"
    return gpus


@pytest.fixture(scope="session")
def nvml(driver: Driver) -> Iterator[Nvml]:
    """The project's NVML session, loaded through its loader from the driver root."""
    use_driver_root(driver.root)
    loaded = load_nvml()
    print(f"\nNVML loaded from {loaded} (driver root {driver.root})")
    session = Nvml().open()
    try:
        yield session
    finally:
        session.close()
        use_driver_root(None)


@pytest.fixture(scope="session")
def inventory(nvml: Nvml) -> Inventory:
    return nvml.inventory()


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    path = host.session_dir("gpu-tier-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def probe(workdir: Path) -> host.Probe:
    """The CUDA probe: prebuilt (``$GPU_OPERATOR_STUB_ARTEFACTS``, with the glibc it was linked
    with), else built here with gcc."""
    folder = host.prebuilt_artefacts()
    if folder is None:
        if shutil.which("gcc") is None:
            pytest.skip(NO_PROBE)
        try:
            folder = build_stubs()
        except StubDriverError as exc:
            pytest.fail(f"building the stub artefacts: {exc}")
    path = host.private_copy(folder / PROBE, workdir / "bin")
    glibc = folder / host.GLIBC_DIR
    if not (glibc / container.MANIFEST).is_file():
        glibc = container.collect_glibc(path, workdir / host.GLIBC_DIR)
    return host.Probe(path, glibc)
