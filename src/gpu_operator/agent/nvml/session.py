"""The NVML session: typed inventory, MIG operations, metrics and XID events over pynvml.

Nothing above this package calls pynvml. Works the same against the real ``libnvidia-ml.so.1``
(loaded from the driver root by :mod:`.loader`) and against the simulated library
(:mod:`gpu_operator.sim.nvml`), which replaces the library under pynvml.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

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

from .errors import (
    NotSupported,
    NvmlError,
    NvmlUnavailable,
    call,
    optional,
)
from .fabric import NO_FABRIC, GpuFabric, from_nvml
from .health import HealthReading, read_health, running_pids
from .loader import load_nvml
from .names import ARCHITECTURES, BRANDS, CI_PROFILE_SLICES, FULL_CI_PROFILE, mig_profile_name, text

log = logging.getLogger(__name__)

MIB = 1024 * 1024


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
        # Every handle ever handed out -> its GPU (kept when a lost GPU's handle is dropped).
        self._handle_index: dict[int | None, int] = {}
        self._reset_command = reset_command or _nvidia_smi_reset

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> Nvml:
        with self._lock:
            if not self._open:
                load_nvml()
                call(pynvml.nvmlInit)
                self._open = True
                self._handles.clear()
                self._handle_index.clear()
                self._profile_cache.clear()
        return self

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            if self._events is not None:
                with suppress(NvmlError):
                    call(pynvml.nvmlEventSetFree, self._events)
                self._events = None
            try:
                call(pynvml.nvmlShutdown)
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
            handle = call(pynvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
            self._handle_index[_address(handle)] = index
        return handle

    # -- inventory ---------------------------------------------------------------------------
    def device_count(self) -> int:
        with self._session():
            return int(call(pynvml.nvmlDeviceGetCount))

    def inventory(self) -> Inventory:
        """Everything the agents need to know about the node's GPUs, read once."""
        with self._session():
            driver = text(call(pynvml.nvmlSystemGetDriverVersion))
            cuda = int(call(pynvml.nvmlSystemGetCudaDriverVersion_v2))
            count = int(call(pynvml.nvmlDeviceGetCount))
            gpus = tuple(self._gpu(i) for i in range(count))
            return Inventory(driver_version=driver, cuda_driver_version=cuda, gpus=gpus)

    def gpu(self, index: int) -> Gpu:
        with self._session():
            return self._gpu(index)

    def _gpu(self, index: int) -> Gpu:
        dev = self._device(index)
        pci = call(pynvml.nvmlDeviceGetPciInfo, dev)
        major, minor = call(pynvml.nvmlDeviceGetCudaComputeCapability, dev)
        arch = optional(pynvml.nvmlDeviceGetArchitecture, dev)
        minor_number = optional(pynvml.nvmlDeviceGetMinorNumber, dev)
        brand = optional(pynvml.nvmlDeviceGetBrand, dev)
        memory = call(pynvml.nvmlDeviceGetMemoryInfo, dev)
        mode = optional(pynvml.nvmlDeviceGetMigMode, dev)
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
            name=text(call(pynvml.nvmlDeviceGetName, dev)),
            uuid=text(call(pynvml.nvmlDeviceGetUUID, dev)),
            pci_bus_id=text(pci.busId),
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
            info = optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, index)
            if info is None or info.instanceCount == 0:
                continue
            count = ctypes.c_uint(0)
            call(
                pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
                dev,
                info.id,
                None,
                ctypes.byref(count),
            )
            array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            call(
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
                    name=mig_profile_name(text(info.name), int(info.sliceCount), memory),
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
        call(pynvml.nvmlDeviceGetGpuInstances, dev, profile.id, array, ctypes.byref(count))
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
            info = optional(
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                index,
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            if info is None or info.instanceCount == 0:
                continue
            array = (pynvml.c_nvmlComputeInstance_t * info.instanceCount)()
            count = ctypes.c_uint(0)
            call(pynvml.nvmlGpuInstanceGetComputeInstances, gi, info.id, array, ctypes.byref(count))
            found.extend((h, index, int(info.sliceCount)) for h in array[: count.value])
        return found

    def _gpu_instances(self, dev: Any, profiles: tuple[MigProfile, ...]) -> tuple[GpuInstance, ...]:
        instances: list[GpuInstance] = []
        for profile in profiles:
            for gi in self._gi_handles(dev, profile):
                info = call(pynvml.nvmlGpuInstanceGetInfo, gi)
                cis = []
                for ci, ci_index, slices in self._ci_handles(gi, profile.slice_count):
                    ci_info = call(pynvml.nvmlComputeInstanceGetInfo, ci)
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
        for i in range(int(call(pynvml.nvmlDeviceGetMaxMigDeviceCount, dev))):
            mig = optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, dev, i)
            if mig is None:
                continue
            gi_id = int(call(pynvml.nvmlDeviceGetGpuInstanceId, mig))
            ci_id = int(call(pynvml.nvmlDeviceGetComputeInstanceId, mig))
            attrs = call(pynvml.nvmlDeviceGetAttributes, mig)
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
                    uuid=text(call(pynvml.nvmlDeviceGetUUID, mig)),
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

    # -- NVLink fabric ----------------------------------------------------------------------
    def gpu_fabric(self, index: int) -> GpuFabric | None:
        """GPU ``index``'s NVLink fabric info (``nvmlDeviceGetGpuFabricInfoV``, else the older
        ``nvmlDeviceGetGpuFabricInfo``): :data:`~.fabric.NO_FABRIC` when the GPU has none, None
        when the driver has neither call. Other NVML failures raise."""
        with self._session():
            dev = self._device(index)
            calls: tuple[tuple[Callable[..., Any], Any], ...] = (
                (pynvml.nvmlDeviceGetGpuFabricInfoV, pynvml.c_nvmlGpuFabricInfo_v2_t()),
                (pynvml.nvmlDeviceGetGpuFabricInfo, pynvml.c_nvmlGpuFabricInfo_t()),
            )
            for fn, info in calls:
                try:
                    call(fn, dev, ctypes.byref(info))
                except NotSupported as exc:
                    if exc.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                        continue  # an older driver: try the older call
                    return NO_FABRIC
                return from_nvml(info.clusterUuid, info.cliqueId, info.state, info.status)
            return None

    def gpu_fabrics(self) -> tuple[GpuFabric | None, ...]:
        """:meth:`gpu_fabric` of every GPU, in index order: what
        :func:`~.fabric.node_clique` takes."""
        with self._session():
            return tuple(self.gpu_fabric(i) for i in range(int(call(pynvml.nvmlDeviceGetCount))))

    # -- health ------------------------------------------------------------------------------
    def health_readings(self, inventory: Inventory) -> tuple[HealthReading, ...]:
        """One health reading of every GPU in ``inventory`` (see :mod:`.health`)."""
        with self._session():
            found = tuple(read_health(self._device, g.index, g.uuid) for g in inventory.gpus)
            for reading in found:
                if reading.error is not None:  # look the GPU up afresh next time
                    self._handles.pop(reading.index, None)
            return found

    def gpu_processes(self, index: int) -> tuple[int, ...] | None:
        """The pids of the compute and graphics processes on a GPU; None: unknown."""
        with self._session():
            try:
                dev = self._device(index)
            except NvmlError:
                return None
            return running_pids(dev)

    # -- MIG changes -------------------------------------------------------------------------
    def set_mig_mode(self, index: int, enabled: bool) -> tuple[bool, bool]:
        """Request MIG on or off; returns (current, pending) after the request."""
        with self._session():
            dev = self._device(index)
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
            call(pynvml.nvmlDeviceSetMigMode, dev, mode)
            current, pending = call(pynvml.nvmlDeviceGetMigMode, dev)
            return (
                current == pynvml.NVML_DEVICE_MIG_ENABLE,
                pending == pynvml.NVML_DEVICE_MIG_ENABLE,
            )

    def reset_gpu(self, index: int) -> None:
        """Reset one GPU: a pending MIG mode takes effect (A100 needs this; H100 does not), and
        an unhealthy GPU may recover."""
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
                        call(pynvml.nvmlComputeInstanceDestroy, ci)
                    call(pynvml.nvmlGpuInstanceDestroy, gi)
                    destroyed += 1
            return destroyed

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy one GPU instance of a GPU, its compute instances first."""
        with self._session():
            gi = call(pynvml.nvmlDeviceGetGpuInstanceById, self._device(index), gi_id)
            for ci, _, _ in self._ci_handles(gi):
                call(pynvml.nvmlComputeInstanceDestroy, ci)
            call(pynvml.nvmlGpuInstanceDestroy, gi)

    def create_gpu_instance(self, index: int, profile_index: int, placement: Placement) -> int:
        """Create one GPU instance of a profile at a placement; returns its GI id."""
        with self._session():
            dev = self._device(index)
            info = call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev, profile_index)
            where = pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
            gi = call(
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement, dev, info.id, ctypes.byref(where)
            )
            return int(call(pynvml.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, index: int, gi_id: int, slices: int) -> int:
        """Create the compute instance spanning ``slices`` in a GPU instance; returns its id."""
        with self._session():
            dev = self._device(index)
            gi = call(pynvml.nvmlDeviceGetGpuInstanceById, dev, gi_id)
            info = call(
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                FULL_CI_PROFILE[slices],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            ci = call(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, info.id)
            return int(call(pynvml.nvmlComputeInstanceGetInfo, ci).id)

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
        util = optional(pynvml.nvmlDeviceGetUtilizationRates, dev)
        enc = optional(pynvml.nvmlDeviceGetEncoderUtilization, dev)
        dec = optional(pynvml.nvmlDeviceGetDecoderUtilization, dev)
        memory = optional(pynvml.nvmlDeviceGetMemoryInfo, dev, pynvml.nvmlMemory_v2)
        rows = optional(pynvml.nvmlDeviceGetRemappedRows, dev)
        power = optional(pynvml.nvmlDeviceGetPowerUsage, dev)
        return GpuMetrics(
            index=index,
            sm_clock_mhz=_f(optional(pynvml.nvmlDeviceGetClockInfo, dev, pynvml.NVML_CLOCK_SM)),
            mem_clock_mhz=_f(optional(pynvml.nvmlDeviceGetClockInfo, dev, pynvml.NVML_CLOCK_MEM)),
            gpu_temp_c=_f(
                optional(pynvml.nvmlDeviceGetTemperature, dev, pynvml.NVML_TEMPERATURE_GPU)
            ),
            memory_temp_c=self._memory_temp(dev),
            power_w=None if power is None else power / 1000.0,
            energy_mj=_f(optional(pynvml.nvmlDeviceGetTotalEnergyConsumption, dev)),
            pcie_replay_count=_f(optional(pynvml.nvmlDeviceGetPcieReplayCounter, dev)),
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
        values = optional(pynvml.nvmlDeviceGetFieldValues, dev, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
        if not values or values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        return float(values[0].value.uiVal)

    def _mig_metrics(self, gpu: Gpu) -> list[MigMetrics]:
        dev = self._device(gpu.index)
        found: list[MigMetrics] = []
        for i in range(int(call(pynvml.nvmlDeviceGetMaxMigDeviceCount, dev))):
            mig = optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, dev, i)
            if mig is None:
                continue
            memory = optional(pynvml.nvmlDeviceGetMemoryInfo, mig, pynvml.nvmlMemory_v2)
            found.append(
                MigMetrics(
                    gpu_index=gpu.index,
                    gi_id=int(call(pynvml.nvmlDeviceGetGpuInstanceId, mig)),
                    ci_id=int(call(pynvml.nvmlDeviceGetComputeInstanceId, mig)),
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
                data = call(pynvml.nvmlEventSetWait, self._events, wait)
            except NvmlError:
                return found  # NVML_ERROR_TIMEOUT: nothing (more) pending
            wait = 0
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            index = self._event_gpu(data.device)
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

    def _event_gpu(self, device: Any) -> int | None:
        """The index of the GPU an event is about. A GPU that fell off the bus (XID 79) no
        longer answers nvmlDeviceGetIndex: its handle is matched against the ones handed out."""
        try:
            return int(call(pynvml.nvmlDeviceGetIndex, device))
        except NvmlError:
            return self._handle_index.get(_address(device))

    def _event_set(self, gpu_indexes: Sequence[int]) -> bool:
        """Create the XID event set on first use; False when no GPU can report events."""
        if self._events is not None:
            return True
        events = optional(pynvml.nvmlEventSetCreate)
        if events is None:
            return False
        registered = 0
        for index in gpu_indexes:
            try:
                call(
                    pynvml.nvmlDeviceRegisterEvents,
                    self._device(index),
                    pynvml.nvmlEventTypeXidCriticalError,
                    events,
                )
                registered += 1
            except NvmlError:
                continue
        if not registered:
            optional(pynvml.nvmlEventSetFree, events)
            return False
        self._events = events
        return True


_WHOLE_GPU = 0xFFFFFFFF  # NVML's GPU/compute instance id of an event about the whole GPU


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


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
