"""``agent mps-claim-daemon``: the process of one claim's MPS control daemon pod.

Runs the driver's own ``nvidia-cuda-mps-control -d`` from the mounted driver root (with the
driver's libraries searched first), gives it the claim's defaults through the control pipe,
then writes ``startup.log`` in the log directory: the pod's readiness, so Prepare returns only
once the daemon holds the limits asked. It stays until SIGTERM (the Deployment deleted at
Unprepare), then tells the daemon to quit; a daemon that dies on its own ends the container, so
the kubelet restarts it and the claim's pods find a daemon again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from gpu_operator.agent.dra import mps
from gpu_operator.agent.dra.prepare import PrepareError
from gpu_operator.agent.dra.sharing import DriverProgram
from gpu_operator.agent.driverroot import DriverNotFound, discover_driver

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
REFUSED = ("Invalid", "Unknown", "Cannot")  # how the daemon answers a setting it refuses


def settings_lines(env: Mapping[str, str]) -> list[str]:
    """The control commands that give the daemon the claim's defaults (pure)."""
    lines = []
    threads = env.get(mps.ENV_THREADS)
    if threads:
        lines.append(f"set_default_active_thread_percentage {threads}")
    for uuid, limit in sorted(mps.parse_limits(env.get(mps.ENV_LIMITS, "")).items()):
        lines.append(f"set_default_device_pinned_mem_limit {uuid} {limit}")
    return lines


def run(driver_root: str, stop: threading.Event, env: Mapping[str, str] = os.environ) -> int:
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or mps.PIPE_DIR)
    logs = Path(env.get("CUDA_MPS_LOG_DIRECTORY") or mps.LOG_DIR)
    started = logs / mps.STARTED
    started.unlink(missing_ok=True)
    try:
        control = DriverProgram(discover_driver(driver_root), CONTROL)
        control.run("-d")
        lines = settings_lines(env)
        if lines:
            said = control.run(stdin="".join(f"{line}\n" for line in lines))
            refused = [s for s in said.splitlines() if s.startswith(REFUSED)]
            if refused:
                log.error("the MPS control daemon refused its settings: %s", "; ".join(refused))
                _quit(control)
                return 1
    except (DriverNotFound, PrepareError) as exc:
        log.error("%s", exc)
        return 1
    started.write_text("startup complete\n")
    log.info("MPS control daemon up on %s: %s", pipe, "; ".join(lines) or "NVIDIA's defaults")
    socket = pipe / "control"
    while not stop.wait(1.0):
        if not socket.exists():
            log.error("the MPS control daemon is gone (%s not there)", socket)
            started.unlink(missing_ok=True)
            return 1
    _quit(control)
    started.unlink(missing_ok=True)
    return 0


def _quit(control: DriverProgram) -> None:
    try:
        control.run(stdin="quit\n")
    except PrepareError as exc:
        log.warning("telling the MPS control daemon to quit: %s", exc)
