"""Process and port bookkeeping that survives the Python process that started the cluster.

Every component runs in its own session (process group) and is recorded with its kernel start
time, so a later `down` can kill exactly what `up` started even after PID reuse, and a scan of
/proc finds strays whose command line mentions the state directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


@dataclass
class ProcessRecord:
    name: str
    pid: int
    start_time: int
    log: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(str(data["name"]), int(data["pid"]), int(data["start_time"]), str(data["log"]))


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Distinct free ports from outside the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` is also one it hands to outgoing connections, so
    between picking it and the component binding it any client on the machine may take it (seen:
    an operator's health port taken by a kubelet's connection, the operator failing to bind for
    minutes). Ports below the ephemeral range are never picked for outgoing connections."""
    low, high = _ephemeral_range()
    first, last = (10000, low - 1) if low > 11000 else (high + 1, 65535)
    rng = random.SystemRandom()
    picked: list[int] = []
    for _ in range(count * 200):
        if len(picked) == count:
            break
        port = rng.randint(first, last)
        if port not in picked and _bindable(port):
            picked.append(port)
    if len(picked) < count:
        raise RuntimeError(f"no {count} free ports between {first} and {last}")
    return picked


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces; everything after the last ')' is space-separated.
    return raw[raw.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Kernel start time of a live (non-zombie) process, in clock ticks since boot."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(record: ProcessRecord) -> bool:
    """True while the recorded process (not a later one reusing its PID) is running."""
    return start_time(record.pid) == record.start_time


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_strays(names: Iterable[str], markers: Sequence[str]) -> list[int]:
    """PIDs of live processes running one of `names` whose arguments mention a marker."""
    wanted = set(names)
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        args = cmdline(int(entry.name))
        if (
            args
            and os.path.basename(args[0]) in wanted
            and any(m in a for a in args[1:] for m in markers)
            and start_time(int(entry.name)) is not None
        ):
            found.append(int(entry.name))
    return found


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """preexec_fn: have the kernel send `sig` to the child when the starting thread dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _preexec(
    die_with_parent: bool, death_signal: int, cgroups: Sequence[Path]
) -> Callable[[], None] | None:
    """What the child does before exec: join `cgroups` (their cgroup.procs), set PDEATHSIG."""
    if not die_with_parent and not cgroups:
        return None

    def run() -> None:
        for cgroup in cgroups:
            (cgroup / "cgroup.procs").write_text("0")  # 0: the writing process itself
        if die_with_parent:
            _die_with_parent(death_signal)

    return run


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    die_with_parent: bool,
    cwd: Path,
    cgroups: Sequence[Path] = (),
    death_signal: int = signal.SIGTERM,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start `argv` in a new session with output to `log` (in `cgroups` when given); record it
    for later teardown. `death_signal` is what it gets if the starter dies (die_with_parent)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        preexec = _preexec(die_with_parent, death_signal, cgroups)
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
            cwd=cwd,
        )
    started = start_time(proc.pid)
    return proc, ProcessRecord(name, proc.pid, started if started is not None else -1, str(log))


def terminate(
    records: Sequence[ProcessRecord],
    extra_pids: Iterable[int] = (),
    *,
    grace: float = 5.0,
) -> None:
    """SIGTERM each process group, SIGKILL what is left after `grace` seconds, and wait.

    The components hold no state worth a clean shutdown (etcd's data is thrown away), so the
    grace period is short.
    """
    targets: dict[int, int | None] = {r.pid: r.start_time for r in records if alive(r)}
    for pid in extra_pids:
        targets.setdefault(pid, start_time(pid))

    def live() -> list[int]:
        return [p for p, t in targets.items() if t is not None and start_time(p) == t]

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        pending = live()
        for pid in pending:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pending and time.monotonic() < deadline:
            for pid in pending:
                _reap(pid)
            pending = live()
            if pending:
                time.sleep(0.05)
        if not pending:
            for pid in targets:
                _reap(pid)
            return
    raise RuntimeError(f"processes survived SIGKILL: {live()}")


def _reap(pid: int) -> None:
    """Collect our own exited children so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def listening_ports() -> set[int]:
    """Local TCP ports in LISTEN state on this host (IPv4 and IPv6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_bindable(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:port now (with SO_REUSEADDR, as servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
        except OSError:
            return False
    return True


def wait_ports_free(ports: Iterable[int], timeout: float = 5.0) -> list[int]:
    """Wait until no socket listens on `ports`; return the ones still busy at the deadline."""
    wanted = sorted(set(ports))
    deadline = time.monotonic() + timeout
    while True:
        listening = listening_ports()
        busy = [p for p in wanted if p in listening or not port_bindable(p)]
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(0.05)
