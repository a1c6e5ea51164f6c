"""NVML's failures as typed errors: every pynvml call goes through :func:`call`, so what leaves
the adapter says what a caller can do about it (no driver, not supported, out of room...) and
which NVML function failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

T = TypeVar("T")


class NvmlError(Exception):
    """An NVML call failed; ``code`` is the NVML return code, ``function`` the call."""

    def __init__(self, code: int, function: str, message: str = "") -> None:
        self.code = code
        self.function = function
        text = message or _ERROR_TEXT.get(code, f"NVML error {code}")
        super().__init__(f"{function}: {text}")


class NvmlUnavailable(NvmlError):
    """No usable NVML: library missing, driver not loaded, or not initialised."""


class NotSupported(NvmlError):
    """The GPU or driver does not support this query or operation."""


class NoPermission(NvmlError):
    """The operation needs privileges the agent does not have."""


class InvalidArgument(NvmlError):
    """NVML rejected an argument (bad profile, bad placement, bad handle)."""


class NotFound(NvmlError):
    """The object (device, instance) does not exist."""


class InsufficientResources(NvmlError):
    """No room left: slices overlap or the profile's maximum count is reached."""


class InUse(NvmlError):
    """The GPU or instance is busy (processes running, instances still present)."""


class GpuLost(NvmlError):
    """The GPU fell off the bus."""


class ResetRequired(NvmlError):
    """The GPU must be reset before it can be used again."""


class InvalidState(NvmlError):
    """The GPU is in the wrong state for this operation (e.g. MIG disabled)."""


_ERROR_CLASSES: dict[int, type[NvmlError]] = {
    pynvml.NVML_ERROR_UNINITIALIZED: NvmlUnavailable,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: NvmlUnavailable,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: NvmlUnavailable,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: NvmlUnavailable,
    pynvml.NVML_ERROR_NOT_SUPPORTED: NotSupported,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: NotSupported,
    pynvml.NVML_ERROR_NO_PERMISSION: NoPermission,
    pynvml.NVML_ERROR_INVALID_ARGUMENT: InvalidArgument,
    pynvml.NVML_ERROR_NOT_FOUND: NotFound,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: InsufficientResources,
    pynvml.NVML_ERROR_IN_USE: InUse,
    pynvml.NVML_ERROR_GPU_IS_LOST: GpuLost,
    pynvml.NVML_ERROR_RESET_REQUIRED: ResetRequired,
    pynvml.NVML_ERROR_INVALID_STATE: InvalidState,
}

_ERROR_TEXT: dict[int, str] = {
    pynvml.NVML_ERROR_UNINITIALIZED: "NVML is not initialised",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 not found (is the NVIDIA driver installed?)"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML library and kernel driver versions differ",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "not supported by this GPU or driver",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "function not present in this NVML library",
    pynvml.NVML_ERROR_NO_PERMISSION: "insufficient permissions",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "invalid argument",
    pynvml.NVML_ERROR_NOT_FOUND: "not found",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "insufficient resources",
    pynvml.NVML_ERROR_IN_USE: "in use",
    pynvml.NVML_ERROR_GPU_IS_LOST: "the GPU is lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "the GPU requires a reset",
    pynvml.NVML_ERROR_INVALID_STATE: "invalid state",
    pynvml.NVML_ERROR_TIMEOUT: "timeout",
}


def error_for(code: int, function: str) -> NvmlError:
    """The typed error for an NVML return code."""
    return _ERROR_CLASSES.get(code, NvmlError)(code, function)


def call(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise error_for(int(exc.value), fn.__name__) from exc
    except pynvml.NVMLLibraryMismatchError as exc:
        raise NotSupported(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, fn.__name__, str(exc)) from exc


def optional(fn: Callable[..., T], *args: Any) -> T | None:
    """A metric read: ``None`` when the GPU does not support it."""
    try:
        return call(fn, *args)
    except (NotSupported, NoPermission, InvalidArgument, NotFound):
        return None
