"""A simulated NVML at the ctypes boundary, so the real pynvml wrappers run without a GPU.

pynvml resolves every C function by name on ``pynvml.nvmlLib`` and calls it with ctypes
arguments (``byref`` out-parameters, string buffers, struct arrays, opaque handle pointers),
turning a non-zero return code into ``NVMLError``. :func:`install_simulated_nvml` puts a
:class:`SimulatedNvml` library object there; ``nvmlInit`` then finds a library already loaded
and never touches ``libnvidia-ml.so.1``.

The simulation is stateful and follows the hardware's rules: MIG mode set/pending, GPU
instances placed on memory slices (overlap or a full profile fails with
``NVML_ERROR_INSUFFICIENT_RESOURCES``), compute instances inside them, destroy. MIG mode
changes follow the GPU profile: ``mode_change: immediate`` (Hopper) applies at once,
``mode_change: reset`` (A100) stays pending until the GPU is reset (``nvidia-smi --gpu-reset``;
here :meth:`SimulatedNvml.reset_gpu`, which :class:`~gpu_operator.agent.nvml.Nvml` calls).
A reset also destroys every GPU instance, as on hardware.

Several processes can share one simulated node's MIG state through a JSON state file
(``state_file=`` or ``GPU_OPERATOR_SIMULATE_STATE``), e.g. the MIG manager and discovery.
Metric readings vary smoothly with time; energy is their integral, so it only grows.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import math
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

import pynvml
import yaml

ENV_SIMULATE = "GPU_OPERATOR_SIMULATE"
ENV_STATE = "GPU_OPERATOR_SIMULATE_STATE"
DEFAULT_DRIVER = "580.95.05"
DEFAULT_CUDA = 13000  # the 580 branch ships CUDA 13.0

SUCCESS = pynvml.NVML_SUCCESS
ARCH_CODES = {
    "kepler": pynvml.NVML_DEVICE_ARCH_KEPLER,
    "maxwell": pynvml.NVML_DEVICE_ARCH_MAXWELL,
    "pascal": pynvml.NVML_DEVICE_ARCH_PASCAL,
    "volta": pynvml.NVML_DEVICE_ARCH_VOLTA,
    "turing": pynvml.NVML_DEVICE_ARCH_TURING,
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "ada": pynvml.NVML_DEVICE_ARCH_ADA,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}
# compute-instance profile index -> compute slices
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
# PCI bus numbers of the eight GPUs in a DGX A100/H100, in NVML index order
DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)

_KIND_DEVICE, _KIND_MIG, _KIND_GI, _KIND_CI, _KIND_EVENTS = 1, 2, 3, 4, 5
_CArg = type(ctypes.byref(ctypes.c_int()))


class SimulationError(ValueError):
    """A bad simulation spec (unknown profile, malformed count)."""


# -- GPU models --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GiProfileSpec:
    index: int
    id: int
    name: str
    memory_mib: int
    slices: int
    max: int
    sms: int
    engines: dict[str, int]
    starts: tuple[int, ...]
    size: int


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str
    pci_device_id: int
    pci_subsystem_id: int
    memory_mib: int
    memory_reserved_mib: int
    compute_capability: tuple[int, int]
    architecture: str
    multiprocessors: int
    clocks: dict[str, int]
    power: dict[str, int]
    temperature: dict[str, int]
    memory_temperature: bool
    row_remapping: bool
    encoder: bool
    mig_mode_change: str | None = None  # None: not MIG capable
    compute_slices: int = 0
    memory_slices: int = 0
    gi_profiles: tuple[GiProfileSpec, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return self.mig_mode_change is not None

    def gi_profile(
        self, *, index: int | None = None, id: int | None = None
    ) -> GiProfileSpec | None:
        for p in self.gi_profiles:
            if (index is not None and p.index == index) or (id is not None and p.id == id):
                return p
        return None


def available_profiles() -> list[str]:
    """Names accepted in a simulation spec (``a100-40gb``, ``h100-80gb``, ``t4``...)."""
    folder = resources.files("gpu_operator.agent") / "profiles"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_model(key: str) -> GpuModel:
    path = resources.files("gpu_operator.agent") / "profiles" / f"{key}.yaml"
    if not path.is_file():
        raise SimulationError(
            f"unknown simulated GPU profile {key!r}; known: {', '.join(available_profiles())}"
        )
    doc = yaml.safe_load(path.read_text())
    mig = doc.get("mig") or {}
    return GpuModel(
        key=key,
        name=doc["name"],
        pci_device_id=int(doc["pci_device_id"]),
        pci_subsystem_id=int(doc["pci_subsystem_id"]),
        memory_mib=int(doc["memory_mib"]),
        memory_reserved_mib=int(doc["memory_reserved_mib"]),
        compute_capability=(int(doc["compute_capability"][0]), int(doc["compute_capability"][1])),
        architecture=doc["architecture"],
        multiprocessors=int(doc["multiprocessors"]),
        clocks=dict(doc["clocks"]),
        power=dict(doc["power"]),
        temperature=dict(doc["temperature"]),
        memory_temperature=bool(doc["memory_temperature"]),
        row_remapping=bool(doc["row_remapping"]),
        encoder=bool(doc["encoder"]),
        mig_mode_change=mig.get("mode_change"),
        compute_slices=int(mig.get("compute_slices", 0)),
        memory_slices=int(mig.get("memory_slices", 0)),
        gi_profiles=tuple(
            GiProfileSpec(
                index=int(p["index"]),
                id=int(p["id"]),
                name=p["name"],
                memory_mib=int(p["memory_mib"]),
                slices=int(p["slices"]),
                max=int(p["max"]),
                sms=int(p["sms"]),
                engines=dict(p["engines"]),
                starts=tuple(int(s) for s in p["starts"]),
                size=int(p["size"]),
            )
            for p in mig.get("gpu_instance_profiles", ())
        ),
    )


def parse_spec(spec: str | Sequence[str]) -> list[GpuModel]:
    """``"a100-40gb:8"``, ``"a100-40gb:4,t4:2"`` or ``["h100-80gb:8"]`` -> one model per GPU."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    models: list[GpuModel] = []
    cache: dict[str, GpuModel] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        key, _, count_text = item.partition(":")
        try:
            count = int(count_text) if count_text else 1
        except ValueError:
            raise SimulationError(f"bad GPU count in {item!r}: expected PROFILE:COUNT") from None
        if count < 0:
            raise SimulationError(f"negative GPU count in {item!r}")
        model = cache.get(key) or load_model(key)
        cache[key] = model
        models.extend([model] * count)
    return models


