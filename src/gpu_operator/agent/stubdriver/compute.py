"""The compute policy the stub driver's GPUs hold, as ``c/nvml.c`` keeps it: per GPU, in
``<device dir>/gpu-operator-sim/compute/<uuid>``. What a test reads to see what a component
set through ``nvidia-smi -c`` or ``nvidia-smi compute-policy --set-timeslice``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

COMPUTE_DIR = "gpu-operator-sim/compute"
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
