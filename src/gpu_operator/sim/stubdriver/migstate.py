"""The MIG devices the stub driver's GPUs hold, as ``c/nvml.c`` reads them: per GPU, in
``<device dir>/gpu-operator-sim/mig/<uuid>``, written by the simulated NVML whenever its MIG
state changes. ``mode <0|1>`` on the first line, then ``mig <gi> <ci> <profile> <uuid>`` a MIG
device, in GPU-instance order. The C library shows a MIG device to a process only when that
process has both its capability nodes, as a driver does: a container given one MIG device
through CDI lists that one."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.sim.stubdriver.compute import SIM_DIR

MIG_DIR = f"{SIM_DIR}/mig"


@dataclass(frozen=True)
class MigRow:
    gi: int
    ci: int
    profile: str  # "1g.10gb"
    uuid: str  # "MIG-..."


def write_mig_state(dev_dir: str | Path, uuid: str, enabled: bool, rows: Sequence[MigRow]) -> None:
    """GPU ``uuid``'s MIG mode and devices, written whole and renamed into place (a reader
    never sees half a list)."""
    directory = Path(dev_dir, MIG_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"mode {int(enabled)}", *(f"mig {r.gi} {r.ci} {r.profile} {r.uuid}" for r in rows)]
    tmp = directory / f".{uuid}.{os.getpid()}"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, directory / uuid)


def read_mig_state(dev_dir: str | Path, uuid: str) -> tuple[bool, list[MigRow]]:
    """What :func:`write_mig_state` wrote for GPU ``uuid``; never written: MIG off, none."""
    try:
        text = Path(dev_dir, MIG_DIR, uuid).read_text()
    except FileNotFoundError:
        return False, []
    enabled, rows = False, []
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["mode"] and len(fields) == 2:
            enabled = fields[1] == "1"
        elif fields[:1] == ["mig"] and len(fields) == 5:
            rows.append(MigRow(int(fields[1]), int(fields[2]), fields[3], fields[4]))
    return enabled, rows
