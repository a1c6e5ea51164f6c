"""mig-parted configs: parse, plan against the hardware, apply through the NVML adapter.

The planner is pure: inventory + named config -> per-GPU plan (MIG mode, profiles, a concrete
placement for every GPU instance) or a :class:`MigPlanError` naming the offending profile. It
also says whether the GPU already matches, so re-applying an applied config does nothing.
The applier is the only part that changes hardware, and only on GPUs that do not match yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpu_operator.agent.inventory import Gpu, Inventory, MigProfile, Placement
from gpu_operator.textfiles import parse_file, yaml_problem


class MigConfigError(ValueError):
    """The mig-parted config file is malformed."""


class MigPlanError(ValueError):
    """The requested config cannot be applied to this node's GPUs (message says why)."""


class MigApplyError(RuntimeError):
    """Applying a valid plan failed (NVML refused, or the result did not read back)."""


# -- config file ---------------------------------------------------------------------------------
class MigConfigEntry(BaseModel):
    """One entry of a named config: which GPUs, MIG on/off, and the MIG devices to create."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    devices: Literal["all"] | tuple[int, ...] = "all"
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, int] = Field(default_factory=dict, alias="mig-devices")
    device_filter: tuple[str, ...] | None = Field(default=None, alias="device-filter")

    @field_validator("device_filter", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("mig_devices", mode="before")
    @classmethod
    def _none_is_empty(cls, value: object) -> object:
        return {} if value is None else value

    @field_validator("mig_devices")
    @classmethod
    def _counts(cls, value: dict[str, int]) -> dict[str, int]:
        for name, count in value.items():
            if count < 0:
                raise ValueError(f"negative count {count} for MIG profile {name!r}")
        return value

    def device_ids(self) -> frozenset[int] | None:
        if self.device_filter is None:
            return None
        return frozenset(int(v, 16) for v in self.device_filter)

    def selects(self, gpu: Gpu) -> bool:
        ids = self.device_ids()
        if ids is not None and gpu.pci_device_id not in ids:
            return False
        return self.devices == "all" or gpu.index in self.devices


class MigPartedConfig(BaseModel):
    """A mig-parted ``version: v1`` document."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    version: Literal["v1"]
    mig_configs: dict[str, tuple[MigConfigEntry, ...]] = Field(alias="mig-configs")

    def to_yaml(self) -> str:
        doc = self.model_dump(by_alias=True, exclude_none=True)
        return yaml.safe_dump(_plain(doc), sort_keys=False)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def parse_mig_config(text: str) -> MigPartedConfig:
    """Parse mig-parted YAML, or a ConfigMap holding it (the first data value)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigConfigError(f"MIG config {yaml_problem(exc)}") from exc
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        data = doc.get("data") or {}
        if not data:
            raise MigConfigError("ConfigMap has no data")
        raw = data.get("config.yaml") or next(iter(data.values()))
        return parse_mig_config(raw)
    try:
        return MigPartedConfig.model_validate(doc)
    except ValidationError as exc:
        raise MigConfigError(f"invalid mig-parted config: {exc}") from exc


def load_mig_config(path: str | Path) -> MigPartedConfig:
    """The mig-parted config in ``path``; FileProblem names the file when it cannot be used."""
    return parse_file(path, parse_mig_config, (MigConfigError,))


# -- planning ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedInstance:
    profile: str
    profile_index: int
    placement: Placement
    slices: int  # compute slices: the full compute instance to create inside


@dataclass(frozen=True)
class GpuPlan:
    index: int
    name: str
    mig_enabled: bool
    counts: tuple[tuple[str, int], ...]  # requested profile counts, zero counts dropped
    layout: tuple[PlannedInstance, ...] | None  # None: profiles unknown until MIG is on
    already_applied: bool


@dataclass(frozen=True)
class MigPlan:
    config: str
    gpus: tuple[GpuPlan, ...]

    @property
    def already_applied(self) -> bool:
        return all(g.already_applied for g in self.gpus)


def select(inventory: Inventory, entries: Sequence[MigConfigEntry]) -> dict[int, MigConfigEntry]:
    """GPU index -> the entry that applies to it; later entries override earlier ones."""
    chosen: dict[int, MigConfigEntry] = {}
    for entry in entries:
        for gpu in inventory.gpus:
            if entry.selects(gpu):
                chosen[gpu.index] = entry
    return chosen


def plan(inventory: Inventory, config: MigPartedConfig, name: str) -> MigPlan:
    """Decide what ``name`` means for each GPU; raise :class:`MigPlanError` when it cannot fit."""
    entries = config.mig_configs.get(name)
    if entries is None:
        known = ", ".join(sorted(config.mig_configs))
        raise MigPlanError(f"unknown MIG config {name!r} (known: {known})")
    if not inventory.gpus:
        raise MigPlanError("no GPUs found on this node")
    chosen = select(inventory, entries)
    if not chosen:
        models = ", ".join(sorted({f"{g.name} ({g.device_filter_id})" for g in inventory.gpus}))
        raise MigPlanError(f"MIG config {name!r} selects none of this node's GPUs: {models}")
    return MigPlan(
        config=name,
        gpus=tuple(plan_gpu(g, chosen[g.index]) for g in inventory.gpus if g.index in chosen),
    )


def plan_gpu(gpu: Gpu, entry: MigConfigEntry) -> GpuPlan:
    counts = tuple((p, n) for p, n in entry.mig_devices.items() if n > 0)
    label = f"GPU {gpu.index} ({gpu.name})"
    if not entry.mig_enabled:
        done = not gpu.mig_capable or (not gpu.mig_current and not gpu.mig_pending)
        return GpuPlan(gpu.index, gpu.name, False, (), (), done)
    if not gpu.mig_capable:
        raise MigPlanError(f"{label} is not MIG capable")
    layout: tuple[PlannedInstance, ...] | None = None
    if gpu.mig_profiles:
        layout = place(gpu.mig_profiles, dict(counts), label)
    done = gpu.mig_current and gpu.mig_pending and matches(gpu, dict(counts))
    return GpuPlan(gpu.index, gpu.name, True, counts, layout, done)


def matches(gpu: Gpu, counts: Mapping[str, int]) -> bool:
    """The GPU's instances are exactly ``counts``, each with one compute instance using it all."""
    wanted = {p: n for p, n in counts.items() if n > 0}
    if dict(gpu.instance_counts()) != wanted:
        return False
    by_name = {p.name: p for p in gpu.mig_profiles}
    for gi in gpu.gpu_instances:
        profile = by_name.get(gi.profile)
        if len(gi.compute_instances) != 1:
            return False
        if profile is not None and gi.compute_instances[0].slice_count != profile.slice_count:
            return False
    return True


