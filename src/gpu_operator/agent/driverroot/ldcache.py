"""glibc's ``/etc/ld.so.cache``: the soname -> path table ldconfig writes, which is how the
dynamic loader (and nvidia-ctk) find libraries installed outside the standard directories.

Layout (glibc's ``sysdeps/generic/dl-cache.h``, little-endian on the machines we serve):

* optionally the old libc5 format first: ``"ld.so-1.7.0\\0"``, ``u32 nlibs``, ``nlibs`` entries of
  ``(i32 flags, u32 key, u32 value)``, padded to 8 bytes (glibc < 2.32 wrote both by default);
* the new format: ``"glibc-ld.so.cache" "1.1"``, ``u32 nlibs``, ``u32 len_strings``, 20 more
  header bytes (flags, extension offset, unused), then ``nlibs`` entries of
  ``(i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap)``; ``key`` (the soname) and
  ``value`` (the path) are offsets of NUL-terminated strings from the start of this header.

An entry's flags say its type (low byte, ``FLAG_ELF_LIBC6`` = 3) and its ABI (next byte):
``0x0300`` x86-64 and ``0x0a00`` aarch64 are the 64-bit libraries, ``0x0000`` is i386 and
``0x0800`` x32. Only 64-bit ones may be handed to a container, as nvidia-ctk does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

OLD_MAGIC = b"ld.so-1.7.0\0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
OLD_HEADER = struct.Struct("<12sI")
OLD_ENTRY = struct.Struct("<iII")
NEW_HEADER = struct.Struct("<20sII20x")
NEW_ENTRY = struct.Struct("<iIIIQ")

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF = 0x0001
FLAG_ARCH_MASK = 0xFF00
ARCH_64BIT = {
    0x0300: "x86_64",
    0x0A00: "aarch64",
}


@dataclass(frozen=True)
class CacheEntry:
    soname: str
    path: str  # as ldconfig saw it: inside the root the cache belongs to
    is_64bit: bool


def parse_ld_cache(data: bytes) -> tuple[CacheEntry, ...]:
    """The entries of a cache file, in file order; ValueError when it is not one."""
    start = 0
    if data.startswith(OLD_MAGIC):
        (_, old_count) = OLD_HEADER.unpack_from(data)
        start = OLD_HEADER.size + old_count * OLD_ENTRY.size
        start += -start % 8  # the new header is 8-byte aligned
    if data[start : start + len(NEW_MAGIC)] != NEW_MAGIC:
        raise ValueError("not a glibc ld.so.cache (no glibc-ld.so.cache1.1 header)")
    _, count, _ = NEW_HEADER.unpack_from(data, start)
    first = start + NEW_HEADER.size
    if first + count * NEW_ENTRY.size > len(data):
        raise ValueError(f"truncated ld.so.cache: {count} entries do not fit")
    entries: list[CacheEntry] = []
    for i in range(count):
        flags, key, value, _, _ = NEW_ENTRY.unpack_from(data, first + i * NEW_ENTRY.size)
        if not flags & FLAG_TYPE_MASK & FLAG_ELF:
            continue
        soname, path = _string(data, start + key), _string(data, start + value)
        if soname and path:
            entries.append(CacheEntry(soname, path, (flags & FLAG_ARCH_MASK) in ARCH_64BIT))
    return tuple(entries)


def read_ld_cache(path: str | Path) -> tuple[CacheEntry, ...]:
    """The cache's entries; none when the file is missing or is not a cache (a root need not
    have one: GKE's driver dir is not a system root)."""
    try:
        return parse_ld_cache(Path(path).read_bytes())
    except (OSError, ValueError, struct.error):
        return ()


def _string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        return ""
    return data[offset:end].decode("utf-8", "replace")
