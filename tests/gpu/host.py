"""The machine the real-GPU tier runs on: where its driver is, what nvidia-smi says, how to run
the project's agents and the CUDA probe on it. Reads only: nothing here changes the GPU.

The driver root is ``/`` when the driver's libraries are there (the ld.so.cache or the usual
library directories), else ``/usr/local/nvidia`` (a GKE-style root mounted into a container:
``lib64/``, ``bin/``), else ``$GPU_TIER_DRIVER_ROOT`` names it. A root holding the project's stub
driver is no NVIDIA driver.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agent.driverroot import DriverNotFound, dev_root_of, discover_driver, find_library
from gpu_operator.sim.stubdriver import DRIVER_MARKER, PROBE
from tests.paths import REPO

NVML_SONAME = "libnvidia-ml.so.1"
DRIVER_ROOTS = ("/", "/usr/local/nvidia")
ENV_DRIVER_ROOT = "GPU_TIER_DRIVER_ROOT"
ENV_ARTEFACTS = "GPU_OPERATOR_STUB_ARTEFACTS"  # a folder holding a prebuilt gpu-operator-cuda-probe
GLIBC_DIR = "glibc"  # beside the probe: the libc it was linked with (container.collect_glibc)
# Environment an agent must not inherit: it would pick another driver root, or simulated GPUs.
AGENT_ENV_DROP = (
    "GPU_OPERATOR_SIMULATE",
    "GPU_OPERATOR_SIMULATE_STATE",
    "CONTAINER_DRIVER_ROOT",
    "NVIDIA_DRIVER_ROOT",
    "DRIVER_READY_FILE",
    "CONFIG_FILE",
    "CONFIG_FILE_SRCDIR",
    "KUBECONFIG",
)
GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "compute_cap",
    "driver_version",
    "pci.bus_id",
    "mig.mode.current",
)


def _stub(path: Path) -> bool:
    try:
        return DRIVER_MARKER.encode() in path.read_bytes()
    except OSError:
        return False


def driver_roots() -> tuple[str, ...]:
    named = os.environ.get(ENV_DRIVER_ROOT)
    return (named,) if named else DRIVER_ROOTS


def find_driver_root() -> str | None:
    """The first root holding NVIDIA's (not the stub's) ``libnvidia-ml.so.1``, preferring one
    whose binaries include nvidia-smi (a container given the driver by CDI gets it from there)."""
    found: list[str] = []
    for root in driver_roots():
        try:
            library = find_library(root, NVML_SONAME)
        except DriverNotFound:
            continue
        if not _stub(library):
            found.append(root)
    for root in found:
        try:
            binaries = discover_driver(root).binaries
        except DriverNotFound:
            continue
        if any(os.path.basename(b) == "nvidia-smi" for b in binaries):
            return root
    return found[0] if found else None


def driver_loaded(root: str) -> bool:
    return dev_root_of(root) is not None


def nvidia_smi(root: str) -> str | None:
    """nvidia-smi: on PATH, else in the driver root's binaries."""
    on_path = shutil.which("nvidia-smi")
    if on_path:
        return on_path
    try:
        files = discover_driver(root)
    except DriverNotFound:
        return None
    found = [b for b in files.binaries if os.path.basename(b) == "nvidia-smi"]
    return files.host_path(found[0]) if found else None


def library_dir(root: str) -> str:
    """Where the driver's libraries are on this machine."""
    files = discover_driver(root)
    return files.host_path(files.library_dir)


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as ``nvidia-smi --query-gpu`` reports it."""

    index: int
    name: str
    uuid: str
    memory_mib: int
    compute_cap: str  # "9.0"
    driver_version: str
    pci_bus_id: str  # "00000000:07:00.0"
    mig_mode: str  # "Enabled", "Disabled", "[N/A]"

    @property
    def mig_capable(self) -> bool:
        return self.mig_mode in ("Enabled", "Disabled")


@dataclass(frozen=True)
class Smi:
    """nvidia-smi, read only: ``--query-gpu`` and the plain listing, never a setting."""

    path: str

    def run(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [self.path, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise AssertionError(f"nvidia-smi {' '.join(args)}: {done.returncode}\n{done.stdout}")
        return done.stdout

    def query(self, fields: Sequence[str], *, units: bool = False) -> list[list[str]]:
        fmt = "csv,noheader" if units else "csv,noheader,nounits"
        text = self.run(f"--query-gpu={','.join(fields)}", f"--format={fmt}")
        return [[f.strip() for f in line.split(",")] for line in text.splitlines() if line.strip()]

    def gpus(self) -> list[SmiGpu]:
        rows = self.query(GPU_FIELDS)
        return [
            SmiGpu(
                index=int(r[0]),
                name=r[1],
                uuid=r[2],
                memory_mib=int(float(r[3])),
                compute_cap=r[4],
                driver_version=r[5],
                pci_bus_id=r[6],
                mig_mode=r[7],
            )
            for r in rows
        ]

    def cuda_version(self) -> str:
        """The CUDA version the driver supports, from the listing's header ("13.0")."""
        match = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", self.run())
        if match is None:
            raise AssertionError("nvidia-smi's header names no CUDA Version")
        return match.group(1)

    def load(self) -> tuple[float, float | None, float | None]:
        """(GPU utilisation %, memory used MiB, power draw W) of GPU 0; None where N/A."""
        row = self.query(("utilization.gpu", "memory.used", "power.draw"))[0]
        return _number(row[0]) or 0.0, _number(row[1]), _number(row[2])


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def agent_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for an agent: the checkout's ``src`` first on PYTHONPATH, and
    nothing that would send it to another driver or to simulated GPUs."""
    env = {k: v for k, v in os.environ.items() if k not in AGENT_ENV_DROP}
    path = [str(REPO / "src"), str(REPO)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.setdefault("LOG_LEVEL", "WARNING")
    env.update(extra or {})
    return env


def agent_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_operator", "agent", *args]


def agent(*args: str, timeout: float = 120) -> str:
    """``gpu-operator agent ARGS``: its stdout; an AssertionError with stderr when it fails."""
    done = subprocess.run(
        agent_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=agent_env(),
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"gpu-operator agent {' '.join(args)} exited {done.returncode}\n{done.stderr}"
        )
    return done.stdout


# -- the CUDA probe -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """The stub driver's CUDA driver-API probe (real CUDA calls: it runs on NVIDIA's libcuda
    as on the stub's), and the libc it was linked with (for a container image)."""

    path: Path  # executable, in a folder of this session's
    glibc: Path  # container.collect_glibc's folder: carried with a prebuilt probe, or made here

    def run(self, nbytes: int, *, library_dir: str, timeout: float = 120) -> str:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (library_dir, env.get("LD_LIBRARY_PATH", "")) if p
        )
        done = subprocess.run(
            [str(self.path), "--bytes", str(nbytes)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"{PROBE} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout


def prebuilt_artefacts() -> Path | None:
    """``$GPU_OPERATOR_STUB_ARTEFACTS`` when it names a folder holding the probe."""
    named = os.environ.get(ENV_ARTEFACTS)
    if not named:
        return None
    folder = Path(named)
    if not (folder / PROBE).is_file():
        raise AssertionError(f"${ENV_ARTEFACTS}={named} holds no {PROBE}")
    return folder


def private_copy(source: Path, directory: Path) -> Path:
    """``source`` copied into ``directory``, executable (a carried file may have lost its mode
    or sit on a noexec mount)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.name
    shutil.copyfile(source, target)
    target.chmod(0o755)
    return target


def session_dir(prefix: str) -> Path:
    """A short folder under /tmp (unix socket paths are limited to 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
