"""Just enough ELF to tell which libraries a container can load: the class (32/64-bit), the
machine, and the ``DT_SONAME`` the dynamic loader files it under.

A driver root mixes 64-bit libraries with 32-bit ones (RHEL keeps those in /usr/lib, which we
search) and a library dir may hold stray non-ELF files; a wrong guess would mount a library the
container's loader then refuses. Only the headers and the dynamic segment are read (libcuda is
tens of megabytes), through the program headers, which is the loader's own view and survives
``strip --strip-section-headers``. Anything malformed reads as "not ELF" (None), never raises.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"\x7fELF"
CLASS_32, CLASS_64 = 1, 2
DATA_LSB, DATA_MSB = 1, 2
EM_X86_64 = 62
EM_AARCH64 = 183
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_SONAME = 0, 5, 14

MAX_HEADERS = 1 << 16  # bytes of program headers we are willing to read
MAX_DYNAMIC = 1 << 20  # bytes of dynamic segment
MAX_NAME = 4096


@dataclass(frozen=True)
class ElfInfo:
    bits: int  # 32 or 64
    machine: int  # e_machine: 62 x86-64, 183 aarch64, 3 i386, 40 arm
    soname: str | None


@dataclass(frozen=True)
class _Layout:
    """Where the fields sit for one class and byte order."""

    bits: int
    order: str  # struct's "<" or ">"

    def header(self, ident: bytes) -> tuple[int, int, int]:
        """e_phoff, e_phentsize, e_phnum."""
        if self.bits == 64:
            (phoff,) = struct.unpack_from(self.order + "Q", ident, 32)
            entsize, count = struct.unpack_from(self.order + "HH", ident, 54)
        else:
            (phoff,) = struct.unpack_from(self.order + "I", ident, 28)
            entsize, count = struct.unpack_from(self.order + "HH", ident, 42)
        return phoff, entsize, count

    @property
    def phdr_size(self) -> int:
        return 56 if self.bits == 64 else 32

    def phdr(self, raw: bytes) -> tuple[int, int, int, int]:
        """p_type, p_offset, p_vaddr, p_filesz."""
        if self.bits == 64:  # type, flags, offset, vaddr, paddr, filesz, ...
            kind, _, offset, vaddr, _, size = struct.unpack_from(self.order + "IIQQQQ", raw)
        else:  # type, offset, vaddr, paddr, filesz, ...
            kind, offset, vaddr, _, size = struct.unpack_from(self.order + "IIIII", raw)
        return kind, offset, vaddr, size

    @property
    def dyn(self) -> str:
        """d_tag, d_val."""
        return self.order + ("qQ" if self.bits == 64 else "iI")


def read_elf(path: str | Path) -> ElfInfo | None:
    """Class, machine and soname of the file, or None when it is not a readable ELF file."""
    try:
        with open(path, "rb") as f:
            return _read(f)
    except (OSError, struct.error, ValueError):
        return None


def _read(f: BinaryIO) -> ElfInfo | None:
    ident = f.read(64)
    if len(ident) < 52 or ident[:4] != MAGIC:
        return None
    if ident[4] not in (CLASS_32, CLASS_64) or ident[5] not in (DATA_LSB, DATA_MSB):
        return None
    bits = 64 if ident[4] == CLASS_64 else 32
    order = "<" if ident[5] == DATA_LSB else ">"
    (machine,) = struct.unpack_from(order + "H", ident, 18)
    return ElfInfo(bits, machine, _soname(f, ident, _Layout(bits, order)))


def _soname(f: BinaryIO, ident: bytes, layout: _Layout) -> str | None:
    phoff, phentsize, phnum = layout.header(ident)
    if phnum == 0 or phentsize < layout.phdr_size or phentsize * phnum > MAX_HEADERS:
        return None
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    headers = [
        layout.phdr(table[i : i + phentsize])
        for i in range(0, len(table) - phentsize + 1, phentsize)
    ]
    loads = [(off, vaddr, size) for kind, off, vaddr, size in headers if kind == PT_LOAD]
    dynamic = next(((off, size) for kind, off, _, size in headers if kind == PT_DYNAMIC), None)
    if dynamic is None or dynamic[1] > MAX_DYNAMIC:
        return None
    f.seek(dynamic[0])
    raw = f.read(dynamic[1])
    strtab = soname = None
    step = struct.calcsize(layout.dyn)
    for i in range(0, len(raw) - step + 1, step):
        tag, value = struct.unpack_from(layout.dyn, raw, i)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag == DT_SONAME:
            soname = value
    if strtab is None or soname is None:
        return None
    # DT_STRTAB is an address in memory; the PT_LOAD segment holding it maps it to the file.
    base = next((off + strtab - va for off, va, size in loads if va <= strtab < va + size), None)
    if base is None:
        return None
    f.seek(base + soname)
    name = f.read(MAX_NAME).split(b"\0", 1)
    if len(name) < 2 or not name[0]:
        return None
    return name[0].decode("utf-8", "replace")
