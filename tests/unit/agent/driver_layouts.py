"""Driver roots for tests: tiny real ELF shared objects, glibc ld.so.cache files, and the
layouts real nodes have (Ubuntu multiarch, RHEL lib64, the driver container, GKE)."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

from gpu_operator.agent.driverroot import elf
from gpu_operator.agent.driverroot.libraries import host_machine

VERSION = "580.95.05"
HOST = host_machine() or elf.EM_X86_64
FOREIGN = elf.EM_AARCH64 if HOST == elf.EM_X86_64 else elf.EM_X86_64
EM_386 = 3
LOAD_ADDRESS = 0x10000  # so a reader must map DT_STRTAB's address back to a file offset

# ld.so.cache entry flags: FLAG_ELF_LIBC6 | the ABI
CACHE_FLAGS = {elf.EM_X86_64: 0x0303, elf.EM_AARCH64: 0x0A03}
CACHE_HOST = CACHE_FLAGS[HOST]
CACHE_I386 = 0x0003


def elf_bytes(soname: str | None, bits: int = 64, machine: int | None = None) -> bytes:
    """An ELF shared object: a header, a PT_LOAD over the whole file, a PT_DYNAMIC with
    DT_STRTAB (and DT_SONAME), and the string table."""
    machine = machine if machine is not None else (HOST if bits == 64 else EM_386)
    wide = bits == 64
    ehsize, phentsize, dynsize = (64, 56, 16) if wide else (52, 32, 8)
    dyn_off = ehsize + 2 * phentsize
    tags = [elf.DT_STRTAB] + ([elf.DT_SONAME] if soname else []) + [elf.DT_NULL]
    str_off = dyn_off + len(tags) * dynsize
    strtab = b"\0" + (soname.encode() + b"\0" if soname else b"")
    total = str_off + len(strtab)
    values = {elf.DT_STRTAB: LOAD_ADDRESS + str_off, elf.DT_SONAME: 1, elf.DT_NULL: 0}
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1, 1]) + bytes(9)
    if wide:
        header = struct.pack(
            "<16sHHIQQQIHHHHHH", ident, 3, machine, 1, 0, ehsize, 0, 0, ehsize, 56, 2, 64, 0, 0
        )
        phdrs = struct.pack(
            "<IIQQQQQQ", elf.PT_LOAD, 5, 0, LOAD_ADDRESS, LOAD_ADDRESS, total, total, 0x1000
        ) + struct.pack(
            "<IIQQQQQQ",
            *(elf.PT_DYNAMIC, 6, dyn_off, LOAD_ADDRESS + dyn_off, LOAD_ADDRESS + dyn_off),
            *(len(tags) * dynsize, len(tags) * dynsize, 8),
        )
        dynamic = b"".join(struct.pack("<qQ", tag, values[tag]) for tag in tags)
    else:
        header = struct.pack(
            "<16sHHIIIIIHHHHHH", ident, 3, machine, 1, 0, ehsize, 0, 0, ehsize, 32, 2, 40, 0, 0
        )
        phdrs = struct.pack(
            "<IIIIIIII", elf.PT_LOAD, 0, LOAD_ADDRESS, LOAD_ADDRESS, total, total, 5, 0x1000
        ) + struct.pack(
            "<IIIIIIII",
            *(elf.PT_DYNAMIC, dyn_off, LOAD_ADDRESS + dyn_off, LOAD_ADDRESS + dyn_off),
            *(len(tags) * dynsize, len(tags) * dynsize, 6, 4),
        )
        dynamic = b"".join(struct.pack("<iI", tag, values[tag]) for tag in tags)
    data = header + phdrs + dynamic + strtab
    assert len(data) == total
    return data


def write(root: Path, path: str, data: bytes = b"", mode: int = 0o644) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod(mode)
    return target


def lib(root: Path, path: str, soname: str | None, bits: int = 64, **kw: int) -> Path:
    return write(root, path, elf_bytes(soname, bits, **kw), 0o755)


def link(root: Path, path: str, target: str) -> None:
    """A symlink inside the root (``target`` as written: relative, or absolute for the root)."""
    where = root / path.lstrip("/")
    where.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, where)


def executable(root: Path, path: str) -> Path:
    """A program as the driver ships it: an ELF executable."""
    return write(root, path, elf_bytes(None), 0o755)


def script(root: Path, path: str) -> Path:
    """A wrapper script of a program's name (some images put one in /usr/bin)."""
    return write(root, path, b'#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi "$@"\n', 0o755)


