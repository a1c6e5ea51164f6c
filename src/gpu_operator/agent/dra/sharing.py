"""What prepared claims set on their GPUs, and put back when unprepared: the time-slice (and,
for MPS, the compute mode: :mod:`gpu_operator.agent.dra.mps`).

NVML has no call for a GPU's scheduling time-slice; as NVIDIA's DRA driver does, the plugin
runs the driver's own ``nvidia-smi compute-policy -i <uuid> --set-timeslice <n>``, found in the
driver root it loads NVML from, with that root's library directory searched first so the tool
loads the same ``libnvidia-ml.so.1``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from gpu_operator.agent.dra.prepare import PreparedDevice, PrepareError, TimeSlice
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.agent.driverroot import DriverFiles
from gpu_operator.api.draconfig import INTERVALS

# nvidia-smi's values: the intervals' order (NVIDIA's TimeSlicingConfig.Interval.Int()).
TIME_SLICE_VALUES = {name: value for value, name in enumerate(INTERVALS)}
NVIDIA_SMI = "nvidia-smi"
SMI_TIMEOUT_S = 30.0


class GpuSettings(Protocol):
    def set_time_slice(self, uuid: str, interval: str) -> None: ...

    def set_compute_mode(self, uuid: str, mode: str) -> None: ...


class DriverProgram:
    """One of the driver's programs, found in its root, run with the driver's libraries
    searched first (so it loads the same ``libnvidia-ml.so.1`` the plugin does)."""

    def __init__(self, files: DriverFiles | None, name: str) -> None:
        found = next((b for b in files.binaries if b.endswith(f"/{name}")), None) if files else None
        self.name = name
        self.program = files.host_path(found) if files and found else None
        self.library_dir = files.host_path(files.library_dir) if files else None
        self.searched = files.root if files else "no driver root"

    def run(self, *args: str, stdin: str | None = None, why: str = "") -> str:
        """Its standard output; a failure is a :class:`PrepareError` naming the command."""
        if self.program is None:
            raise PrepareError(f"no {self.name} in the driver root ({self.searched}){why}")
        env = dict(os.environ)
        if self.library_dir:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (self.library_dir, env.get("LD_LIBRARY_PATH")) if p
            )
        command = [self.program, *args]
        try:
            done = subprocess.run(
                command, env=env, input=stdin, capture_output=True, text=True,
                timeout=SMI_TIMEOUT_S, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PrepareError(f"{' '.join(command)}: {exc}") from None
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()
            raise PrepareError(
                f"{' '.join(command)} exited {done.returncode}: {said[-1] if said else 'no output'}"
            )
        return done.stdout


class NvidiaSmi:
    """The driver's nvidia-smi: what sets a GPU's time-slice and compute mode."""

    def __init__(self, driver: HostDriver) -> None:
        self.program = DriverProgram(driver.files, NVIDIA_SMI)

    def set_time_slice(self, uuid: str, interval: str) -> None:
        value = str(TIME_SLICE_VALUES[interval])
        self.program.run(
            "compute-policy", "-i", uuid, "--set-timeslice", value, why=f" to set {value!r} with"
        )

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self.program.run("-i", uuid, "-c", mode, why=f" to set {mode!r} with")


def set_time_slices(settings: Callable[[], GpuSettings], slices: Sequence[TimeSlice]) -> None:
    """Set each of ``slices``; ``settings`` is asked for only when there is one (finding the
    driver's tool is not free, and most claims set nothing)."""
    if slices:
        tool = settings()
        for slice_ in slices:
            tool.set_time_slice(slice_.uuid, slice_.interval)


def apply_time_slices(
    settings: Callable[[], GpuSettings], prepared: Iterable[PreparedDevice]
) -> None:
    """Set each prepared full GPU's time-slice its config asks for."""
    set_time_slices(settings, [p.time_slice for p in prepared if p.time_slice is not None])


def reset_time_slices(
    settings: Callable[[], GpuSettings], prepared: Iterable[PreparedDevice]
) -> None:
    """Put back the default time-slice on each GPU a claim had set another on."""
    set_time_slices(
        settings,
        [
            TimeSlice(p.time_slice.uuid, "Default")
            for p in prepared
            if p.time_slice is not None and p.time_slice.interval != "Default"
        ],
    )
