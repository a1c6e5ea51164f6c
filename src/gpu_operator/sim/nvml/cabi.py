"""The ctypes side of the simulated library: reading pynvml's arguments, writing its results.

pynvml passes out-parameters as ``byref(x)``, strings as a buffer and its length, arrays of
structs, and opaque handles (pointers). A simulated handle is not a pointer to memory: it packs
what it names into the pointer value, ``kind << 48 | gpu << 32 | gpu instance << 16 | compute
instance``, so nothing has to stay alive for it and a stale handle is detected by lookup.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from enum import IntEnum
from typing import Any, TypeVar, cast

import pynvml

from .devices import NvmlFault

_CArg = type(ctypes.byref(ctypes.c_int()))

EntryPoint = Callable[..., Any]
"""A simulated C function: ``(node, *C arguments)``, returns None (success), a code or a value."""
_E = TypeVar("_E", bound=EntryPoint)


class Kind(IntEnum):
    """What a handle names."""

    DEVICE = 1
    MIG_DEVICE = 2
    GPU_INSTANCE = 3
    COMPUTE_INSTANCE = 4
    EVENT_SET = 5


class EntryPoints(dict[str, EntryPoint]):
    """A table of simulated C functions by name."""

    def add(self, fn: _E) -> _E:
        """Decorator: add ``fn`` under its own name, which is the C function's."""
        assert fn.__name__ not in self, fn.__name__
        self[fn.__name__] = fn
        return fn


def pack_handle(kind: Kind, gpu: int = 0, gi: int = 0, ci: int = 0) -> int:
    return (kind << 48) | (gpu << 32) | (gi << 16) | ci


def unpack_handle(value: Any) -> tuple[int, int, int, int]:
    """(kind, gpu, gpu instance, compute instance) of a handle argument."""
    obj = target(value)
    raw = obj if isinstance(obj, int) else ctypes.cast(obj, ctypes.c_void_p).value
    if not raw:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return raw >> 48, (raw >> 32) & 0xFFFF, (raw >> 16) & 0xFFFF, raw & 0xFFFF


def target(value: Any) -> Any:
    """What a ``byref(x)`` argument points at (or the argument itself)."""
    return cast(Any, value)._obj if isinstance(value, _CArg) else value


def dest(ref: Any) -> Any:
    """What an out-parameter points at, to write into; NULL is NVML's invalid argument."""
    if ref is None:
        raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return target(ref)


def as_int(value: Any) -> int:
    obj = target(value)
    return int(obj.value) if hasattr(obj, "value") else int(obj)


def store_handle(into: Any, value: int, position: int = 0) -> None:
    """Write a handle at pointer slot ``position`` of a struct or an array of handles."""
    size = ctypes.sizeof(ctypes.c_void_p)
    ctypes.c_void_p.from_buffer(into, position * size).value = value


def store_text(buffer: Any, length: Any, text: str) -> None:
    data = text.encode()
    buf = dest(buffer)
    if len(data) + 1 > min(len(buf), as_int(length)):
        raise NvmlFault(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    buf.value = data
