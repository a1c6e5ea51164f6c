"""The typed GPU inventory the node agents reason about.

Plain frozen data, no pynvml: the pure layers (labels, MIG planning, the MIG state machine)
take these values, so they can be tested with literal inventories and never see NVML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Placement:
    """Where a GPU instance sits, in memory slices (``start``..``start+size-1``)."""

    start: int
    size: int

    @property
    def slices(self) -> frozenset[int]:
        return frozenset(range(self.start, self.start + self.size))


@dataclass(frozen=True)
class Engines:
    copy: int = 0
    decoder: int = 0
    encoder: int = 0
    jpeg: int = 0
    ofa: int = 0


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile a MIG-capable GPU offers (``nvidia-smi mig -lgip``)."""

    index: int  # the NVML_GPU_INSTANCE_PROFILE_* constant passed to NVML
    id: int  # the profile id NVML returns (what nvidia-smi shows)
    name: str  # e.g. "1g.5gb", "1g.5gb+me"
    memory_mib: int
    slice_count: int  # compute slices
    max_count: int
    sm_count: int
    engines: Engines
    placements: tuple[Placement, ...]

    @property
    def memory_slices(self) -> int:
        return self.placements[0].size if self.placements else 0


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile_index: int
    slice_count: int


@dataclass(frozen=True)
class GpuInstance:
    id: int
    profile: str
    profile_index: int
    placement: Placement
    compute_instances: tuple[ComputeInstance, ...] = ()

    @property
    def slice_count_used(self) -> int:
        return sum(ci.slice_count for ci in self.compute_instances)


@dataclass(frozen=True)
class MigDevice:
    """A MIG device: one compute instance inside one GPU instance, as CUDA sees it."""

    gpu_index: int
    gi_id: int
    ci_id: int
    uuid: str
    profile: str  # GPU-instance profile name, e.g. "1g.5gb"
    memory_mib: int
    sm_count: int
    slices_gi: int
    slices_ci: int
    engines: Engines
    placement: Placement


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str  # "00000000:07:00.0"
    pci_device_id: int  # 0x20B010DE: device id in the high half, vendor in the low half
    memory_mib: int
    compute_major: int
    compute_minor: int
    architecture: str  # "ampere", "hopper", ...
    minor_number: int
    mig_capable: bool
    mig_current: bool
    mig_pending: bool
    mig_profiles: tuple[MigProfile, ...] = ()
    gpu_instances: tuple[GpuInstance, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    brand: str = "Unknown"  # NVML's brand, spelled as NVIDIA's DRA driver does ("Nvidia")

    @property
    def device_filter_id(self) -> str:
        """The id as mig-parted's ``device-filter`` spells it: ``0x20B010DE``."""
        return f"0x{self.pci_device_id:08X}"

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)

    def instance_counts(self) -> Mapping[str, int]:
        """Profiles of GPU instances that are fully carved (one CI using every slice)."""
        counts: dict[str, int] = {}
        for gi in self.gpu_instances:
            counts[gi.profile] = counts.get(gi.profile, 0) + 1
        return counts


@dataclass(frozen=True)
class Inventory:
    driver_version: str
    cuda_driver_version: int  # 12080 means CUDA 12.8
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)

    @property
    def cuda_major(self) -> int:
        return self.cuda_driver_version // 1000

    @property
    def cuda_minor(self) -> int:
        return (self.cuda_driver_version % 1000) // 10


@dataclass(frozen=True)
class GpuMetrics:
    """One NVML reading of a whole GPU; ``None`` where the GPU does not support the query."""

    index: int
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    gpu_temp_c: float | None = None
    memory_temp_c: float | None = None
    power_w: float | None = None
    energy_mj: float | None = None
    pcie_replay_count: float | None = None
    gpu_util_pct: float | None = None
    mem_copy_util_pct: float | None = None
    encoder_util_pct: float | None = None
    decoder_util_pct: float | None = None
    fb_free_mib: float | None = None
    fb_used_mib: float | None = None
    fb_reserved_mib: float | None = None
    remapped_rows_correctable: float | None = None
    remapped_rows_uncorrectable: float | None = None
    row_remap_failure: float | None = None
    last_xid: float | None = None


@dataclass(frozen=True)
class XidEvent:
    """An XID critical error NVML reported; ``gi_id``/``ci_id`` name a MIG device, ``None``
    the whole GPU."""

    gpu_index: int
    xid: int
    gi_id: int | None = None
    ci_id: int | None = None


@dataclass(frozen=True)
class MigMetrics:
    """What NVML reports per MIG device (framebuffer only: utilisation needs DCGM)."""

    gpu_index: int
    gi_id: int
    ci_id: int
    fb_free_mib: float | None = None
    fb_used_mib: float | None = None
    fb_reserved_mib: float | None = None
