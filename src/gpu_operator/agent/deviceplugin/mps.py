"""The MPS control daemon's files, and a SIMULATED daemon that leaves them for simulated GPUs.

NVIDIA's ``mps-control-daemon`` starts one ``nvidia-cuda-mps-control -d`` per resource shared
with MPS, each under ``<root>/<resource>/`` (``pipe/``, ``log/``, and ``.started`` once it
is up), with the shared memory at ``<root>/shm``; clients get ``CUDA_MPS_PIPE_DIRECTORY`` and
those mounts from the plugin's Allocate. Which resources those are is a pure function of the
device map (:func:`mps_resources`). The project's image has no CUDA MPS binary, so
:func:`run_simulated` only lays out the same files, saying SIMULATED in every log line, so the
plugin, its Allocate mounts and the pods that use them meet the layout a real node has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agent.deviceplugin.resources import Device

log = logging.getLogger(__name__)

CONTAINER_ROOT = Path("/mps")  # where the DaemonSet mounts the host's MPS root
STARTED_FILE = ".started"


@dataclass(frozen=True)
class ResourceDirs:
    """The files of one resource's daemon under the MPS root."""

    root: Path
    resource: str

    @property
    def base(self) -> Path:
        return self.root / self.resource

    @property
    def pipe(self) -> Path:
        return self.base / "pipe"

    @property
    def log(self) -> Path:
        return self.base / "log"

    @property
    def started(self) -> Path:
        return self.base / STARTED_FILE


def mps_resources(devices: Mapping[str, Iterable[Device]], strategy: str) -> list[str]:
    """The resources that get a daemon: those whose devices are MPS replicas."""
    if strategy != "mps":
        return []
    return sorted(n for n, found in devices.items() if any(d.replica is not None for d in found))


def lay_out(root: Path, resources: Iterable[str], previous: Iterable[str] = ()) -> list[str]:
    """SIMULATED start: the pipe and log directories and ``.started`` of each resource, and the
    shm directory; a resource no longer shared loses its ``.started``. Returns what started."""
    wanted = sorted(set(resources))
    (root / "shm").mkdir(parents=True, exist_ok=True)
    for gone in sorted(set(previous) - set(wanted)):
        ResourceDirs(root, gone).started.unlink(missing_ok=True)
        log.info("SIMULATED MPS control daemon for %s stopped", gone)
    for resource in wanted:
        dirs = ResourceDirs(root, resource)
        dirs.pipe.mkdir(parents=True, exist_ok=True)
        dirs.log.mkdir(parents=True, exist_ok=True)
        dirs.started.touch()
        log.info(
            "SIMULATED MPS control daemon for %s: %s ready (no nvidia-cuda-mps-control runs)",
            resource,
            dirs.pipe,
        )
    return wanted


def run_simulated(
    root: Path,
    resources: Callable[[], list[str]],
    stop: threading.Event,
    *,
    changed: Callable[[], None] | None = None,
) -> int:
    """Keep the simulated layout for what ``resources()`` says until ``stop``; ``changed``
    blocks until something may have changed (the node's config label), else it is polled."""
    started: list[str] = []
    log.warning("SIMULATED MPS control daemon: simulated GPUs only, no CUDA MPS server runs")
    try:
        while not stop.is_set():
            try:
                started = lay_out(root, resources(), started)
            except (ValueError, OSError) as exc:
                log.error("SIMULATED MPS control daemon: %s", exc)
            if changed is not None:
                changed()
            else:
                stop.wait(10)
    finally:
        lay_out(root, [], started)
    return 0
