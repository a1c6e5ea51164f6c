"""The state directory of one testenv: where it is, claiming it for one session, the record
(`state.json`) that outlives the process that started the cluster, how to recognise the
processes started for it, and the errors testenv raises.

The bottom of the testenv cluster modules: the handle, the launcher and the start-up procedure
all build on it, and it imports none of them.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from . import binaries

STATE_FILE = "state.json"


class TestenvError(RuntimeError):
    """The control plane could not be started or reached; the message says why."""


def default_state_dir() -> Path:
    """`$TESTENV_STATE_DIR`, else `.testenv/` in the checkout (or the cwd outside one)."""
    env = os.environ.get("TESTENV_STATE_DIR")
    if env:
        return Path(env).resolve()
    root = binaries.repo_root()
    return (root or Path.cwd()) / ".testenv"


def claim_state_dir(parent: Path, name: str) -> tuple[Path, IO[str]]:
    """Lock `parent/name` (else `name-1`, `name-2`, ...) for this process, so concurrent test
    sessions never stop each other's cluster. Keep the returned file open while using the dir;
    the kernel drops the lock when the process exits, however it exits."""
    for i in range(64):
        candidate = parent / (name if i == 0 else f"{name}-{i}")
        candidate.mkdir(parents=True, exist_ok=True)
        lock = (candidate / ".lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return candidate.resolve(), lock
    raise TestenvError(f"no free state dir {parent / name}-N (64 sessions hold one)")


def stray_markers(state_dir: Path) -> list[str]:
    """Paths that appear in the arguments of exactly this state dir's components (and not in
    those of a state dir nested inside it)."""
    names = ("etcd", "pki/", "kwok.yaml", "kwok.kubeconfig", "kube-controller-manager.kubeconfig")
    return [
        f"{state_dir}{os.sep}{name}" for name in (*names, "kube-scheduler.kubeconfig", "nodes/")
    ]


STRAY_NAMES = (*binaries.COMPONENTS, "unshare", "sh")  # sh: the loop of `launch.restarted`


def tail_log(path: str, lines: int = 25) -> str:
    """The last `lines` lines of a component's log, for error messages."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
