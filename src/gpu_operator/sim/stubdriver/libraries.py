"""What the stub driver is made of: its libraries and programs, and where each goes.

The set of libraries is the one NVIDIA's container toolkit mounts for a compute/utility
container. Artefacts are built once, version-independent (``build.py``); laying out names them
for a driver version. Only ``libnvidia-gpucomp`` has the version in its soname: it is linked
with :data:`VERSION_PLACEHOLDER` there, which :func:`set_soname_version` overwrites in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .table import StubDriverError, check_version

Style = Literal["ubuntu", "rhel", "gke"]
STYLES: tuple[Style, ...] = ("ubuntu", "rhel", "gke")
# Where each distribution's driver puts libraries and programs, below the driver root. The C
# side finds the driver root by stripping one of STUB_LIB_DIRS (c/stubdriver.h): keep in step.
LIB_DIRS: dict[Style, str] = {
    "ubuntu": "usr/lib/x86_64-linux-gnu",
    "rhel": "usr/lib64",
    "gke": "lib64",
}
BIN_DIRS: dict[Style, str] = {"ubuntu": "usr/bin", "rhel": "usr/bin", "gke": "bin"}
FIRMWARE_DIR = "lib/firmware/nvidia"
FIRMWARE_FILES = ("gsp_ga10x.bin", "gsp_tu10x.bin")

VERSION_PLACEHOLDER = "GPU_OPERATOR_STUB_VERSION_PLACEHOLDER___"  # 40 chars: the longest version
PROBE = "gpu-operator-cuda-probe"


@dataclass(frozen=True)
class Library:
    """One library: ``stem`` (``libcuda``), its C source and its soname, where ``{version}``
    stands for the driver version."""

    stem: str
    source: str
    soname: str
    versioned_file: bool = True  # the file is <stem>.so.<version>, with a soname symlink
    dev_link: bool = False  # <stem>.so -> soname, as NVIDIA's installer makes for some
    table: bool = False  # carries the GPU table

    @property
    def artefact(self) -> str:
        """The built file's name (version-independent)."""
        return f"{self.stem}.so"

    @property
    def soname_versioned(self) -> bool:
        return "{version}" in self.soname

    def link_soname(self) -> str:
        """The soname given to the linker: the placeholder where the version goes."""
        return self.soname.format(version=VERSION_PLACEHOLDER)

    def soname_for(self, version: str) -> str:
        return self.soname.format(version=version)

    def file_name(self, version: str) -> str:
        """The library's file in a driver root."""
        return f"{self.stem}.so.{version}" if self.versioned_file else self.soname_for(version)


LIBRARIES: tuple[Library, ...] = (
    Library("libnvidia-ml", "nvml.c", "libnvidia-ml.so.1", dev_link=True, table=True),
    Library("libcuda", "cuda.c", "libcuda.so.1", dev_link=True, table=True),
    Library("libnvidia-ptxjitcompiler", "empty.c", "libnvidia-ptxjitcompiler.so.1"),
    Library("libnvidia-nvvm", "empty.c", "libnvidia-nvvm.so.4"),
    Library("libnvidia-gpucomp", "empty.c", "libnvidia-gpucomp.so.{version}"),
    Library("libnvidia-allocator", "empty.c", "libnvidia-allocator.so.1"),
    Library("libnvidia-cfg", "empty.c", "libnvidia-cfg.so.1"),
    Library("libnvidia-opencl", "empty.c", "libnvidia-opencl.so.1"),
    Library("libnvcuvid", "empty.c", "libnvcuvid.so.1"),
    Library("libnvidia-encode", "empty.c", "libnvidia-encode.so.1"),
    Library("libnvidia-opticalflow", "empty.c", "libnvidia-opticalflow.so.1"),
    Library("libcudadebugger", "empty.c", "libcudadebugger.so.1"),
    Library("libnvidia-nvvm70", "empty.c", "libnvidia-nvvm70.so.4", versioned_file=False),
)


@dataclass(frozen=True)
class Program:
    """One executable: its name in the driver root's bin directory and its C source."""

    name: str
    source: str


PROGRAMS: tuple[Program, ...] = (
    Program("nvidia-smi", "nvidia-smi.c"),
    Program(PROBE, "cuda-probe.c"),
    # MPS: one stand-in under both names (mps-control.c tells them apart by argv[0]).
    Program("nvidia-cuda-mps-control", "mps-control.c"),
    Program("nvidia-cuda-mps-server", "mps-control.c"),
)


def set_soname_version(data: bytes, library: Library, version: str) -> bytes:
    """``data`` (the library built with :meth:`Library.link_soname`) with the placeholder in
    its soname replaced by ``version``, NUL-padded: the dynamic string stays where it was."""
    if not library.soname_versioned:
        return data
    check_version(version)
    if len(version) > len(VERSION_PLACEHOLDER):
        raise StubDriverError(f"driver version {version!r}: over {len(VERSION_PLACEHOLDER)} chars")
    old = library.link_soname().encode() + b"\0"
    new = library.soname_for(version).encode().ljust(len(old), b"\0")
    if data.count(old) != 1:
        raise StubDriverError(f"{library.artefact}: its soname placeholder is not there once")
    return data.replace(old, new)