def place(
    profiles: Sequence[MigProfile], counts: Mapping[str, int], label: str = "GPU"
) -> tuple[PlannedInstance, ...]:
    """A placement for every requested instance, or :class:`MigPlanError` naming the profile."""
    by_name = {p.name: p for p in profiles}
    compute_total = max((p.slice_count for p in profiles), default=0)
    wanted: list[MigProfile] = []
    used_compute = 0
    for name, count in counts.items():
        if count <= 0:
            continue
        profile = by_name.get(name)
        if profile is None:
            offered = ", ".join(p.name for p in profiles)
            raise MigPlanError(
                f"MIG profile {name!r} is not supported by {label} (offers: {offered})"
            )
        if count > profile.max_count:
            raise MigPlanError(
                f"{count} x MIG profile {name!r} do not fit {label}: at most {profile.max_count}"
            )
        used_compute += count * profile.slice_count
        if used_compute > compute_total:
            raise MigPlanError(
                f"MIG profile {name!r} does not fit {label}: the layout needs {used_compute} "
                f"compute slices, the GPU has {compute_total}"
            )
        wanted.extend([profile] * count)
    # Largest first: big instances have the fewest placements.
    wanted.sort(key=lambda p: (-p.memory_slices, -p.slice_count, p.index))
    chosen: list[Placement] = []
    deepest = [0]

    def search(i: int, taken: frozenset[int]) -> bool:
        deepest[0] = max(deepest[0], i)
        if i == len(wanted):
            return True
        for where in wanted[i].placements:
            if taken & where.slices:
                continue
            chosen.append(where)
            if search(i + 1, taken | where.slices):
                return True
            chosen.pop()
        return False

    if not search(0, frozenset()):
        stuck = wanted[deepest[0]]
        others = ", ".join(p.name for p in wanted if p is not stuck) or "nothing else"
        raise MigPlanError(
            f"MIG profile {stuck.name!r} does not fit {label}: no free placement alongside {others}"
        )
    return tuple(
        PlannedInstance(p.name, p.index, where, p.slice_count)
        for p, where in zip(wanted, chosen, strict=True)
    )


# -- applying ------------------------------------------------------------------------------------
class MigBackend(Protocol):
    """What the applier needs from NVML; :class:`gpu_operator.agent.nvml.Nvml` provides it."""

    def inventory(self) -> Inventory: ...

    def gpu(self, index: int) -> Gpu: ...

    def set_mig_mode(self, index: int, enabled: bool) -> tuple[bool, bool]: ...

    def reset_gpu(self, index: int) -> None: ...

    def destroy_mig_instances(self, index: int) -> int: ...

    def create_gpu_instance(self, index: int, profile_index: int, placement: Placement) -> int: ...

    def create_compute_instance(self, index: int, gi_id: int, slices: int) -> int: ...


