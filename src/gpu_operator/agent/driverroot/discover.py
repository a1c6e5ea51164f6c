"""What ``nvidia-ctk cdi generate`` would hand a container from a driver root, found without
NVML or the toolkit: the operator must say what is missing on nodes where neither works yet.

The driver version is read off ``libcuda.so.<version>`` (else ``libnvidia-ml.so.<version>``),
the first one the library search finds; its directory is the *library dir*, and every
``*.so.<version>`` there (and in its ``vdpau/``) plus the legacy ``libnvidia-nvvm70.so.*`` are the
driver's libraries, as in the toolkit's ``pkg/nvcdi/driver-nvml.go``. Binaries, GSP firmware,
IPC sockets and the CDI hook are looked up in the toolkit's fixed places.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpu_operator.agent.driverroot import elf, rootfs
from gpu_operator.agent.driverroot.libraries import Hit, Search, abi

VERSION = r"\d+\.\d+(?:\.\d+)?"
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")  # the version is read off the first found
LEGACY_LIBRARIES = ("libnvidia-nvvm70.so.*",)  # versioned by its own soname, not the driver's
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
IPC_SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
IPC_DIRS = ("/run", "/var/run")
MPS_PIPES = "/tmp/nvidia-mps"
HOOKS = ("nvidia-cdi-hook", "nvidia-ctk")  # nvidia-ctk is the older name of the same hook
HOOK_DIRS = ("/usr/local/nvidia/toolkit", "/usr/bin", "/usr/local/bin")


def firmware_dirs(kernel_release: str | None = None) -> tuple[str, ...]:
    """The kernel's firmware search path (``request_firmware``, and the toolkit's copy of it),
    with the per-kernel directories first, and /usr/lib/firmware for roots that keep it there."""
    release = kernel_release if kernel_release is not None else os.uname().release
    return (
        f"/lib/firmware/updates/{release}",
        "/lib/firmware/updates",
        f"/lib/firmware/{release}",
        "/lib/firmware",
        "/usr/lib/firmware",
    )


@dataclass(frozen=True)
class Library:
    path: str  # root-relative, the real file
    soname: str | None  # DT_SONAME; None when the file has none or is not ELF


@dataclass(frozen=True)
class DriverFiles:
    root: str  # the root as given
    version: str
    library_dir: str  # root-relative
    libraries: tuple[Library, ...]  # sorted by path
    binaries: tuple[str, ...]  # root-relative
    firmware: tuple[str, ...]
    ipc: tuple[str, ...]
    hook: str | None
    searched: tuple[str, ...]  # every place looked at (root-joined), for messages and --verbose

    def library(self, soname: str) -> Library | None:
        return next((lib for lib in self.libraries if lib.soname == soname), None)

    def host_path(self, path: str) -> str:
        """Where the root-relative ``path`` is on this machine."""
        return rootfs.host_path(self.root, path)


def discover_driver(root: str | Path) -> DriverFiles:
    """Everything the driver root offers a container; DriverNotFound when it holds no driver
    library, naming every place searched."""
    search = Search(root)
    found = _driver_library(search)
    if found is None:
        looked_for = " or ".join(f"{name}.<version>" for name in DRIVER_LIBRARIES)
        raise search.not_found(f"{looked_for} ({abi()})")
    version, real = found
    library_dir = os.path.dirname(real)
    return DriverFiles(
        root=search.root,
        version=version,
        library_dir=library_dir,
        libraries=_libraries(search, library_dir, version),
        binaries=_binaries(search, library_dir),
        firmware=_firmware(search, version, library_dir),
        ipc=_ipc(search),
        hook=_hook(search),
        searched=tuple(search.searched),
    )


def _driver_library(search: Search) -> tuple[str, str] | None:
    """(version, real root-relative path) of the first driver library found: the directories in
    order, then the ld.so.cache, for libcuda and then for libnvidia-ml, as nvidia-ctk does."""
    for name in DRIVER_LIBRARIES:
        for hits in search.in_dirs(f"{name}.*"):
            chosen = _versioned(hits, name)
            if chosen is not None:
                return chosen
        chosen = _versioned(search.in_cache(f"{name}.*"), name)
        if chosen is not None:
            return chosen
    return None


def _versioned(hits: Iterable[Hit], name: str) -> tuple[str, str] | None:
    """Among one place's hits, the file the soname link (``libcuda.so.1``) points at, else the
    highest version: a directory can keep an old driver's file after an upgrade."""
    pattern = re.compile(re.escape(name) + rf"\.({VERSION})")
    versions: dict[str, str] = {}
    preferred = None
    for hit in hits:
        match = pattern.fullmatch(os.path.basename(hit.real))
        if match is None:
            continue
        versions[hit.real] = match.group(1)
        if os.path.basename(hit.found) == f"{name}.1":
            preferred = hit.real
    if not versions:
        return None
    if preferred is None:
        preferred = max(versions, key=lambda real: tuple(map(int, versions[real].split("."))))
    return versions[preferred], preferred


