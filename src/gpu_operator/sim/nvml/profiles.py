"""GPU models with real numbers, read from ``sim/profiles/*.yaml``, and the spec that picks them.

A spec names a node's GPUs as ``PROFILE:COUNT`` items (``"a100-40gb:4,t4:2"``); every simulated
GPU is one :class:`GpuModel`, immutable and shared by the GPUs of that model. An item
``fabric=...`` is not a GPU but the node's NVLink fabric (:mod:`.fabric`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import yaml

FABRIC_ITEM = "fabric="


class SimulationError(ValueError):
    """A bad simulation spec (unknown profile, malformed count)."""


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
    # ECC memory, on and reported by NVML: every data-centre part (A100, H100, H200, L4, L40S,
    # T4...); a GeForce part has none (its profile says ``ecc: false``).
    ecc: bool
    mig_mode_change: str | None = None  # None: not MIG capable
    compute_slices: int = 0
    memory_slices: int = 0
    gi_profiles: tuple[GiProfileSpec, ...] = ()
    # A multi-node NVLink fabric (GB200/GB300 NVL72): NVML's fabric info and the IMEX channels.
    nvlink_fabric: bool = False

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
    folder = resources.files("gpu_operator.sim") / "profiles"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_model(key: str) -> GpuModel:
    path = resources.files("gpu_operator.sim") / "profiles" / f"{key}.yaml"
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
        ecc=bool(doc.get("ecc", True)),
        nvlink_fabric=bool(doc.get("nvlink_fabric", False)),
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
    """``"a100-40gb:8"``, ``"a100-40gb:4,t4:2"`` or ``["h100-80gb:8"]`` -> one model per GPU
    (a ``fabric=`` item is passed over: :func:`.fabric.fabric_of_spec` reads it)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    models: list[GpuModel] = []
    cache: dict[str, GpuModel] = {}
    for raw in items:
        item = raw.strip()
        if not item or item.startswith(FABRIC_ITEM):
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