def apply_plan(backend: MigBackend, mig_plan: MigPlan) -> int:
    """Make the hardware match the plan; returns how many GPUs were changed.

    GPUs already matching are not touched (no NVML create/destroy calls). Raises
    :class:`MigApplyError` with the GPU and step when NVML refuses or the result is wrong.
    """
    changed = 0
    for gpu_plan in mig_plan.gpus:
        if gpu_plan.already_applied:
            continue
        try:
            _apply_gpu(backend, gpu_plan)
        except MigApplyError:
            raise
        except Exception as exc:
            raise MigApplyError(f"GPU {gpu_plan.index} ({gpu_plan.name}): {exc}") from exc
        changed += 1
    return changed


def _set_mode(backend: MigBackend, index: int, enabled: bool) -> None:
    current, _pending = backend.set_mig_mode(index, enabled)
    if current != enabled:
        backend.reset_gpu(index)
        gpu = backend.gpu(index)
        if gpu.mig_current != enabled:
            raise MigApplyError(
                f"GPU {index}: MIG mode is still {'on' if gpu.mig_current else 'off'} after a "
                "GPU reset; the node may need a reboot"
            )


def _apply_gpu(backend: MigBackend, gpu_plan: GpuPlan) -> None:
    index = gpu_plan.index
    gpu = backend.gpu(index)
    if not gpu_plan.mig_enabled:
        if gpu.mig_current and gpu.gpu_instances:
            backend.destroy_mig_instances(index)
        if gpu.mig_current or gpu.mig_pending:
            _set_mode(backend, index, False)
        return
    if not (gpu.mig_current and gpu.mig_pending):
        _set_mode(backend, index, True)
        gpu = backend.gpu(index)
    if gpu.gpu_instances:
        backend.destroy_mig_instances(index)
    layout = gpu_plan.layout
    if layout is None:
        layout = place(gpu.mig_profiles, dict(gpu_plan.counts), f"GPU {index} ({gpu.name})")
    for instance in layout:
        gi_id = backend.create_gpu_instance(index, instance.profile_index, instance.placement)
        backend.create_compute_instance(index, gi_id, instance.slices)


def apply_config(backend: MigBackend, config: MigPartedConfig, name: str) -> MigPlan:
    """Plan, apply, read back: returns the verified (now already-applied) plan."""
    mig_plan = plan(backend.inventory(), config, name)
    if mig_plan.already_applied:
        return mig_plan
    apply_plan(backend, mig_plan)
    after = plan(backend.inventory(), config, name)
    if not after.already_applied:
        wrong = [g.index for g in after.gpus if not g.already_applied]
        raise MigApplyError(f"MIG config {name!r} did not read back as applied on GPUs {wrong}")
    return after


# -- standard configs ----------------------------------------------------------------------------
def config_name(profile: str) -> str:
    """``1g.5gb+me`` -> ``all-1g.5gb.me``, as NVIDIA names its configs."""
    return "all-" + profile.replace("+", ".")


def _models(inventory: Inventory) -> list[Gpu]:
    seen: dict[int, Gpu] = {}
    for gpu in inventory.gpus:
        if gpu.mig_capable and gpu.mig_profiles:
            seen.setdefault(gpu.pci_device_id, gpu)
    return list(seen.values())


def _entry(gpu: Gpu, devices: dict[str, int], filtered: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if filtered:
        entry["device-filter"] = [gpu.device_filter_id]
    entry.update({"devices": "all", "mig-enabled": True, "mig-devices": devices})
    return entry


def balanced(profiles: Iterable[MigProfile]) -> dict[str, int] | None:
    """2x the smallest 1-slice + 1x 2-slice + 1x 3-slice profile (plain ones, no ``+``)."""
    plain = [p for p in profiles if "+" not in p.name]
    pick: dict[int, MigProfile] = {}
    for p in sorted(plain, key=lambda p: p.memory_mib):
        pick.setdefault(p.slice_count, p)
    if not {1, 2, 3} <= pick.keys():
        return None
    return {pick[1].name: 2, pick[2].name: 1, pick[3].name: 1}


def standard_configs(inventory: Inventory) -> MigPartedConfig:
    """all-disabled, all-enabled, all-<profile> and all-balanced for the GPUs present."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    models = _models(inventory)
    filtered = len(models) > 1
    for gpu in models:
        for profile in gpu.mig_profiles:
            entries = configs.setdefault(config_name(profile.name), [])
            entries.append(_entry(gpu, {profile.name: profile.max_count}, filtered))
    for gpu in models:
        layout = balanced(gpu.mig_profiles)
        if layout is not None:
            configs.setdefault("all-balanced", []).append(_entry(gpu, layout, filtered))
    return MigPartedConfig.model_validate({"version": "v1", "mig-configs": configs})
