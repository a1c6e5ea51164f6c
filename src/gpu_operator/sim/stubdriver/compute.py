"""The compute policy the stub driver's GPUs hold, as ``c/nvml.c`` keeps it: per GPU, in
``<device dir>/gpu-operator-sim/compute/<uuid>``. What a test reads to see what a component
set through ``nvidia-smi -c`` or ``nvidia-smi compute-policy --set-timeslice``."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, replace
from pathlib import Path

SIM_DIR = "gpu-operator-sim"  # the simulated GPUs' own state, in their device directory
COMPUTE_DIR = f"{SIM_DIR}/compute"
# nvidia-smi's names, by NVML's values.
COMPUTE_MODES = ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")
TIME_SLICES = ("Default", "Short", "Medium", "Long")


@dataclass(frozen=True)
class ComputePolicy:
    compute_mode: str = "Default"
    time_slice: str = "Default"


def read_compute_policy(dev_dir: str | Path, uuid: str) -> ComputePolicy:
    """The policy of GPU ``uuid`` whose device nodes are in ``dev_dir``; never set: the
    defaults, as on a GPU after boot."""
    path = Path(dev_dir, COMPUTE_DIR, uuid)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ComputePolicy()
    values = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    return ComputePolicy(
        COMPUTE_MODES[int(values.get("mode", 0))], TIME_SLICES[int(values.get("timeslice", 0))]
    )


def write_compute_policy(
    dev_dir: str | Path,
    uuid: str,
    *,
    compute_mode: str | None = None,
    time_slice: str | None = None,
) -> ComputePolicy:
    """Set one half of GPU ``uuid``'s policy, keeping the other, as ``c/nvml.c`` does: under
    an flock on the directory, written whole and renamed into place. Returns the new policy."""
    directory = Path(dev_dir, COMPUTE_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        policy = read_compute_policy(dev_dir, uuid)
        if compute_mode is not None:
            policy = replace(policy, compute_mode=compute_mode)
        if time_slice is not None:
            policy = replace(policy, time_slice=time_slice)
        text = (
            f"mode {COMPUTE_MODES.index(policy.compute_mode)}\n"
            f"timeslice {TIME_SLICES.index(policy.time_slice)}\n"
        )
        tmp = directory / f"{uuid}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, directory / uuid)
        return policy
    finally:
        os.close(fd)
