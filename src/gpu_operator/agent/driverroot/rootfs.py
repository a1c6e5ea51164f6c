"""Paths inside a root filesystem that is not ours: a driver container's tree at
/run/nvidia/driver, GKE's /home/kubernetes/bin/nvidia, or a host mounted into a pod.

Its symlinks were written for that root: ``libcuda.so.1 -> /usr/lib64/libcuda.so.580.95.05``
means the root's /usr/lib64, and Debian's merged /usr (``lib -> usr/lib``) or its alternatives
(``/usr/bin/nvidia-smi -> /etc/alternatives/...``) may be absolute. Letting the kernel follow
them would read this machine's files instead, so :func:`resolve` walks the links itself, as a
chroot would, and every path handed out is *root-relative* (absolute-style, ``/usr/lib64/...``).
"""

from __future__ import annotations

import os
import stat

MAX_LINKS = 40  # the kernel's own limit (ELOOP)


def host_path(root: str, path: str) -> str:
    """Where the root-relative ``path`` is on this machine."""
    rel = path.lstrip("/")
    base = root.rstrip("/")
    if not base:
        return "/" + rel
    return os.path.join(base, rel) if rel else base


def resolve(root: str, path: str) -> str | None:
    """``path`` with every symlink followed inside ``root``; None when some part is missing or
    the links loop. ``..`` stops at the root, as it does for a chrooted process."""
    pending = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        where = host_path(root, "/".join([*done, part]))
        try:
            mode = os.lstat(where).st_mode
        except OSError:
            return None
        if not stat.S_ISLNK(mode):
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            return None
        try:
            target = os.readlink(where)
        except OSError:
            return None
        if target.startswith("/"):
            done = []
        pending[:0] = [p for p in target.split("/") if p]
    return "/" + "/".join(done)


def resolve_dir(root: str, path: str) -> str:
    """``path`` with its directories resolved but its last name kept (a binary's symlink keeps
    the name it is called by); unresolvable directories are left as they are."""
    parent, name = os.path.split("/" + path.lstrip("/"))
    real = resolve(root, parent) or parent
    return os.path.join(real, name)


def list_dir(root: str, path: str) -> tuple[str | None, list[str]]:
    """The resolved directory and its sorted entry names; (None, []) when it is not there."""
    real = resolve(root, path)
    if real is None:
        return None, []
    try:
        return real, sorted(os.listdir(host_path(root, real)))
    except OSError:
        return None, []


def mode_of(root: str, path: str) -> int | None:
    """The mode of what ``path`` resolves to inside the root, or None when nothing is there."""
    real = resolve(root, path)
    if real is None:
        return None
    try:
        return os.stat(host_path(root, real)).st_mode
    except OSError:
        return None


def is_file(root: str, path: str) -> bool:
    mode = mode_of(root, path)
    return mode is not None and stat.S_ISREG(mode)


def is_executable(root: str, path: str) -> bool:
    """A regular file with an execute bit, which is what nvidia-ctk mounts as a binary."""
    mode = mode_of(root, path)
    return mode is not None and stat.S_ISREG(mode) and bool(mode & 0o111)