# -- state -------------------------------------------------------------------------------------
@dataclass
class SimCi:
    id: int
    profile_index: int

    @property
    def slices(self) -> int:
        return CI_SLICES[self.profile_index]


@dataclass
class SimGi:
    id: int
    profile_index: int
    start: int
    size: int
    cis: list[SimCi] = field(default_factory=list)


@dataclass
class SimGpu:
    index: int
    model: GpuModel
    uuid: str
    bus: int
    mig_current: bool = False
    mig_pending: bool = False
    gis: list[SimGi] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)

    def gi(self, gi_id: int) -> SimGi | None:
        return next((g for g in self.gis if g.id == gi_id), None)

    def profile_of(self, gi: SimGi) -> GiProfileSpec:
        profile = self.model.gi_profile(index=gi.profile_index)
        assert profile is not None
        return profile

    def mig_devices(self) -> list[tuple[SimGi, SimCi]]:
        return [(gi, ci) for gi in sorted(self.gis, key=lambda g: g.id) for ci in gi.cis]


class _Code(Exception):
    """Raised inside a simulated C function to return an NVML error code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _target(value: Any) -> Any:
    """What a ``byref(x)`` argument points at (or the argument itself)."""
    return cast(Any, value)._obj if isinstance(value, _CArg) else value


def _handle(kind: int, gpu: int = 0, gi: int = 0, ci: int = 0) -> int:
    return (kind << 48) | (gpu << 32) | (gi << 16) | ci


def _unpack(value: Any) -> tuple[int, int, int, int]:
    obj = _target(value)
    raw = obj if isinstance(obj, int) else ctypes.cast(obj, ctypes.c_void_p).value
    if not raw:
        raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return raw >> 48, (raw >> 32) & 0xFFFF, (raw >> 16) & 0xFFFF, raw & 0xFFFF


def _out(ref: Any) -> Any:
    if ref is None:
        raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return _target(ref)


def _int(value: Any) -> int:
    obj = _target(value)
    return int(obj.value) if hasattr(obj, "value") else int(obj)


def _store_handle(target: Any, value: int, position: int = 0) -> None:
    size = ctypes.sizeof(ctypes.c_void_p)
    ctypes.c_void_p.from_buffer(target, position * size).value = value


def _store_text(buffer: Any, length: Any, text: str) -> None:
    data = text.encode()
    buf = _out(buffer)
    if len(data) + 1 > min(len(buf), _int(length)):
        raise _Code(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    buf.value = data


class _CFunction:
    """One simulated C entry point; a plain object so pynvml may set ``restype`` on it."""

    def __init__(self, sim: SimulatedNvml, name: str, impl: Callable[..., Any]) -> None:
        self.name = name
        self._sim = sim
        self._impl = impl
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._sim._invoke(self.name, self._impl, args)


_NO_INIT_NEEDED = {"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlErrorString"}


class SimulatedNvml:
    """The fake ``libnvidia-ml``: install with :func:`install_simulated_nvml`.

    Tests use :meth:`fail` to make a named C function return an NVML error code, ``calls`` to
    count C calls (e.g. no GPU-instance create/destroy on a re-apply), :meth:`inject_xid`.
    """

    def __init__(
        self,
        models: Sequence[GpuModel],
        *,
        driver_version: str = DEFAULT_DRIVER,
        cuda_version: int = DEFAULT_CUDA,
        state_file: str | Path | None = None,
        seed: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        node = seed if seed is not None else os.environ.get("NODE_NAME") or os.uname().nodename
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.gpus = [
            SimGpu(
                index=i,
                model=m,
                uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"sim/{node}/{i}/{m.key}")),
                bus=DGX_BUSES[i] if i < len(DGX_BUSES) else 0x10 + i,
            )
            for i, m in enumerate(models)
        ]
        self.calls: Counter[str] = Counter()
        self._failures: dict[str, tuple[int, int | None]] = {}
        self._init_count = 0
        self._lock = threading.RLock()
        self._clock = clock
        self._t0 = clock()
        self._boot_energy = [1_000_000_000.0 + 7_000_000.0 * i for i in range(len(models))]
        self._state_file = Path(state_file) if state_file else None
        self._state_seen: tuple[int, int] | None = None
        self._event_sets: dict[int, set[int]] = {}
        self._functions: dict[str, _CFunction] = {}
        if self._state_file is not None:
            with self._mutate():
                pass  # load existing state, or write the initial one

    # -- the library surface pynvml sees -----------------------------------------------------
    def __getattr__(self, name: str) -> _CFunction:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        impl = getattr(type(self), "_c_" + name, None)
        if impl is None:
            raise AttributeError(name)  # pynvml turns this into NVML_ERROR_FUNCTION_NOT_FOUND
        fn = self._functions.get(name)
        if fn is None:
            fn = _CFunction(self, name, impl.__get__(self))
            self._functions[name] = fn
        return fn

    def _invoke(self, name: str, impl: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        with self._lock:
            self.calls[name] += 1
            failure = self._failure_for(name)
            if failure is not None:
                return failure
            if name not in _NO_INIT_NEEDED and self._init_count == 0:
                return pynvml.NVML_ERROR_UNINITIALIZED
            try:
                result = impl(*args)
            except _Code as code:
                return code.code
            return SUCCESS if result is None else result

    def _failure_for(self, name: str) -> int | None:
        for key in (name, name.split("_v")[0], name.rstrip("V")):
            entry = self._failures.get(key)
            if entry is None:
                continue
            code, times = entry
            if times is not None:
                if times <= 1:
                    del self._failures[key]
                else:
                    self._failures[key] = (code, times - 1)
            return code
        return None

    # -- test controls -----------------------------------------------------------------------
    def fail(self, function: str, code: int, *, times: int | None = None) -> None:
        """Make C function ``function`` (e.g. ``nvmlDeviceGetPowerUsage``) return ``code``."""
        self._failures[function] = (code, times)

    def clear_failures(self) -> None:
        self._failures.clear()

    def inject_xid(self, index: int, xid: int) -> None:
        with self._lock:
            self.gpus[index].xids.append(xid)

    def simulated_gpu_reset(self, index: int) -> None:
        """What ``nvidia-smi --gpu-reset`` does: pending MIG mode applies, instances go."""
        self.reset_gpu(index)

    def reset_gpu(self, index: int) -> None:
        with self._lock, self._mutate():
            gpu = self.gpus[index]
            gpu.mig_current = gpu.mig_pending
            gpu.gis.clear()

    # -- shared state file -------------------------------------------------------------------
    def _dump(self) -> dict[str, Any]:
        return {
            "gpus": [
                {
                    "model": g.model.key,
                    "mig_current": g.mig_current,
                    "mig_pending": g.mig_pending,
                    "gis": [
                        {
                            "id": gi.id,
                            "profile_index": gi.profile_index,
                            "start": gi.start,
                            "size": gi.size,
                            "cis": [{"id": c.id, "profile_index": c.profile_index} for c in gi.cis],
                        }
                        for gi in g.gis
                    ],
                }
                for g in self.gpus
            ]
        }

    def _load(self, doc: dict[str, Any]) -> None:
        saved = doc.get("gpus", [])
        if [g.get("model") for g in saved] != [g.model.key for g in self.gpus]:
            return  # a different node layout: keep ours, it will overwrite the file
        for gpu, state in zip(self.gpus, saved, strict=True):
            gpu.mig_current = bool(state["mig_current"])
            gpu.mig_pending = bool(state["mig_pending"])
            gpu.gis = [
                SimGi(
                    id=gi["id"],
                    profile_index=gi["profile_index"],
                    start=gi["start"],
                    size=gi["size"],
                    cis=[SimCi(c["id"], c["profile_index"]) for c in gi["cis"]],
                )
                for gi in state["gis"]
            ]

    def _sync(self) -> None:
        """Re-read the state file if another process changed it."""
        path = self._state_file
        if path is None:
            return
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen != self._state_seen:
            self._load(json.loads(path.read_text()))
            self._state_seen = seen

    @contextmanager
    def _mutate(self) -> Iterator[None]:
        path = self._state_file
        if path is None:
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._state_seen = None
                self._sync()
                yield
                tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(self._dump()))
                os.replace(tmp, path)
                st = path.stat()
                self._state_seen = (st.st_mtime_ns, st.st_size)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- helpers -----------------------------------------------------------------------------
    def _gpu(self, handle: Any) -> SimGpu:
        kind, index, _, _ = _unpack(handle)
        if kind != _KIND_DEVICE or index >= len(self.gpus):
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._sync()
        return self.gpus[index]

    def _any_device(self, handle: Any) -> tuple[SimGpu, SimGi | None, SimCi | None]:
        """A full GPU or a MIG device handle."""
        kind, index, gi_id, ci_id = _unpack(handle)
        if kind not in (_KIND_DEVICE, _KIND_MIG) or index >= len(self.gpus):
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._sync()
        gpu = self.gpus[index]
        if kind == _KIND_DEVICE:
            return gpu, None, None
        gi = gpu.gi(gi_id)
        ci = next((c for c in gi.cis if c.id == ci_id), None) if gi else None
        if gi is None or ci is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi, ci

    def _full_gpu(self, handle: Any) -> SimGpu:
        """Metric queries: full GPUs only, MIG devices are not supported by NVML."""
        gpu, gi, _ = self._any_device(handle)
        if gi is not None:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _gi(self, handle: Any) -> tuple[SimGpu, SimGi]:
        kind, index, gi_id, _ = _unpack(handle)
        if kind != _KIND_GI or index >= len(self.gpus):
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._sync()
        gpu = self.gpus[index]
        gi = gpu.gi(gi_id)
        if gi is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi

    def _ci(self, handle: Any) -> tuple[SimGpu, SimGi, SimCi]:
        kind, index, gi_id, ci_id = _unpack(handle)
        if kind != _KIND_CI or index >= len(self.gpus):
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._sync()
        gpu = self.gpus[index]
        gi = gpu.gi(gi_id)
        ci = next((c for c in gi.cis if c.id == ci_id), None) if gi else None
        if gi is None or ci is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gi, ci

    @staticmethod
    def _mig_capable(gpu: SimGpu) -> None:
        if not gpu.model.mig_capable:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _load_factor(self, index: int) -> float:
        """A smooth 0.1..0.9 load per GPU, two-minute period, phase-shifted per GPU."""
        t = self._clock() - self._t0
        return 0.5 + 0.4 * math.sin(2 * math.pi * t / 120.0 + index * 0.7)

    def _power_w(self, gpu: SimGpu) -> float:
        idle, peak = gpu.model.power["idle_w"], gpu.model.power["max_w"]
        return idle + (peak * 0.75 - idle) * self._load_factor(gpu.index)

    def _energy_mj(self, gpu: SimGpu) -> float:
        """Closed-form integral of :meth:`_power_w` since start: mJ, strictly increasing."""
        idle, peak = gpu.model.power["idle_w"], gpu.model.power["max_w"]
        span = peak * 0.75 - idle
        t = self._clock() - self._t0
        w = 2 * math.pi / 120.0
        phase = gpu.index * 0.7
        joules = (idle + 0.5 * span) * t - span * 0.4 / w * (
            math.cos(w * t + phase) - math.cos(phase)
        )
        return self._boot_energy[gpu.index] + joules * 1000.0

    # -- system ------------------------------------------------------------------------------
    def _c_nvmlInitWithFlags(self, flags: Any) -> None:
        self._init_count += 1

    def _c_nvmlInit_v2(self) -> None:
        self._init_count += 1

    def _c_nvmlShutdown(self) -> None:
        if self._init_count == 0:
            raise _Code(pynvml.NVML_ERROR_UNINITIALIZED)
        self._init_count -= 1

    def _c_nvmlErrorString(self, code: Any) -> bytes:
        return f"Simulated NVML error {_int(code)}".encode()

    def _c_nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> None:
        _store_text(buffer, length, self.driver_version)

    def _c_nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> None:
        _store_text(buffer, length, "13." + self.driver_version)

    def _c_nvmlSystemGetCudaDriverVersion(self, out: Any) -> None:
        _out(out).value = self.cuda_version

    def _c_nvmlSystemGetCudaDriverVersion_v2(self, out: Any) -> None:
        _out(out).value = self.cuda_version

    def _c_nvmlDeviceGetCount_v2(self, out: Any) -> None:
        _out(out).value = len(self.gpus)

    def _c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> None:
        i = _int(index)
        if i >= len(self.gpus):
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _store_handle(_out(out), _handle(_KIND_DEVICE, i))

    def _c_nvmlDeviceGetHandleByUUID(self, text: Any, out: Any) -> None:
        raw = text if isinstance(text, bytes) else _out(text).value
        wanted = raw.decode()
        for gpu in self.gpus:
            if gpu.uuid == wanted:
                _store_handle(_out(out), _handle(_KIND_DEVICE, gpu.index))
                return
        raise _Code(pynvml.NVML_ERROR_NOT_FOUND)

    # -- identity ----------------------------------------------------------------------------
    def _c_nvmlDeviceGetIndex(self, handle: Any, out: Any) -> None:
        _out(out).value = self._full_gpu(handle).index

    def _c_nvmlDeviceGetMinorNumber(self, handle: Any, out: Any) -> None:
        _out(out).value = self._full_gpu(handle).index

    def _c_nvmlDeviceGetName(self, handle: Any, buffer: Any, length: Any) -> None:
        gpu, gi, _ = self._any_device(handle)
        name = gpu.model.name
        if gi is not None:
            name = f"{name} MIG {gpu.profile_of(gi).name}"
        _store_text(buffer, length, name)

    def _c_nvmlDeviceGetUUID(self, handle: Any, buffer: Any, length: Any) -> None:
        gpu, gi, ci = self._any_device(handle)
        text = gpu.uuid
        if gi is not None and ci is not None:
            mig = uuid.uuid5(uuid.NAMESPACE_URL, f"{gpu.uuid}/{gi.id}/{ci.id}/{gi.start}")
            text = f"MIG-{mig}"
        _store_text(buffer, length, text)

    def _c_nvmlDeviceGetPciInfo_v3(self, handle: Any, out: Any) -> None:
        gpu = self._full_gpu(handle)
        info = _out(out)
        bus_id = f"00000000:{gpu.bus:02X}:00.0"
        info.busIdLegacy = bus_id[4:].encode()
        info.busId = bus_id.encode()
        info.domain = 0
        info.bus = gpu.bus
        info.device = 0
        info.pciDeviceId = gpu.model.pci_device_id
        info.pciSubSystemId = gpu.model.pci_subsystem_id

    def _c_nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> None:
        gpu, _, _ = self._any_device(handle)
        _out(major).value, _out(minor).value = gpu.model.compute_capability

    def _c_nvmlDeviceGetArchitecture(self, handle: Any, out: Any) -> None:
        gpu, _, _ = self._any_device(handle)
        _out(out).value = ARCH_CODES[gpu.model.architecture]

    def _c_nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> None:
        total, free, used, _ = self._memory(handle)
        info = _out(out)
        info.total, info.free, info.used = total, free, used

    def _c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> None:
        info = _out(out)
        if info.version != pynvml.nvmlMemory_v2:
            raise _Code(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.total, info.free, info.used, info.reserved = self._memory(handle)

    def _memory(self, handle: Any) -> tuple[int, int, int, int]:
        """(total, free, used, reserved) in bytes, for a GPU or a MIG device."""
        gpu, gi, _ = self._any_device(handle)
        mib = 1024 * 1024
        load = self._load_factor(gpu.index)
        if gi is not None:
            total, reserved = gpu.profile_of(gi).memory_mib, 0
            used = int(total * 0.3 * load) if gi.cis else 0
        else:
            total, reserved = gpu.model.memory_mib, gpu.model.memory_reserved_mib
            if gpu.mig_current:
                busy = [gpu.profile_of(g).memory_mib for g in gpu.gis if g.cis]
                used = sum(int(m * 0.3 * load) for m in busy)
            else:
                used = int((total - reserved) * 0.3 * load)
        free = total - reserved - used
        return total * mib, free * mib, used * mib, reserved * mib

    def _c_nvmlDeviceGetAttributes_v2(self, handle: Any, out: Any) -> None:
        gpu, gi, ci = self._any_device(handle)
        attrs = _out(out)
        if gi is None or ci is None:
            attrs.multiprocessorCount = gpu.model.multiprocessors
            attrs.gpuInstanceSliceCount = gpu.model.compute_slices
            attrs.computeInstanceSliceCount = gpu.model.compute_slices
            attrs.memorySizeMB = gpu.model.memory_mib
            return
        profile = gpu.profile_of(gi)
        attrs.multiprocessorCount = profile.sms * ci.slices // profile.slices
        attrs.sharedCopyEngineCount = profile.engines["copy"]
        attrs.sharedDecoderCount = profile.engines["decoder"]
        attrs.sharedEncoderCount = profile.engines["encoder"]
        attrs.sharedJpegCount = profile.engines["jpeg"]
        attrs.sharedOfaCount = profile.engines["ofa"]
        attrs.gpuInstanceSliceCount = profile.slices
        attrs.computeInstanceSliceCount = ci.slices
        attrs.memorySizeMB = profile.memory_mib

    # -- MIG mode ----------------------------------------------------------------------------
    def _c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        gpu = self._gpu(handle)
        self._mig_capable(gpu)
        _out(current).value = int(gpu.mig_current)
        _out(pending).value = int(gpu.mig_pending)

    def _c_nvmlDeviceSetMigMode(self, handle: Any, mode: Any, status: Any) -> None:
        gpu = self._gpu(handle)
        self._mig_capable(gpu)
        enable = _int(mode) == pynvml.NVML_DEVICE_MIG_ENABLE
        with self._mutate():
            if not enable and gpu.gis:
                raise _Code(pynvml.NVML_ERROR_IN_USE)
            gpu.mig_pending = enable
            if gpu.model.mig_mode_change == "immediate":
                gpu.mig_current = enable
        reset_needed = gpu.mig_current != gpu.mig_pending
        _out(status).value = pynvml.NVML_ERROR_RESET_REQUIRED if reset_needed else SUCCESS

    def _c_nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> None:
        _, gi, _ = self._any_device(handle)
        _out(out).value = int(gi is not None)

    # -- GPU instances -----------------------------------------------------------------------
    def _profile_info(self, handle: Any, index: int) -> tuple[SimGpu, GiProfileSpec]:
        gpu = self._gpu(handle)
        self._mig_capable(gpu)
        if not 0 <= index < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        profile = gpu.model.gi_profile(index=index)
        if profile is None:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, profile

    @staticmethod
    def _fill_profile(info: Any, profile: GiProfileSpec, named: bool) -> None:
        info.id = profile.id
        info.isP2pSupported = 0
        info.sliceCount = profile.slices
        info.instanceCount = profile.max
        info.multiprocessorCount = profile.sms
        info.copyEngineCount = profile.engines["copy"]
        info.decoderCount = profile.engines["decoder"]
        info.encoderCount = profile.engines["encoder"]
        info.jpegCount = profile.engines["jpeg"]
        info.ofaCount = profile.engines["ofa"]
        info.memorySizeMB = profile.memory_mib
        if named:
            info.name = f"MIG {profile.name}".encode()

    def _c_nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, index: Any, out: Any) -> None:
        _, profile = self._profile_info(handle, _int(index))
        self._fill_profile(_out(out), profile, named=False)

    def _c_nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, index: Any, out: Any) -> None:
        info = _out(out)
        if info.version != pynvml.nvmlGpuInstanceProfileInfo_v2:
            raise _Code(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        _, profile = self._profile_info(handle, _int(index))
        self._fill_profile(info, profile, named=True)

    def _profile_by_id(self, handle: Any, profile_id: Any) -> tuple[SimGpu, GiProfileSpec]:
        gpu = self._gpu(handle)
        self._mig_capable(gpu)
        profile = gpu.model.gi_profile(id=_int(profile_id))
        if profile is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, profile

    def _c_nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, profile_id: Any, placements: Any, count: Any
    ) -> None:
        _, profile = self._profile_by_id(handle, profile_id)
        out_count = _out(count)
        if placements is None:
            out_count.value = len(profile.starts)
            return
        array = _out(placements)
        if len(array) < len(profile.starts):
            raise _Code(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(profile.starts):
            array[i].start = start
            array[i].size = profile.size
        out_count.value = len(profile.starts)

    def _fits(self, gpu: SimGpu, profile: GiProfileSpec, start: int) -> bool:
        taken = {s for gi in gpu.gis for s in range(gi.start, gi.start + gi.size)}
        wanted = set(range(start, start + profile.size))
        compute = sum(gpu.profile_of(gi).slices for gi in gpu.gis)
        same = sum(1 for gi in gpu.gis if gi.profile_index == profile.index)
        return (
            not (taken & wanted)
            and compute + profile.slices <= gpu.model.compute_slices
            and same < profile.max
        )

    def _c_nvmlDeviceGetGpuInstanceRemainingCapacity(
        self, handle: Any, profile_id: Any, count: Any
    ) -> None:
        gpu, profile = self._profile_by_id(handle, profile_id)
        if not gpu.mig_current:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        free = 0
        placed: list[SimGi] = []
        for start in profile.starts:
            if self._fits(gpu, profile, start):
                probe = SimGi(-1, profile.index, start, profile.size)
                gpu.gis.append(probe)
                placed.append(probe)
                free += 1
        for probe in placed:
            gpu.gis.remove(probe)
        _out(count).value = free

    @staticmethod
    def _gi_id(gpu: SimGpu, size: int, start: int) -> int:
        """Hardware-like GI ids: 7g -> 0, halves -> 1-2, quarters -> 3-6, eighths -> 7-14."""
        preferred = {8: 0, 4: 1 + start // 4, 2: 3 + start // 2, 1: 7 + start}.get(size, 15)
        used = {gi.id for gi in gpu.gis}
        if preferred not in used:
            return preferred
        return next(i for i in range(16, 64) if i not in used)

    def _create_gi(self, handle: Any, profile_id: Any, start: int | None, out: Any) -> None:
        gpu, profile = self._profile_by_id(handle, profile_id)
        with self._mutate():
            if not gpu.mig_current:
                raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if start is None:
                start = next((s for s in profile.starts if self._fits(gpu, profile, s)), None)
                if start is None:
                    raise _Code(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            elif start not in profile.starts:
                raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if not self._fits(gpu, profile, start):
                raise _Code(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi = SimGi(self._gi_id(gpu, profile.size, start), profile.index, start, profile.size)
            gpu.gis.append(gi)
        _store_handle(_out(out), _handle(_KIND_GI, gpu.index, gi.id))

    def _c_nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: Any, out: Any) -> None:
        self._create_gi(handle, profile_id, None, out)

    def _c_nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: Any, placement: Any, out: Any
    ) -> None:
        where = _out(placement)
        _, profile = self._profile_by_id(handle, profile_id)
        if where.size != profile.size:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._create_gi(handle, profile_id, int(where.start), out)

    def _c_nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: Any, array: Any, count: Any
    ) -> None:
        gpu, profile = self._profile_by_id(handle, profile_id)
        if not gpu.mig_current:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        found = [
            gi for gi in sorted(gpu.gis, key=lambda g: g.id) if gi.profile_index == profile.index
        ]
        target = _out(array)
        if len(target) < len(found):
            raise _Code(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            _store_handle(target, _handle(_KIND_GI, gpu.index, gi.id), i)
        _out(count).value = len(found)

    def _c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, out: Any) -> None:
        gpu = self._gpu(handle)
        self._mig_capable(gpu)
        if not gpu.mig_current:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gi = gpu.gi(_int(gi_id))
        if gi is None:
            raise _Code(pynvml.NVML_ERROR_NOT_FOUND)
        _store_handle(_out(out), _handle(_KIND_GI, gpu.index, gi.id))

    def _c_nvmlGpuInstanceGetInfo(self, handle: Any, out: Any) -> None:
        gpu, gi = self._gi(handle)
        info = _out(out)
        _store_handle(info, _handle(_KIND_DEVICE, gpu.index))  # .device is the first field
        info.id = gi.id
        info.profileId = gpu.profile_of(gi).id
        info.placement.start = gi.start
        info.placement.size = gi.size

    def _c_nvmlGpuInstanceDestroy(self, handle: Any) -> None:
        gpu, gi = self._gi(handle)
        with self._mutate():
            current = gpu.gi(gi.id)
            if current is None:
                raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if current.cis:
                raise _Code(pynvml.NVML_ERROR_IN_USE)
            gpu.gis.remove(current)

    # -- compute instances -------------------------------------------------------------------
    def _ci_profile(self, handle: Any, index: int) -> tuple[SimGpu, SimGi, int]:
        gpu, gi = self._gi(handle)
        slices = CI_SLICES.get(index)
        if slices is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slices > gpu.profile_of(gi).slices:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gi, slices

    def _c_nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, handle: Any, index: Any, engine: Any, out: Any
    ) -> None:
        info = _out(out)
        if info.version != pynvml.nvmlComputeInstanceProfileInfo_v2:
            raise _Code(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill_ci_profile(handle, _int(index), info)
        gpu, gi = self._gi(handle)
        info.name = f"MIG {CI_SLICES[_int(index)]}c.{gpu.profile_of(gi).name}".encode()

    def _c_nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, handle: Any, index: Any, engine: Any, out: Any
    ) -> None:
        self._fill_ci_profile(handle, _int(index), _out(out))

    def _fill_ci_profile(self, handle: Any, index: int, info: Any) -> None:
        gpu, gi, slices = self._ci_profile(handle, index)
        profile = gpu.profile_of(gi)
        info.id = index
        info.sliceCount = slices
        info.instanceCount = profile.slices // slices
        info.multiprocessorCount = profile.sms * slices // profile.slices
        info.sharedCopyEngineCount = profile.engines["copy"]
        info.sharedDecoderCount = profile.engines["decoder"]
        info.sharedEncoderCount = profile.engines["encoder"]
        info.sharedJpegCount = profile.engines["jpeg"]
        info.sharedOfaCount = profile.engines["ofa"]

    def _c_nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, handle: Any, profile_id: Any, count: Any
    ) -> None:
        gpu, gi, slices = self._ci_profile(handle, _int(profile_id))
        free = gpu.profile_of(gi).slices - sum(c.slices for c in gi.cis)
        _out(count).value = free // slices

    def _c_nvmlGpuInstanceCreateComputeInstance(
        self, handle: Any, profile_id: Any, out: Any
    ) -> None:
        gpu, gi, slices = self._ci_profile(handle, _int(profile_id))
        with self._mutate():
            current = gpu.gi(gi.id)
            if current is None:
                raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if sum(c.slices for c in current.cis) + slices > gpu.profile_of(current).slices:
                raise _Code(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            used = {c.id for c in current.cis}
            ci = SimCi(next(i for i in range(64) if i not in used), _int(profile_id))
            current.cis.append(ci)
        _store_handle(_out(out), _handle(_KIND_CI, gpu.index, gi.id, ci.id))

    def _c_nvmlGpuInstanceGetComputeInstances(
        self, handle: Any, profile_id: Any, array: Any, count: Any
    ) -> None:
        gpu, gi, _ = self._ci_profile(handle, _int(profile_id))
        found = [
            c for c in sorted(gi.cis, key=lambda c: c.id) if c.profile_index == _int(profile_id)
        ]
        target = _out(array)
        if len(target) < len(found):
            raise _Code(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, ci in enumerate(found):
            _store_handle(target, _handle(_KIND_CI, gpu.index, gi.id, ci.id), i)
        _out(count).value = len(found)

    def _c_nvmlGpuInstanceGetComputeInstanceById(self, handle: Any, ci_id: Any, out: Any) -> None:
        gpu, gi = self._gi(handle)
        ci = next((c for c in gi.cis if c.id == _int(ci_id)), None)
        if ci is None:
            raise _Code(pynvml.NVML_ERROR_NOT_FOUND)
        _store_handle(_out(out), _handle(_KIND_CI, gpu.index, gi.id, ci.id))

    def _c_nvmlComputeInstanceGetInfo_v2(self, handle: Any, out: Any) -> None:
        gpu, gi, ci = self._ci(handle)
        info = _out(out)
        _store_handle(info, _handle(_KIND_DEVICE, gpu.index))
        _store_handle(info, _handle(_KIND_GI, gpu.index, gi.id), 1)
        info.id = ci.id
        info.profileId = ci.profile_index
        used_before = sum(c.slices for c in gi.cis if c.id < ci.id)
        info.placement.start = used_before
        info.placement.size = ci.slices

    def _c_nvmlComputeInstanceDestroy(self, handle: Any) -> None:
        gpu, gi, ci = self._ci(handle)
        with self._mutate():
            current = gpu.gi(gi.id)
            if current is None:
                raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            current.cis = [c for c in current.cis if c.id != ci.id]

    # -- MIG devices -------------------------------------------------------------------------
    def _c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> None:
        gpu = self._gpu(handle)
        _out(out).value = gpu.model.compute_slices if gpu.model.mig_capable else 0

    def _c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> None:
        gpu = self._gpu(handle)
        self._mig_capable(gpu)
        if not gpu.mig_current:
            raise _Code(pynvml.NVML_ERROR_NOT_FOUND)
        devices = gpu.mig_devices()
        i = _int(index)
        if i >= gpu.model.compute_slices:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if i >= len(devices):
            raise _Code(pynvml.NVML_ERROR_NOT_FOUND)
        gi, ci = devices[i]
        _store_handle(_out(out), _handle(_KIND_MIG, gpu.index, gi.id, ci.id))

    def _c_nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> None:
        _, gi, _ = self._any_device(handle)
        if gi is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _out(out).value = gi.id

    def _c_nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> None:
        _, _, ci = self._any_device(handle)
        if ci is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _out(out).value = ci.id

    def _c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> None:
        gpu, gi, _ = self._any_device(handle)
        if gi is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _store_handle(_out(out), _handle(_KIND_DEVICE, gpu.index))

    # -- metrics -----------------------------------------------------------------------------
    def _c_nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, out: Any) -> None:
        gpu = self._full_gpu(handle)
        kind = _int(clock_type)
        clocks = gpu.model.clocks
        if kind in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            load = self._load_factor(gpu.index)
            value = clocks["sm_idle"] + (clocks["sm_max"] - clocks["sm_idle"]) * min(
                1.0, load * 1.6
            )
            _out(out).value = int(round(value / 15.0) * 15)
        elif kind == pynvml.NVML_CLOCK_MEM:
            _out(out).value = clocks["mem"]
        else:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _c_nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, out: Any) -> None:
        gpu = self._full_gpu(handle)
        if _int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        t = gpu.model.temperature
        _out(out).value = int(
            t["idle_c"] + (t["max_c"] - t["idle_c"]) * self._load_factor(gpu.index)
        )

    def _c_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> None:
        gpu = self._full_gpu(handle)
        array = _out(values)
        now_us = int(time.time() * 1_000_000)
        for i in range(_int(count)):
            entry = array[i]
            entry.timestamp = now_us
            entry.latencyUsec = 0
            if entry.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP and gpu.model.memory_temperature:
                t = gpu.model.temperature
                load = self._load_factor(gpu.index)
                entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                entry.value.uiVal = int(t["idle_c"] + 4 + (t["max_c"] - t["idle_c"]) * load)
                entry.nvmlReturn = SUCCESS
            else:
                entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED

    def _c_nvmlDeviceGetPowerUsage(self, handle: Any, out: Any) -> None:
        _out(out).value = int(self._power_w(self._full_gpu(handle)) * 1000)

    def _c_nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, out: Any) -> None:
        _out(out).value = int(self._energy_mj(self._full_gpu(handle)))

    def _c_nvmlDeviceGetPcieReplayCounter(self, handle: Any, out: Any) -> None:
        self._full_gpu(handle)
        _out(out).value = 0

    def _c_nvmlDeviceGetUtilizationRates(self, handle: Any, out: Any) -> None:
        gpu = self._full_gpu(handle)
        util = _out(out)
        load = self._load_factor(gpu.index)
        util.gpu = int(100 * load)
        util.memory = int(55 * load)

    def _codec(self, handle: Any, util: Any, period: Any, share: float) -> None:
        gpu = self._full_gpu(handle)
        value = int(20 * share * self._load_factor(gpu.index)) if gpu.model.encoder else 0
        _out(util).value = value
        _out(period).value = 167000

    def _c_nvmlDeviceGetEncoderUtilization(self, handle: Any, util: Any, period: Any) -> None:
        self._codec(handle, util, period, 1.0)

    def _c_nvmlDeviceGetDecoderUtilization(self, handle: Any, util: Any, period: Any) -> None:
        self._codec(handle, util, period, 0.5)

    def _c_nvmlDeviceGetRemappedRows(
        self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> None:
        gpu = self._full_gpu(handle)
        if not gpu.model.row_remapping:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for ref in (corr, unc, pending, failure):
            _out(ref).value = 0

    # -- events (XIDs) -----------------------------------------------------------------------
    def _c_nvmlEventSetCreate(self, out: Any) -> None:
        set_id = len(self._event_sets) + 1
        self._event_sets[set_id] = set()
        _store_handle(_out(out), _handle(_KIND_EVENTS, set_id))

    def _event_set(self, handle: Any) -> set[int]:
        kind, set_id, _, _ = _unpack(handle)
        if kind != _KIND_EVENTS or set_id not in self._event_sets:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._event_sets[set_id]

    def _c_nvmlDeviceGetSupportedEventTypes(self, handle: Any, out: Any) -> None:
        self._full_gpu(handle)
        _out(out).value = pynvml.nvmlEventTypeXidCriticalError

    def _c_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, events: Any) -> None:
        gpu = self._full_gpu(handle)
        if not _int(types) & pynvml.nvmlEventTypeXidCriticalError:
            raise _Code(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._event_set(events).add(gpu.index)

    def _c_nvmlEventSetWait_v2(self, events: Any, out: Any, timeout: Any) -> None:
        for index in sorted(self._event_set(events)):
            gpu = self.gpus[index]
            if gpu.xids:
                data = _out(out)
                _store_handle(data, _handle(_KIND_DEVICE, index))
                data.eventType = pynvml.nvmlEventTypeXidCriticalError
                data.eventData = gpu.xids.pop(0)
                data.gpuInstanceId = 0xFFFFFFFF
                data.computeInstanceId = 0xFFFFFFFF
                return
        raise _Code(pynvml.NVML_ERROR_TIMEOUT)

    def _c_nvmlEventSetFree(self, events: Any) -> None:
        _, set_id, _, _ = _unpack(events)
        if self._event_sets.pop(set_id, None) is None:
            raise _Code(pynvml.NVML_ERROR_INVALID_ARGUMENT)


_installed_lock = threading.Lock()


def install_simulated_nvml(
    spec: str | Sequence[str] | Sequence[GpuModel],
    *,
    state_file: str | Path | None = None,
    seed: str | None = None,
    driver_version: str = DEFAULT_DRIVER,
    cuda_version: int = DEFAULT_CUDA,
    clock: Callable[[], float] = time.monotonic,
) -> SimulatedNvml:
    """Put a simulated library under pynvml; every later pynvml call reaches it.

    ``spec``: ``"a100-40gb:8"``, ``"a100-40gb:4,t4:2"``, a list of such strings, or models.
    """
    if isinstance(spec, str) or (spec and isinstance(spec[0], str)):
        models = parse_spec(spec)  # type: ignore[arg-type]
    else:
        models = list(spec)  # type: ignore[arg-type]
    sim = SimulatedNvml(
        models,
        driver_version=driver_version,
        cuda_version=cuda_version,
        state_file=state_file,
        seed=seed,
        clock=clock,
    )
    with _installed_lock, pynvml.libLoadLock:
        pynvml.nvmlLib = sim
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return sim


def uninstall_simulated_nvml() -> None:
    """Forget the simulated library: the next ``nvmlInit`` loads the real one (or fails)."""
    with _installed_lock, pynvml.libLoadLock:
        if isinstance(pynvml.nvmlLib, SimulatedNvml):
            pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def install_from_environment(spec: str | None = None) -> SimulatedNvml | None:
    """Honour ``--simulate`` / ``GPU_OPERATOR_SIMULATE`` and ``GPU_OPERATOR_SIMULATE_STATE``."""
    spec = spec or os.environ.get(ENV_SIMULATE)
    if not spec:
        return None
    return install_simulated_nvml(spec, state_file=os.environ.get(ENV_STATE) or None)
