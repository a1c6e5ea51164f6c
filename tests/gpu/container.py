"""A container that gets the driver from a CDI spec alone, run without an OCI runtime.

The image is a root filesystem holding only glibc (the libc and dynamic loader ``ldd`` names for
the CUDA probe, with glibc's companion libraries beside libc that NVIDIA's binaries link:
libm, libdl, libpthread, librt) and the probe itself, laid out as a merged-/usr Debian image.
Running it does what a runtime does with a CDI device, and nothing else: in a new mount and PID
namespace (``unshare``), a tmpfs root, ``/proc``, a read-only ``/sys``, a tmpfs ``/dev`` with
the usual character devices, then the spec's device nodes and mounts (bind mounts, read-only
where the spec says ``ro``) and its environment, then ``chroot``. The spec's hooks are not run:
the project's specs mount every library at its soname so that none is needed. Needs root.

Nothing outlives the run: every mount is made inside the private mount namespace.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GLIBC_COMPANIONS = ("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
MANIFEST = "MANIFEST"  # "<file> <path in the image>" per line
MERGED_USR = (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin"))
IMAGE_DIRS = (
    *("usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "usr/local/bin"),
    *("etc", "proc", "sys", "dev", "tmp", "run", "var", "root"),
)
RUNTIME_DEVICES = ("null", "zero", "full", "random", "urandom")  # what runc gives every container
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def ldd_libraries(binary: Path) -> list[tuple[str, str]]:
    """(name, path) of each library ``ldd`` names for ``binary``, the loader included."""
    done = subprocess.run(
        ["ldd", str(binary)], capture_output=True, text=True, timeout=30, check=True
    )
    found: list[tuple[str, str]] = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if "=>" in parts:
            at = parts.index("=>")
            if at + 1 < len(parts) and parts[at + 1].startswith("/"):
                found.append((parts[0], parts[at + 1]))
        elif parts and parts[0].startswith("/"):
            found.append((os.path.basename(parts[0]), parts[0]))
    return found


def collect_glibc(binary: Path, dest: Path) -> Path:
    """Copy the glibc ``binary`` was linked with into ``dest`` (flat), with a MANIFEST naming
    where each file goes in an image (the path ``ldd`` named). Returns ``dest``."""
    libraries = dict(ldd_libraries(binary))
    libc = libraries.get("libc.so.6")
    if libc is None:
        raise RuntimeError(f"ldd names no libc.so.6 for {binary}: {libraries}")
    for name in GLIBC_COMPANIONS:
        path = os.path.join(os.path.dirname(libc), name)
        if os.path.isfile(path):
            libraries.setdefault(name, path)
    dest.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, path in sorted(libraries.items()):
        shutil.copyfile(os.path.realpath(path), dest / name)
        (dest / name).chmod(0o755)
        lines.append(f"{name} {path}")
    (dest / MANIFEST).write_text("\n".join(lines) + "\n")
    return dest


def build_image(dest: Path, glibc: Path, programs: Mapping[str, Path]) -> Path:
    """A root filesystem at ``dest``: merged /usr, glibc as its MANIFEST says, and ``programs``
    (path in the image -> file here). Links are relative: they resolve inside the image."""
    for directory in IMAGE_DIRS:
        (dest / directory).mkdir(parents=True, exist_ok=True)
    for link, points_to in MERGED_USR:
        (dest / link).symlink_to(points_to)
    files: dict[str, Path] = {}
    for line in (glibc / MANIFEST).read_text().splitlines():
        name, path = line.split()
        files[path] = glibc / name
    files.update(programs)
    for path, source in files.items():
        target = dest / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o755)
    return dest


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    read_only: bool


@dataclass(frozen=True)
class Edits:
    """What a runtime applies for one CDI device: the spec's and the device's edits."""

    env: tuple[str, ...]
    nodes: tuple[tuple[str, str], ...]  # (host path, container path)
    mounts: tuple[Mount, ...]
    hooks: int  # how many hooks the spec asks for (not run here)


def edits_for(spec: Mapping[str, Any], device: str) -> Edits:
    """The container edits a runtime applies for ``<kind>=<device>``."""
    named = [d for d in spec.get("devices", []) if d.get("name") == device]
    if not named:
        names = [d.get("name") for d in spec.get("devices", [])]
        raise AssertionError(f"the spec has no device {device!r} (it has {names})")
    env: list[str] = []
    nodes: list[tuple[str, str]] = []
    mounts: list[Mount] = []
    hooks = 0
    for edits in (spec.get("containerEdits") or {}, named[0].get("containerEdits") or {}):
        env += edits.get("env") or []
        for node in edits.get("deviceNodes") or []:
            nodes.append((node.get("hostPath") or node["path"], node["path"]))
        for mount in edits.get("mounts") or []:
            read_only = "ro" in (mount.get("options") or [])
            mounts.append(Mount(mount["hostPath"], mount["containerPath"], read_only))
        hooks += len(edits.get("hooks") or [])
    return Edits(tuple(env), tuple(dict.fromkeys(nodes)), tuple(mounts), hooks)


def _q(path: str | Path) -> str:
    return shlex.quote(str(path))


def script(
    image: Path, root: Path, out: Path, edits: Edits, commands: Mapping[str, Sequence[str]]
) -> str:
    """The shell script run in the new namespaces: set up ``root`` from ``image`` and the edits,
    then each command chrooted, its output in ``out/<name>.out`` and status in ``<name>.rc``."""
    r = _q(root)
    lines = [
        "set -eu",
        f"mount -t tmpfs -o mode=0755 tmpfs {r}",
        f"cp -a {_q(image)}/. {r}/",
        f"mount -t proc proc {r}/proc",
        f"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {r}/sys"
        f" || mount --rbind -o ro /sys {r}/sys",
        f"mount -t tmpfs -o mode=0755,nosuid tmpfs {r}/dev",
        f"mkdir -p {r}/dev/shm {r}/dev/pts",
        f"mount -t tmpfs -o mode=1777,nosuid,nodev shm {r}/dev/shm",
    ]
    for name in RUNTIME_DEVICES:
        lines += [f"touch {r}/dev/{name}", f"mount --bind /dev/{name} {r}/dev/{name}"]
    for host, path in edits.nodes:
        target = f"{r}{_q(path)}"
        lines += [
            f'mkdir -p "$(dirname {target})"',
            f"touch {target}",
            f"mount --bind {_q(host)} {target}",
        ]
    for mount in edits.mounts:
        target = f"{r}{_q(mount.container)}"
        make = f"mkdir -p {target}" if os.path.isdir(mount.host) else f"touch {target}"
        lines += [
            f'mkdir -p "$(dirname {target})"',
            make,
            f"mount --bind {_q(mount.host)} {target}",
        ]
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    env = [_q(shutil.which("env") or "/usr/bin/env"), "-i", f"PATH={PATH}", "HOME=/root"]
    env += [_q(e) for e in edits.env]
    chroot = _q(shutil.which("chroot") or "/usr/sbin/chroot")
    lines.append("set +e")
    for name, argv in commands.items():
        command = " ".join([*env, chroot, r, *(_q(a) for a in argv)])
        log, rc = _q(out / f"{name}.out"), _q(out / f"{name}.rc")
        lines += [f"{command} >{log} 2>&1 </dev/null", f"echo $? >{rc}"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Result:
    rc: int
    output: str


def run(
    image: Path,
    workdir: Path,
    edits: Edits,
    commands: Mapping[str, Sequence[str]],
    *,
    timeout: float = 300,
) -> dict[str, Result]:
    """Run ``commands`` in the container; each one's status and output. The setup's own failure
    (a mount refused) is an AssertionError naming the step."""
    root, out = workdir / "root", workdir / "out"
    root.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    path = workdir / "container.sh"
    path.write_text(script(image, root, out, edits, commands))
    unshare = shutil.which("unshare") or "unshare"
    argv = [unshare, "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-x"]
    done = subprocess.run(
        [*argv, str(path)], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise AssertionError(f"setting up the container failed ({done.returncode}):\n{tail}")
    results = {}
    for name in commands:
        rc_file = out / f"{name}.rc"
        rc = int(rc_file.read_text().strip()) if rc_file.is_file() else -1
        log = out / f"{name}.out"
        results[name] = Result(rc, log.read_text(errors="replace") if log.is_file() else "")
    return results
