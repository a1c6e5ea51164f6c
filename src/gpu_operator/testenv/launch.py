"""Launching the components of a testenv: each one spawned with its log in the state dir,
kube-controller-manager and kube-scheduler under a restart loop (as a kubelet restarts a
control plane's static pods), and waits that fail fast with a log's tail when a component
exits during start-up. The start-up procedure (`startup`) says what to launch; this says how.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .processes import ProcessRecord, spawn
from .statedir import TestenvError, tail_log

# The kubelet's part for a control plane's static pods: started again when it exits (after 1,
# 2, 4, then every 8 seconds). The loop forwards SIGTERM, so nothing outlives it.
_RESTART_LOOP = (
    "trap 'kill \"$pid\" 2>/dev/null; exit 143' TERM INT; delay=1; "
    'while :; do "$@" & pid=$!; wait "$pid"; '
    'echo "testenv: ${1##*/} exited ($?), starting it again in ${delay}s" >&2; '
    'sleep "$delay"; [ "$delay" -lt 8 ] && delay=$((delay * 2)); done'
)


def restarted(argv: Sequence[str]) -> list[str]:
    """``argv`` run by a loop that starts it again whenever it exits.

    kube-controller-manager and kube-scheduler are leader-elected, as in a production control
    plane: when the API server is gone for longer than their renew deadline (10 s) they exit,
    and the kubelet starts them again with caches listed afresh. Run once and never restarted
    (as testenv used to), they live through a long outage with informers that resume minutes
    late, and kcm's DaemonSet controller then works from a stale cache.
    """
    return ["/bin/sh", "-c", _RESTART_LOOP, "testenv-restart", *argv]


class Starter:
    """Spawns components and fails fast with the log tail when one of them exits."""

    def __init__(
        self, state_dir: Path, bin_dir: Path, die_with_parent: bool, timings: dict[str, float]
    ) -> None:
        self.t0 = time.monotonic()
        self.timings = timings
        self.state_dir = state_dir
        self.bin_dir = bin_dir
        self.die_with_parent = die_with_parent
        self.records: list[ProcessRecord] = []
        self.popens: list[subprocess.Popen[bytes]] = []
        # Processes to record and stop that this object did not spawn (real nodes' inits).
        self.adopted: list[ProcessRecord] = []

    def spawn(
        self,
        name: str,
        args: Sequence[str],
        *,
        restart: bool = False,
        death_signal: int = signal.SIGTERM,
    ) -> None:
        argv = [str(self.bin_dir / name), *args]
        log = self.state_dir / "logs" / f"{name}.log"
        self.spawn_argv(name, restarted(argv) if restart else argv, log, death_signal=death_signal)

    def spawn_argv(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        cgroups: Sequence[Path] = (),
        death_signal: int = signal.SIGTERM,
    ) -> ProcessRecord:
        proc, record = spawn(
            name,
            argv,
            log,
            die_with_parent=self.die_with_parent,
            cwd=self.state_dir,
            cgroups=cgroups,
            death_signal=death_signal,
        )
        self.popens.append(proc)
        self.records.append(record)
        return record

    def check(self) -> None:
        for proc, record in zip(self.popens, self.records, strict=True):
            if proc.poll() is not None:
                raise TestenvError(
                    f"{record.name} exited with code {proc.returncode} during startup; "
                    f"last lines of {record.log}:\n{tail_log(record.log)}"
                )

    def wait_for(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        while True:
            self.check()
            if ready():
                self.timings[what] = round(time.monotonic() - self.t0, 3)
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {r.log}\n{tail_log(r.log, 10)}" for r in self.records)
                raise TestenvError(f"timed out waiting for {what}\n{logs}")
            time.sleep(0.1)