def ld_cache_bytes(entries: Sequence[tuple[str, str, int]], old_format: bool = False) -> bytes:
    """glibc's cache for (soname, path, flags) entries, new format (optionally after the old
    one, as glibc < 2.32 wrote it); string offsets count from the new header."""
    strings = bytearray()
    records = []
    start = 48 + 24 * len(entries)
    for soname, path, flags in entries:
        key = start + len(strings)
        strings += soname.encode() + b"\0"
        value = start + len(strings)
        strings += path.encode() + b"\0"
        records.append(struct.pack("<iIIIQ", flags, key, value, 0, 0))
    new = struct.pack("<20sII20x", b"glibc-ld.so.cache1.1", len(entries), len(strings))
    new += b"".join(records) + bytes(strings)
    if not old_format:
        return new
    old = struct.pack("<12sI", b"ld.so-1.7.0\0", len(entries))
    old += b"".join(struct.pack("<iII", flags, 0, 0) for _, _, flags in entries)
    return old + bytes(-len(old) % 8) + new


def ld_cache(root: Path, entries: Sequence[tuple[str, str, int]], old: bool = False) -> None:
    write(root, "/etc/ld.so.cache", ld_cache_bytes(entries, old))


def driver_libs(root: Path, libdir: str, version: str = VERSION, absolute: bool = False) -> None:
    """libcuda, libnvidia-ml (with their soname and dev links), a library whose soname is
    versioned, the legacy nvvm70, and the VDPAU driver in vdpau/."""

    def so(name: str, soname: str) -> None:
        lib(root, f"{libdir}/{name}.so.{version}", soname)
        target = f"{libdir}/{name}.so.{version}" if absolute else f"{name}.so.{version}"
        if soname != f"{name}.so.{version}":
            link(root, f"{libdir}/{soname}", target)
        link(root, f"{libdir}/{name}.so", soname)

    so("libcuda", "libcuda.so.1")
    so("libnvidia-ml", "libnvidia-ml.so.1")
    so("libnvidia-gpucomp", f"libnvidia-gpucomp.so.{version}")
    lib(root, f"{libdir}/libnvidia-nvvm70.so.4", "libnvidia-nvvm70.so.4")
    lib(root, f"{libdir}/vdpau/libvdpau_nvidia.so.{version}", "libvdpau_nvidia.so.1")


def ubuntu(root: Path) -> None:
    """Ubuntu's multiarch layout, firmware in /lib/firmware, binaries in /usr/bin."""
    driver_libs(root, "/usr/lib/x86_64-linux-gnu")
    for name in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"):
        executable(root, f"/usr/bin/{name}")
    write(root, f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin", b"gsp")
    write(root, f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin", b"gsp")


def rhel(root: Path) -> None:
    """RHEL: 64-bit libraries in /usr/lib64, 32-bit ones in /usr/lib."""
    driver_libs(root, "/usr/lib64")
    lib(root, f"/usr/lib/libcuda.so.{VERSION}", "libcuda.so.1", bits=32)
    lib(root, f"/usr/lib/libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1", bits=32)
    executable(root, "/usr/bin/nvidia-smi")


def gke(root: Path) -> None:
    """GKE's /home/kubernetes/bin/nvidia: lib64/ and bin/, no ld.so.cache, no /usr."""
    driver_libs(root, "/lib64")
    executable(root, "/bin/nvidia-smi")
    executable(root, "/bin/nvidia-cuda-mps-control")