def _libraries(search: Search, library_dir: str, version: str) -> tuple[Library, ...]:
    dirs = (library_dir, os.path.join(library_dir, "vdpau"))
    hits = [hit for group in search.in_dirs(f"*.so.{version}", dirs) for hit in group]
    for pattern in LEGACY_LIBRARIES:
        hits += [hit for group in search.in_dirs(pattern, (library_dir,)) for hit in group]
    reals = sorted({hit.real for hit in hits})
    return tuple(Library(real, _soname(rootfs.host_path(search.root, real))) for real in reals)


def _soname(host_file: str) -> str | None:
    info = elf.read_elf(host_file)
    return info.soname if info else None


def _first_executable(search: Search, names: Iterable[str], dirs: Iterable[str]) -> str | None:
    """The first ``dir/name`` that is an ELF executable, by name, then by directory. A script
    of the same name (a wrapper that execs the real one from elsewhere) is passed over: it
    needs a shell and that elsewhere, which a container given only the spec has neither of."""
    dirs = tuple(dict.fromkeys(dirs))
    for directory in dirs:
        search.saw(directory)
    for name in names:
        for directory in dirs:
            path = os.path.join(directory, name)
            if not rootfs.is_executable(search.root, path):
                continue
            target = rootfs.resolve(search.root, path)  # links followed inside the root
            if target and elf.read_elf(rootfs.host_path(search.root, target)) is not None:
                return rootfs.resolve_dir(search.root, path)
    return None


def _beside(library_dir: str, name: str) -> str:
    """``name`` next to the library directory: a driver installed under one prefix
    (``/usr/local/nvidia/lib64``, GKE's ``lib64``) keeps its ``bin`` and ``firmware`` there."""
    return os.path.join(os.path.dirname(library_dir.rstrip("/")) or "/", name)


def _binaries(search: Search, library_dir: str) -> tuple[str, ...]:
    dirs = (_beside(library_dir, "bin"), *BINARY_DIRS)
    found = (_first_executable(search, (name,), dirs) for name in BINARIES)
    return tuple(path for path in found if path is not None)


def _firmware(search: Search, version: str, library_dir: str) -> tuple[str, ...]:
    """Every ``gsp*.bin`` for this version (the GSP firmware the kernel module loads)."""
    found: list[str] = []
    for base in dict.fromkeys((*firmware_dirs(), _beside(library_dir, "firmware"))):
        directory = f"{base}/nvidia/{version}"
        search.saw(directory)
        real_dir, names = rootfs.list_dir(search.root, directory)
        for name in names:
            if real_dir is None or not (name.startswith("gsp") and name.endswith(".bin")):
                continue
            real = rootfs.resolve(search.root, os.path.join(real_dir, name))
            if real and real not in found and rootfs.is_file(search.root, real):
                found.append(real)
    return tuple(found)


def _ipc(search: Search) -> tuple[str, ...]:
    """The daemons' sockets (first of /run, /var/run) and the MPS pipe directory, if there."""
    found: list[str] = []
    for socket in IPC_SOCKETS:
        for directory in IPC_DIRS:
            path = f"{directory}/{socket}"
            search.saw(path)
            if rootfs.mode_of(search.root, path) is not None:
                found.append(rootfs.resolve_dir(search.root, path))
                break
    search.saw(MPS_PIPES)
    if rootfs.mode_of(search.root, MPS_PIPES) is not None:
        found.append(rootfs.resolve_dir(search.root, MPS_PIPES))
    return tuple(dict.fromkeys(found))


def _hook(search: Search) -> str | None:
    return _first_executable(search, HOOKS, HOOK_DIRS)
