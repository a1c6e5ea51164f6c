"""The one NVML adapter: pynvml in, typed inventory and metrics out.

Nothing above this module calls pynvml. Every NVML failure leaves here as an :class:`NvmlError`
subclass named for what the caller can do about it (no driver, not supported, out of room...),
with the NVML function that failed. Works the same against the real ``libnvidia-ml.so.1`` and
against :mod:`gpu_operator.agent.simulated`, which replaces the library under pynvml.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import pynvml

from gpu_operator.agent.inventory import (
    ComputeInstance,
    Engines,
    Gpu,
    GpuInstance,
    GpuMetrics,
    Inventory,
    MigDevice,
    MigMetrics,
    MigProfile,
    Placement,
    XidEvent,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
MIB = 1024 * 1024


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


def _call(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise error_for(int(exc.value), fn.__name__) from exc
    except pynvml.NVMLLibraryMismatchError as exc:
        raise NotSupported(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, fn.__name__, str(exc)) from exc


def _optional(fn: Callable[..., T], *args: Any) -> T | None:
    """A metric read: ``None`` when the GPU does not support it."""
    try:
        return _call(fn, *args)
    except (NotSupported, NoPermission, InvalidArgument, NotFound):
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


ARCHITECTURES: dict[int, str] = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "ada",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "blackwell",
}

# NVML brand codes as NVIDIA's DRA driver spells them in its ``brand`` attribute.
BRANDS: dict[int, str] = {
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GRID: "Grid",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
    pynvml.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC",
    pynvml.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
    pynvml.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS",
    pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
    pynvml.NVML_BRAND_QUADRO_RTX: "QuadroRTX",
    pynvml.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
    pynvml.NVML_BRAND_NVIDIA: "Nvidia",
    pynvml.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
    pynvml.NVML_BRAND_TITAN_RTX: "TitanRTX",
}

# Compute-instance profile index that spans a GPU instance of N compute slices.
FULL_CI_PROFILE: dict[int, int] = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}


# Compute slices of each compute-instance profile index (unknown indices are always asked).
CI_PROFILE_SLICES: dict[int, int] = {index: slices for slices, index in FULL_CI_PROFILE.items()} | {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1: 1
}


def mig_profile_name(nvml_name: str, slices: int, memory_mib: int) -> str:
    """``MIG 1g.5gb+me`` -> ``1g.5gb+me``; derived from size when NVML gives no name."""
    name = nvml_name.strip()
    if name.startswith("MIG "):
        name = name[4:]
    if name:
        return name
    return f"{slices}g.{-(-memory_mib // 1024)}gb"


class Nvml:
    """A session with NVML. Use as a context manager, or call :meth:`open` / :meth:`close`.

    Thread-safe: one lock serialises calls, so the exporter's collector thread and a caller
    asking for the inventory cannot interleave NVML calls.
    """

    def __init__(self, *, reset_command: Callable[[int], None] | None = None) -> None:
        self._lock = threading.RLock()
        self._open = False
        self._handles: dict[int, Any] = {}
        self._profile_cache: dict[int, tuple[MigProfile, ...]] = {}
        self._events: Any = None
        self._last_xid: dict[int, int] = {}
        self._reset_command = reset_command or _nvidia_smi_reset

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> Nvml:
        with self._lock:
            if not self._open:
                _call(pynvml.nvmlInit)
                self._open = True
                self._handles.clear()
                self._profile_cache.clear()
        return self

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            if self._events is not None:
                with suppress(NvmlError):
                    _call(pynvml.nvmlEventSetFree, self._events)
                self._events = None
            try:
                _call(pynvml.nvmlShutdown)
            finally:
                self._open = False
                self._handles.clear()

    def __enter__(self) -> Nvml:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _session(self) -> Iterator[None]:
        with self._lock:
            if not self._open:
                raise NvmlUnavailable(pynvml.NVML_ERROR_UNINITIALIZED, "Nvml", "call open() first")
            yield

    def _device(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = _call(pynvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    # -- inventory ---------------------------------------------------------------------------
    def device_count(self) -> int:
        with self._session():
            return int(_call(pynvml.nvmlDeviceGetCount))

    def inventory(self) -> Inventory:
        """Everything the agents need to know about the node's GPUs, read once."""
        with self._session():
            driver = _text(_call(pynvml.nvmlSystemGetDriverVersion))
            cuda = int(_call(pynvml.nvmlSystemGetCudaDriverVersion_v2))
            count = int(_call(pynvml.nvmlDeviceGetCount))
            gpus = tuple(self._gpu(i) for i in range(count))
            return Inventory(driver_version=driver, cuda_driver_version=cuda, gpus=gpus)

    def gpu(self, index: int) -> Gpu:
        with self._session():
            return self._gpu(index)

    def _gpu(self, index: int) -> Gpu:
        dev = self._device(index)
        pci = _call(pynvml.nvmlDeviceGetPciInfo, dev)
        major, minor = _call(pynvml.nvmlDeviceGetCudaComputeCapability, dev)
        arch = _optional(pynvml.nvmlDeviceGetArchitecture, dev)
        minor_number = _optional(pynvml.nvmlDeviceGetMinorNumber, dev)
        brand = _optional(pynvml.nvmlDeviceGetBrand, dev)
        memory = _call(pynvml.nvmlDeviceGetMemoryInfo, dev)
        mode = _optional(pynvml.nvmlDeviceGetMigMode, dev)
        capable = mode is not None
        current = bool(mode and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
        pending = bool(mode and mode[1] == pynvml.NVML_DEVICE_MIG_ENABLE)
        profiles: tuple[MigProfile, ...] = ()
        instances: tuple[GpuInstance, ...] = ()
        mig_devices: tuple[MigDevice, ...] = ()
        if capable:
            profiles = self._profiles(dev)
            if current:
                instances = self._gpu_instances(dev, profiles)
                mig_devices = self._mig_devices(index, dev, instances, profiles)
        return Gpu(
            index=index,
            name=_text(_call(pynvml.nvmlDeviceGetName, dev)),
            uuid=_text(_call(pynvml.nvmlDeviceGetUUID, dev)),
            pci_bus_id=_text(pci.busId),
            pci_device_id=int(pci.pciDeviceId),
            memory_mib=int(memory.total) // MIB,
            compute_major=int(major),
            compute_minor=int(minor),
            architecture=ARCHITECTURES.get(int(arch), "unknown") if arch is not None else "unknown",
            minor_number=int(minor_number) if minor_number is not None else index,
            brand=BRANDS.get(int(brand), "Unknown") if brand is not None else "Unknown",
            mig_capable=capable,
            mig_current=current,
            mig_pending=pending,
            mig_profiles=profiles,
            gpu_instances=instances,
            mig_devices=mig_devices,
        )

    def _profiles(self, dev: Any) -> tuple[MigProfile, ...]:
        """The GPU's GPU-instance profiles: fixed by the hardware, so read once per session."""
        key = ctypes.cast(dev, ctypes.c_void_p).value or 0
        cached = self._profile_cache.get(key)
        if cached:
            return cached
        found = self._read_profiles(dev)
        if found:
            self._profile_cache[key] = found
        return found

    def _read_profiles(self, dev: Any) -> tuple[MigProfile, ...]:
        found: list[MigProfile] = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = _optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, index)
            if info is None or info.instanceCount == 0:
                continue
            count = ctypes.c_uint(0)
            _call(
                pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
                dev,
                info.id,
                None,
                ctypes.byref(count),
            )
            array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            _call(
                pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
                dev,
                info.id,
                array,
                ctypes.byref(count),
            )
            placements = tuple(Placement(p.start, p.size) for p in array[: count.value])
            memory = int(info.memorySizeMB)
            found.append(
                MigProfile(
                    index=index,
                    id=int(info.id),
                    name=mig_profile_name(_text(info.name), int(info.sliceCount), memory),
                    memory_mib=memory,
                    slice_count=int(info.sliceCount),
                    max_count=int(info.instanceCount),
                    sm_count=int(info.multiprocessorCount),
                    engines=Engines(
                        copy=int(info.copyEngineCount),
                        decoder=int(info.decoderCount),
                        encoder=int(info.encoderCount),
                        jpeg=int(info.jpegCount),
                        ofa=int(info.ofaCount),
                    ),
                    placements=placements,
                )
            )
        return tuple(found)

    def _gi_handles(self, dev: Any, profile: MigProfile) -> list[Any]:
        array = (pynvml.c_nvmlGpuInstance_t * max(profile.max_count, 1))()
        count = ctypes.c_uint(0)
        _call(pynvml.nvmlDeviceGetGpuInstances, dev, profile.id, array, ctypes.byref(count))
        return list(array[: count.value])

    def _ci_handles(self, gi: Any, gi_slices: int = 8) -> list[tuple[Any, int, int]]:
        """(handle, profile index, slice count) of each compute instance in a GPU instance.

        Only profiles that fit the GPU instance are asked about: the others would just answer
        NOT_SUPPORTED, and on a 56-instance node those calls dominate an inventory read.
        """
        found: list[tuple[Any, int, int]] = []
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            if CI_PROFILE_SLICES.get(index, 0) > gi_slices:
                continue
            info = _optional(
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                index,
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            if info is None or info.instanceCount == 0:
                continue
            array = (pynvml.c_nvmlComputeInstance_t * info.instanceCount)()
            count = ctypes.c_uint(0)
            _call(
                pynvml.nvmlGpuInstanceGetComputeInstances, gi, info.id, array, ctypes.byref(count)
            )
            found.extend((h, index, int(info.sliceCount)) for h in array[: count.value])
        return found

    def _gpu_instances(self, dev: Any, profiles: tuple[MigProfile, ...]) -> tuple[GpuInstance, ...]:
        instances: list[GpuInstance] = []
        for profile in profiles:
            for gi in self._gi_handles(dev, profile):
                info = _call(pynvml.nvmlGpuInstanceGetInfo, gi)
                cis = []
                for ci, ci_index, slices in self._ci_handles(gi, profile.slice_count):
                    ci_info = _call(pynvml.nvmlComputeInstanceGetInfo, ci)
                    cis.append(ComputeInstance(int(ci_info.id), ci_index, slices))
                instances.append(
                    GpuInstance(
                        id=int(info.id),
                        profile=profile.name,
                        profile_index=profile.index,
                        placement=Placement(int(info.placement.start), int(info.placement.size)),
                        compute_instances=tuple(sorted(cis, key=lambda c: c.id)),
                    )
                )
        return tuple(sorted(instances, key=lambda g: g.id))

    def _mig_devices(
        self,
        gpu_index: int,
        dev: Any,
        instances: tuple[GpuInstance, ...],
        profiles: tuple[MigProfile, ...],
    ) -> tuple[MigDevice, ...]:
        by_id = {gi.id: gi for gi in instances}
        by_name = {p.name: p for p in profiles}
        found: list[MigDevice] = []
        for i in range(int(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, dev))):
            mig = _optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, dev, i)
            if mig is None:
                continue
            gi_id = int(_call(pynvml.nvmlDeviceGetGpuInstanceId, mig))
            ci_id = int(_call(pynvml.nvmlDeviceGetComputeInstanceId, mig))
            attrs = _call(pynvml.nvmlDeviceGetAttributes, mig)
            gi = by_id.get(gi_id)
            profile = gi.profile if gi else mig_profile_name("", attrs.gpuInstanceSliceCount, 0)
            engines = Engines(
                copy=int(attrs.sharedCopyEngineCount),
                decoder=int(attrs.sharedDecoderCount),
                encoder=int(attrs.sharedEncoderCount),
                jpeg=int(attrs.sharedJpegCount),
                ofa=int(attrs.sharedOfaCount),
            )
            found.append(
                MigDevice(
                    gpu_index=gpu_index,
                    gi_id=gi_id,
                    ci_id=ci_id,
                    uuid=_text(_call(pynvml.nvmlDeviceGetUUID, mig)),
                    profile=profile,
                    memory_mib=int(attrs.memorySizeMB),
                    sm_count=int(attrs.multiprocessorCount),
                    slices_gi=int(attrs.gpuInstanceSliceCount),
                    slices_ci=int(attrs.computeInstanceSliceCount),
                    engines=engines,
                    placement=gi.placement if gi else Placement(0, 0),
                )
            )
            if gi is None and profile not in by_name:
                log.warning("MIG device %s has no matching GPU instance", found[-1].uuid)
        return tuple(sorted(found, key=lambda m: (m.gi_id, m.ci_id)))

    # -- MIG changes -------------------------------------------------------------------------
    def set_mig_mode(self, index: int, enabled: bool) -> tuple[bool, bool]:
        """Request MIG on or off; returns (current, pending) after the request."""
        with self._session():
            dev = self._device(index)
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
            _call(pynvml.nvmlDeviceSetMigMode, dev, mode)
            current, pending = _call(pynvml.nvmlDeviceGetMigMode, dev)
            return (
                current == pynvml.NVML_DEVICE_MIG_ENABLE,
                pending == pynvml.NVML_DEVICE_MIG_ENABLE,
            )

    def reset_gpu(self, index: int) -> None:
        """Reset one GPU so a pending MIG mode takes effect (A100 needs this; H100 does not)."""
        with self._session():
            self._reset_command(index)
            self._handles.pop(index, None)

    def destroy_mig_instances(self, index: int) -> int:
        """Destroy every compute and GPU instance on a GPU; returns how many GIs went."""
        with self._session():
            dev = self._device(index)
            destroyed = 0
            for profile in self._profiles(dev):
                for gi in self._gi_handles(dev, profile):
                    for ci, _, _ in self._ci_handles(gi, profile.slice_count):
                        _call(pynvml.nvmlComputeInstanceDestroy, ci)
                    _call(pynvml.nvmlGpuInstanceDestroy, gi)
                    destroyed += 1
            return destroyed

    def create_gpu_instance(self, index: int, profile_index: int, placement: Placement) -> int:
        """Create one GPU instance of a profile at a placement; returns its GI id."""
        with self._session():
            dev = self._device(index)
            info = _call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, profile_index)
            where = pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
            gi = _call(
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, dev, info.id, ctypes.byref(where)
            )
            return int(_call(pynvml.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, index: int, gi_id: int, slices: int) -> int:
        """Create the compute instance spanning ``slices`` in a GPU instance; returns its id."""
        with self._session():
            dev = self._device(index)
            gi = _call(pynvml.nvmlDeviceGetGpuInstanceById, dev, gi_id)
            info = _call(
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                FULL_CI_PROFILE[slices],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            ci = _call(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, info.id)
            return int(_call(pynvml.nvmlComputeInstanceGetInfo, ci).id)

    # -- metrics -----------------------------------------------------------------------------
    def metrics(
        self, inventory: Inventory
    ) -> tuple[tuple[GpuMetrics, ...], tuple[MigMetrics, ...]]:
        """One reading of every GPU (and MIG device) in ``inventory``."""
        with self._session():
            self._poll_xids(inventory)
            gpus = tuple(self._gpu_metrics(gpu.index) for gpu in inventory.gpus)
            migs: list[MigMetrics] = []
            for gpu in inventory.gpus:
                if gpu.mig_devices:
                    migs.extend(self._mig_metrics(gpu))
            return gpus, tuple(migs)

    def _gpu_metrics(self, index: int) -> GpuMetrics:
        dev = self._device(index)
        util = _optional(pynvml.nvmlDeviceGetUtilizationRates, dev)
        enc = _optional(pynvml.nvmlDeviceGetEncoderUtilization, dev)
        dec = _optional(pynvml.nvmlDeviceGetDecoderUtilization, dev)
        memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, dev, pynvml.nvmlMemory_v2)
        rows = _optional(pynvml.nvmlDeviceGetRemappedRows, dev)
        power = _optional(pynvml.nvmlDeviceGetPowerUsage, dev)
        return GpuMetrics(
            index=index,
            sm_clock_mhz=_f(_optional(pynvml.nvmlDeviceGetClockInfo, dev, pynvml.NVML_CLOCK_SM)),
            mem_clock_mhz=_f(_optional(pynvml.nvmlDeviceGetClockInfo, dev, pynvml.NVML_CLOCK_MEM)),
            gpu_temp_c=_f(
                _optional(pynvml.nvmlDeviceGetTemperature, dev, pynvml.NVML_TEMPERATURE_GPU)
            ),
            memory_temp_c=self._memory_temp(dev),
            power_w=None if power is None else power / 1000.0,
            energy_mj=_f(_optional(pynvml.nvmlDeviceGetTotalEnergyConsumption, dev)),
            pcie_replay_count=_f(_optional(pynvml.nvmlDeviceGetPcieReplayCounter, dev)),
            gpu_util_pct=None if util is None else float(util.gpu),
            mem_copy_util_pct=None if util is None else float(util.memory),
            encoder_util_pct=None if enc is None else float(enc[0]),
            decoder_util_pct=None if dec is None else float(dec[0]),
            fb_free_mib=None if memory is None else memory.free / MIB,
            fb_used_mib=None if memory is None else memory.used / MIB,
            fb_reserved_mib=None if memory is None else memory.reserved / MIB,
            remapped_rows_correctable=None if rows is None else float(rows[0]),
            remapped_rows_uncorrectable=None if rows is None else float(rows[1]),
            row_remap_failure=None if rows is None else float(rows[3]),
            last_xid=float(self._last_xid.get(index, 0)) if self._events is not None else None,
        )

    def _memory_temp(self, dev: Any) -> float | None:
        values = _optional(pynvml.nvmlDeviceGetFieldValues, dev, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
        if not values or values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        return float(values[0].value.uiVal)

    def _mig_metrics(self, gpu: Gpu) -> list[MigMetrics]:
        dev = self._device(gpu.index)
        found: list[MigMetrics] = []
        for i in range(int(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, dev))):
            mig = _optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, dev, i)
            if mig is None:
                continue
            memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, mig, pynvml.nvmlMemory_v2)
            found.append(
                MigMetrics(
                    gpu_index=gpu.index,
                    gi_id=int(_call(pynvml.nvmlDeviceGetGpuInstanceId, mig)),
                    ci_id=int(_call(pynvml.nvmlDeviceGetComputeInstanceId, mig)),
                    fb_free_mib=None if memory is None else memory.free / MIB,
                    fb_used_mib=None if memory is None else memory.used / MIB,
                    fb_reserved_mib=None if memory is None else memory.reserved / MIB,
                )
            )
        return found

    def _poll_xids(self, inventory: Inventory) -> None:
        """Drain pending XID events without blocking; remember the last one per GPU."""
        for event in self._drain_xids([gpu.index for gpu in inventory.gpus], 0):
            self._last_xid[event.gpu_index] = event.xid

    def xid_events(self, gpu_indexes: Sequence[int], timeout_ms: int = 0) -> list[XidEvent]:
        """The XID critical errors of these GPUs since the last call, waiting up to
        ``timeout_ms`` for the first; empty when none came or the GPUs cannot report events.
        Holds the NVML lock while it waits: keep ``timeout_ms`` short."""
        with self._session():
            return self._drain_xids(gpu_indexes, timeout_ms)

    def _drain_xids(self, gpu_indexes: Sequence[int], timeout_ms: int) -> list[XidEvent]:
        if not self._event_set(gpu_indexes):
            return []
        found: list[XidEvent] = []
        wait = timeout_ms
        while True:
            try:
                data = _call(pynvml.nvmlEventSetWait, self._events, wait)
            except NvmlError:
                return found  # NVML_ERROR_TIMEOUT: nothing (more) pending
            wait = 0
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            index = _optional(pynvml.nvmlDeviceGetIndex, data.device)
            if index is None:
                continue
            gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
            found.append(
                XidEvent(
                    gpu_index=int(index),
                    xid=int(data.eventData),
                    gi_id=None if gi == _WHOLE_GPU else gi,
                    ci_id=None if ci == _WHOLE_GPU else ci,
                )
            )

    def _event_set(self, gpu_indexes: Sequence[int]) -> bool:
        """Create the XID event set on first use; False when no GPU can report events."""
        if self._events is not None:
            return True
        events = _optional(pynvml.nvmlEventSetCreate)
        if events is None:
            return False
        registered = 0
        for index in gpu_indexes:
            try:
                _call(
                    pynvml.nvmlDeviceRegisterEvents,
                    self._device(index),
                    pynvml.nvmlEventTypeXidCriticalError,
                    events,
                )
                registered += 1
            except NvmlError:
                continue
        if not registered:
            _optional(pynvml.nvmlEventSetFree, events)
            return False
        self._events = events
        return True


_WHOLE_GPU = 0xFFFFFFFF  # NVML's GPU/compute instance id of an event about the whole GPU


def _f(value: float | None) -> float | None:
    return None if value is None else float(value)


def _nvidia_smi_reset(index: int) -> None:
    """Reset a GPU; the simulated library offers a hook so simulated nodes need no nvidia-smi."""
    hook = getattr(pynvml.nvmlLib, "simulated_gpu_reset", None)
    if callable(hook):
        hook(index)
        return
    subprocess.run(["nvidia-smi", "--gpu-reset", "-i", str(index)], check=True)


def probe() -> Inventory:
    """Open NVML, read the inventory, close: what a one-shot agent needs."""
    with Nvml() as nvml:
        return nvml.inventory()
