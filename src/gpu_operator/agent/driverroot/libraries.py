"""Finding a library inside a driver root the way nvidia-ctk does: a fixed list of directories
(its ``lookup.NewLibraryLocator``; ``/usr/lib`` and ``/lib`` are ours, for roots that keep the
driver there), then the root's own ld.so.cache. Only 64-bit libraries built for this machine
count: a 32-bit libcuda in RHEL's /usr/lib must not decide the driver version.
"""

from __future__ import annotations

import fnmatch
import os
import platform
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gpu_operator.agent.driverroot import elf, rootfs
from gpu_operator.agent.driverroot.ldcache import CacheEntry, read_ld_cache

LIBRARY_DIRS = (
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    "/glibc/lib",
    "/usr/lib",
    "/lib",
)
LD_CACHE = "/etc/ld.so.cache"
MACHINES = {
    "x86_64": elf.EM_X86_64,
    "amd64": elf.EM_X86_64,
    "aarch64": elf.EM_AARCH64,
    "arm64": elf.EM_AARCH64,
}
MACHINE_NAMES = {elf.EM_X86_64: "x86_64", elf.EM_AARCH64: "aarch64"}


class DriverNotFound(Exception):
    """What was looked for, under which root, and every place searched (directories and the
    cache, not each file tried), so one log line tells an admin where the driver should be."""

    def __init__(
        self,
        looked_for: str,
        root: str,
        searched: Sequence[str],
        skipped: Sequence[str] = (),
    ) -> None:
        self.looked_for = looked_for
        self.root = root
        self.searched = tuple(searched)
        self.skipped = tuple(skipped)
        where = f"under driver root {root}"
        if not os.path.isdir(root):
            where += " (which does not exist)"
        message = f"{looked_for} not found {where}; searched: {', '.join(self.searched)}"
        if self.skipped:
            message += f"; skipped (not {abi()}): {', '.join(self.skipped)}"
        super().__init__(message)

    def __reduce__(self) -> tuple[type[DriverNotFound], tuple[object, ...]]:
        """Picklable (it crosses process boundaries) although it takes more than a message."""
        return type(self), (self.looked_for, self.root, self.searched, self.skipped)


@cache
def host_machine() -> int | None:
    """The ELF e_machine of this machine's libraries; None where we do not know it."""
    return MACHINES.get(platform.machine().lower())


def abi() -> str:
    """What a usable library is, for messages: "64-bit x86_64"."""
    name = MACHINE_NAMES.get(host_machine() or -1)
    return f"64-bit {name}" if name else "64-bit"


def foreign(host_file: str) -> bool:
    """An ELF file a 64-bit process here cannot load (32-bit, or another machine's). Non-ELF
    files are not foreign: a simulated node's placeholders still count."""
    info = elf.read_elf(host_file)
    if info is None:
        return False
    machine = host_machine()
    return info.bits != 64 or (machine is not None and info.machine != machine)


@dataclass(frozen=True)
class Hit:
    """A library found: the name it was found by and the real file (both root-relative)."""

    found: str
    real: str


class Search:
    """One search's record: the places looked at (root-joined) and the foreign files seen."""

    def __init__(self, root: str | Path) -> None:
        self.root = str(root)
        self.searched: list[str] = []
        self.skipped: list[str] = []

    def saw(self, path: str) -> None:
        where = rootfs.host_path(self.root, path)
        if where not in self.searched:
            self.searched.append(where)

    def usable(self, found: str) -> Hit | None:
        """The hit when ``found`` resolves to a regular file this machine can load."""
        real = rootfs.resolve(self.root, found)
        if real is None or not rootfs.is_file(self.root, real):
            return None
        if foreign(rootfs.host_path(self.root, real)):
            where = rootfs.host_path(self.root, real)
            if where not in self.skipped:
                self.skipped.append(where)
            return None
        return Hit(found, real)

    def in_dirs(self, pattern: str, dirs: Iterable[str] = LIBRARY_DIRS) -> Iterator[list[Hit]]:
        """Per directory, in order, the usable files whose name matches ``pattern``."""
        for directory in dirs:
            self.saw(directory)
            real_dir, names = rootfs.list_dir(self.root, directory)
            if real_dir is None:
                continue
            hits = [
                self.usable(os.path.join(real_dir, name))
                for name in names
                if fnmatch.fnmatchcase(name, pattern)
            ]
            found = [hit for hit in hits if hit is not None]
            if found:
                yield found

    def in_cache(self, pattern: str) -> list[Hit]:
        """Usable 64-bit cache entries whose soname or file name matches, in cache order."""
        self.saw(LD_CACHE)
        hits: dict[str, Hit] = {}
        for entry in cache_entries(self.root):
            if entry.is_64bit and _matches(entry, pattern):
                hit = self.usable(entry.path)
                if hit is not None:
                    hits.setdefault(hit.real, hit)
        return list(hits.values())

    def not_found(self, looked_for: str) -> DriverNotFound:
        return DriverNotFound(looked_for, self.root, self.searched, self.skipped)


def cache_entries(root: str) -> tuple[CacheEntry, ...]:
    return read_ld_cache(rootfs.host_path(root, LD_CACHE))


def _matches(entry: CacheEntry, pattern: str) -> bool:
    names = (entry.soname, os.path.basename(entry.path))
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def find_library(root: str | Path, soname: str) -> Path:
    """Where ``soname`` (e.g. ``libnvidia-ml.so.1``) is on this machine, looking in the root's
    ld.so.cache first (the dynamic loader's own order for a soname), then the directories.

    The answer is the real file with its symlinks followed inside the root: a soname link in a
    mounted root may be absolute, and would lead this machine's loader to its own copy."""
    search = Search(root)
    hits = search.in_cache(soname) or next(iter(search.in_dirs(soname)), [])
    if not hits:
        raise search.not_found(f"{soname} ({abi()})")
    return Path(rootfs.host_path(search.root, hits[0].real))
