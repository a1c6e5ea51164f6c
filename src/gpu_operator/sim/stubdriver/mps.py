"""What the stub driver's MPS control daemon holds, as ``c/mps-control.c`` writes it: the file
``gpu-operator-sim-mps`` in the daemon's pipe directory, there while it runs. What a test reads
from the host to see the limits a claim's daemon was given."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

STATE_FILE = "gpu-operator-sim-mps"


@dataclass(frozen=True)
class MpsState:
    pid: int
    thread_percentage: str  # as the daemon prints it: "50.0"
    pinned_limits: dict[str, str] = field(default_factory=dict)  # GPU UUID -> "10240M"


def read_mps_state(pipe_dir: str | Path) -> MpsState | None:
    """The running daemon's settings, or None when no daemon runs on ``pipe_dir``."""
    try:
        text = Path(pipe_dir, STATE_FILE).read_text()
    except FileNotFoundError:
        return None
    pid, percentage, limits = 0, "", {}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key == "pid":
            pid = int(rest)
        elif key == "thread_percentage":
            percentage = rest
        elif key == "pinned_mem_limit":
            uuid, _, limit = rest.partition(" ")
            limits[uuid] = limit
    return MpsState(pid, percentage, limits)
