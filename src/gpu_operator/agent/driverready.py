"""Where the driver is, when a pod cannot know it beforehand: NVIDIA's driver-ready contract.

A GPUCluster's pods do not know whether the node's driver is preinstalled (the host's ``/``) or
installed by a driver container (``/run/nvidia/driver``): no ClusterPolicy says. As NVIDIA's DRA
driver does, an init container mounts both, finds the one that holds the driver, and writes
``/run/nvidia/validations/driver-ready``:

    IS_HOST_DRIVER=true|false
    NVIDIA_DRIVER_ROOT=<the root on the host>
    DRIVER_ROOT_CTR_PATH=<where this pod has it mounted>

and the main container reads the file to load NVML from there and name host paths in its CDI
specs. Pure but for :func:`locate` (a few stats) and :func:`read_ready` (one read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agent.driverroot import DriverNotFound, find_library

READY_FILE = "driver-ready"
NVML_SONAME = "libnvidia-ml.so.1"


@dataclass(frozen=True)
class DriverLocation:
    host: str  # the driver root on the host
    container: str  # where this process has it

    @property
    def is_host_driver(self) -> bool:
        return self.host == "/"

    def ready_text(self) -> str:
        return (
            f"IS_HOST_DRIVER={str(self.is_host_driver).lower()}\n"
            f"NVIDIA_DRIVER_ROOT={self.host}\nDRIVER_ROOT_CTR_PATH={self.container}\n"
        )


def locate(candidates: Sequence[DriverLocation]) -> DriverLocation:
    """The first candidate whose mounted root holds NVML; DriverNotFound naming every path
    searched under every candidate otherwise."""
    searched: list[str] = []
    for candidate in candidates:
        try:
            find_library(candidate.container, NVML_SONAME)
        except DriverNotFound as exc:
            searched.extend(exc.searched)
            continue
        return candidate
    roots = " or ".join(f"{c.container} (host {c.host})" for c in candidates)
    raise DriverNotFound(NVML_SONAME, roots, searched)


def parse_ready(text: str) -> DriverLocation | None:
    values = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#"
    )
    host = values.get("NVIDIA_DRIVER_ROOT")
    if not host:
        return None
    return DriverLocation(host, values.get("DRIVER_ROOT_CTR_PATH") or host)


def read_ready(path: Path) -> DriverLocation | None:
    """The location a driver-ready file names; None while there is none."""
    try:
        return parse_ready(path.read_text())
    except OSError:
        return None
