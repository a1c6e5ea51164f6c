"""What NodePrepareResources does for one claim, as pure functions, and the CDI spec it writes.

The kubelet sends only the claim's namespace, name and UID; the allocation is in the claim's
status (``status.allocation.devices.results``). The results of this driver in this node's pool
become CDI devices in a per-claim spec, vendor ``k8s.gpu.nvidia.com`` as NVIDIA's DRA driver
names it, kind ``k8s.gpu.nvidia.com/device``, one device ``<claim uid>-<device name>`` per
allocated device. Each device injects its device nodes (a MIG device: its GPU's and its
capability nodes, where they exist on the host) and ``NVIDIA_DRA_<DEVICE>=<uuid>``, so a container
can tell what it was given; the spec-wide edits carry the driver (libraries, binaries, firmware,
control nodes: :mod:`gpu_operator.agent.driver_cdi`) and ``NVIDIA_VISIBLE_DEVICES=void``, which
keeps NVIDIA's legacy hook from injecting GPUs again. A VFIO device (PassthroughSupport) gives
its IOMMU group's ``/dev/vfio/<group>`` (or, with PreferIommuFD on an IOMMUFD host and the API
device asked for, ``/dev/iommu`` too) and the spec ``/dev/vfio/vfio``, as NVIDIA's driver
writes it; a claim of VFIO devices only carries no driver files (the GPU is not on ``nvidia``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_operator.agent.dra import mps
from gpu_operator.agent.dra.devices import DRIVER, DeviceRef, Partition
from gpu_operator.agent.dra.mps import MpsDaemon
from gpu_operator.agent.dra.vfio import IOMMU_DEV, VFIO_CONTAINER, VFIO_DEV, VfioBinding
from gpu_operator.agent.driver_cdi import (
    CDI_VERSION,
    HostDriver,
    common_edits,
    device_node,
    gpu_nodes,
    mig_caps,
    mig_minors,
)
from gpu_operator.api import draconfig
from gpu_operator.api.draconfig import DeviceConfig, GpuSharing, VfioDeviceConfig
from gpu_operator.api.dragates import Gates

CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "claim"  # NVIDIA's DRA driver's: k8s.gpu.nvidia.com/claim=<claim uid>-<device>
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"


class PrepareError(Exception):
    """The claim cannot be prepared on this node; the message goes back to the kubelet."""


@dataclass(frozen=True)
class TimeSlice:
    """The time-slice interval a claim's config sets on one of its full GPUs."""

    uuid: str
    interval: str  # Default, Short, Medium or Long


@dataclass(frozen=True)
class CreatedMig:
    """The MIG device Prepare creates for a DynamicMIG partition: what it is to be, then (once
    created) its GPU and compute instance ids and UUID, so Unprepare destroys exactly it."""

    gpu_uuid: str
    minor: int
    partition: Partition
    gi_id: int = -1
    ci_id: int = -1
    uuid: str = ""

    @property
    def created(self) -> bool:
        return bool(self.uuid)

    def ref(self) -> DeviceRef:
        """The created device as a CDI spec needs it."""
        return DeviceRef(self.uuid, self.minor, (self.gi_id, self.ci_id), self.gpu_uuid)

    def to_json(self) -> dict[str, Any]:
        return {
            "gpuUUID": self.gpu_uuid,
            "minor": self.minor,
            "partition": self.partition.to_json(),
            "gi": self.gi_id,
            "ci": self.ci_id,
            "uuid": self.uuid,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CreatedMig:
        return cls(
            gpu_uuid=str(data["gpuUUID"]),
            minor=int(data["minor"]),
            partition=Partition.from_json(data["partition"]),
            gi_id=int(data["gi"]),
            ci_id=int(data["ci"]),
            uuid=str(data["uuid"]),
        )


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    time_slice: TimeSlice | None = None  # set at Prepare, put back to Default at Unprepare
    mps: MpsDaemon | None = None  # started at Prepare, stopped at Unprepare
    mig: CreatedMig | None = None  # created at Prepare, destroyed at Unprepare (DynamicMIG)
    vfio: VfioBinding | None = None  # on vfio-pci from Prepare to Unprepare (passthrough)

    def ref(self, refs: Mapping[str, DeviceRef]) -> DeviceRef:
        """The device to hand out: the MIG device Prepare created, else the published one."""
        return self.mig.ref() if self.mig is not None else refs[self.device]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdiIDs": list(self.cdi_ids),
        }
        if self.time_slice is not None:
            out["timeSlice"] = {"uuid": self.time_slice.uuid, "interval": self.time_slice.interval}
        if self.mps is not None:
            out["mps"] = self.mps.to_json()
        if self.mig is not None:
            out["mig"] = self.mig.to_json()
        if self.vfio is not None:
            out["vfio"] = self.vfio.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedDevice:
        slice_ = data.get("timeSlice")
        return cls(
            requests=tuple(data["requests"]),
            pool=str(data["pool"]),
            device=str(data["device"]),
            cdi_ids=tuple(data["cdiIDs"]),
            time_slice=TimeSlice(str(slice_["uuid"]), str(slice_["interval"])) if slice_ else None,
            mps=MpsDaemon.from_json(data["mps"]) if data.get("mps") else None,
            mig=CreatedMig.from_json(data["mig"]) if data.get("mig") else None,
            vfio=VfioBinding.from_json(data["vfio"]) if data.get("vfio") else None,
        )


def spec_file_name(claim_uid: str) -> str:
    """The transient spec name the CDI library uses: ``<vendor>-<class>_<id>.json``."""
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def allocated(claim: Mapping[str, Any], node: str) -> list[Mapping[str, Any]]:
    """This driver's allocation results in this node's pool."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return [r for r in results if r.get("driver") == DRIVER and r.get("pool") == node]


def device_configs(
    claim: Mapping[str, Any],
    results: list[Mapping[str, Any]],
    refs: Mapping[str, DeviceRef],
    gates: Gates,
) -> dict[str, DeviceConfig]:
    """Each allocated device's config, by device name, from the allocation's configs (the
    scheduler copies the DeviceClass's, then the claim's, in NVIDIA's order of precedence).
    A config this plugin cannot apply is refused here, before anything is written: a sharing
    setting that would be ignored is an error, never a silently plain GPU."""
    entries = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "config"
    ) or []
    try:
        configs = [
            *draconfig.defaults(gates),
            *draconfig.claim_configs(entries, gates, "status.allocation.devices.config"),
        ]
        found: dict[str, DeviceConfig] = {}
        for r in results:
            kind = refs[r["device"]].kind
            found[r["device"]] = draconfig.config_for(
                configs,
                str(r["request"]),
                "vfio" if kind == "vfio" else "mig" if kind == "mig" else "gpu",
            )
    except draconfig.ConfigError as err:
        raise PrepareError("; ".join(err.problems)) from None
    return found


def time_slice(config: DeviceConfig, ref: DeviceRef) -> TimeSlice | None:
    """The interval a full GPU's TimeSlicing config sets on it; a MIG device has none of its
    own (it is scheduled as its GPU is), and a config without sharing sets nothing."""
    if isinstance(config, VfioDeviceConfig):
        return None
    sharing = config.sharing
    if (
        ref.is_mig
        or not isinstance(sharing, GpuSharing)
        or sharing.strategy != draconfig.TIME_SLICING
    ):
        return None
    slicing = sharing.time_slicing_config
    return TimeSlice(ref.uuid, (slicing.interval if slicing else None) or "Default")


def to_create(ref: DeviceRef) -> CreatedMig | None:
    """The MIG device to create for a DynamicMIG partition; None for any other device."""
    if ref.partition is None:
        return None
    return CreatedMig(ref.parent, ref.minor, ref.partition)


def to_bind(config: DeviceConfig, ref: DeviceRef) -> VfioBinding | None:
    """The GPU to bind to ``vfio-pci`` for a VFIO device, with its config's IOMMU choices (its
    group is known once bound); None for any other device."""
    if not ref.vfio:
        return None
    iommu = config.iommu if isinstance(config, VfioDeviceConfig) else None
    return VfioBinding(
        ref.vfio,
        "",
        ref.minor,
        prefer_iommufd=iommu is not None and iommu.backend_policy == draconfig.PREFER_IOMMUFD,
        api_device=bool(iommu and iommu.enable_api_device),
    )


def prepare_claim(
    claim: Mapping[str, Any],
    uid: str,
    node: str,
    refs: Mapping[str, DeviceRef],
    gates: Gates,
) -> tuple[PreparedDevice, ...]:
    """The devices of ``claim`` (uid ``uid``) to hand to containers, with what their configs
    set on the GPUs; ``refs`` are this node's published devices by name. Its configs are
    checked first (:func:`device_configs`)."""
    if (claim.get("metadata") or {}).get("uid") != uid:
        raise PrepareError(f"claim UID {uid} is not the claim's ({claim['metadata'].get('uid')})")
    results = allocated(claim, node)
    if not results:
        raise PrepareError(f"claim has no allocation of {DRIVER} devices on node {node}")
    by_device: dict[str, list[str]] = {}
    for r in results:
        if r["device"] not in refs:
            raise PrepareError(f"device {r['device']} is not on this node (any more)")
        by_device.setdefault(r["device"], []).append(str(r["request"]))
    configs = device_configs(claim, results, refs, gates)
    try:
        daemons = mps.daemons(uid, configs, refs)
    except draconfig.ConfigError as err:  # what admission cannot judge: the devices given
        raise PrepareError("; ".join(err.problems)) from None
    return tuple(
        PreparedDevice(
            requests=tuple(requests),
            pool=node,
            device=device,
            cdi_ids=(f"{CDI_KIND}={cdi_device_name(uid, device)}",),
            time_slice=time_slice(configs[device], refs[device]),
            mps=daemons.get(device),
            mig=to_create(refs[device]),
            vfio=to_bind(configs[device], refs[device]),
        )
        for device, requests in by_device.items()
    )


def env_name(device: str) -> str:
    return "NVIDIA_DRA_" + re.sub(r"[^A-Z0-9]", "_", device.upper())


def cdi_spec(
    uid: str,
    prepared: tuple[PreparedDevice, ...],
    refs: Mapping[str, DeviceRef],
    driver: HostDriver,
    plugin_dir: Path | None = None,
    iommufd: bool = False,
) -> dict[str, Any]:
    """The claim's CDI spec on this driver (only device nodes present on the host: a missing
    one would make the runtime refuse the container); a device shared with MPS also gives its
    daemon's pipe and shm (under ``plugin_dir``); a MIG device Prepare created is given by
    what it created."""
    entries = []
    for p in prepared:
        if p.vfio is not None:
            entries.append(
                {
                    "name": cdi_device_name(uid, p.device),
                    "containerEdits": {"deviceNodes": vfio_nodes(driver, p.vfio, iommufd)},
                }
            )
            continue
        ref = p.ref(refs)
        caps = mig_caps(mig_minors(), ref.minor, *ref.mig) if ref.mig else ()
        edits: dict[str, Any] = {"env": [f"{env_name(p.device)}={ref.uuid}"]}
        nodes = gpu_nodes(driver, ref.minor, caps)
        if nodes:
            edits["deviceNodes"] = nodes
        if p.mps is not None and plugin_dir is not None:
            shared = mps.cdi_edits(mps.dirs(plugin_dir, p.mps.id))
            edits["env"] += shared["env"]
            edits["mounts"] = shared["mounts"]
        entries.append({"name": cdi_device_name(uid, p.device), "containerEdits": edits})
    if all(p.vfio is not None for p in prepared):
        return {
            "cdiVersion": CDI_VERSION,
            "kind": CDI_KIND,
            "devices": entries,
            "containerEdits": vfio_common_edits(driver, prepared, iommufd),
        }
    common = common_edits(driver)
    if any(p.vfio is not None for p in prepared):
        extra = vfio_common_edits(driver, prepared, iommufd)["deviceNodes"]
        common = {**common, "deviceNodes": [*(common.get("deviceNodes") or []), *extra]}
    if any(p.mps is not None for p in prepared) and plugin_dir is not None:
        # The claim's own daemon's pipe and shm, not a node-wide daemon's the driver root has.
        taken = {mps.PIPE_DIR, mps.SHM_DIR}
        mounts = [m for m in common.get("mounts") or [] if m["containerPath"] not in taken]
        common = (
            {**common, "mounts": mounts}
            if mounts
            else {k: v for k, v in common.items() if k != "mounts"}
        )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": entries,
        "containerEdits": common,
    }


def vfio_nodes(driver: HostDriver, binding: VfioBinding, iommufd: bool) -> list[dict[str, str]]:
    """A VFIO device's own node: its IOMMU group's (the legacy backend), or its IOMMUFD
    character device where that is preferred and the host has it."""
    if binding.prefer_iommufd and iommufd and binding.cdev:
        return [device_node(driver, f"{VFIO_DEV}/devices/{binding.cdev}")]
    return [device_node(driver, f"{VFIO_DEV}/{binding.group}")]


def vfio_common_edits(
    driver: HostDriver, prepared: tuple[PreparedDevice, ...], iommufd: bool
) -> dict[str, Any]:
    """NVIDIA's spec-wide edits of VFIO devices: ``NVIDIA_VISIBLE_DEVICES=void`` and
    ``/dev/vfio/vfio`` always (libvirt looks for it); with the API device asked for,
    ``/dev/iommu`` where IOMMUFD is preferred and present (else ``/dev/vfio/vfio`` again, as
    NVIDIA lists it; here once)."""
    nodes = [device_node(driver, VFIO_CONTAINER)]
    bindings = [p.vfio for p in prepared if p.vfio is not None]
    if any(b.api_device and b.prefer_iommufd and iommufd for b in bindings):
        nodes.append(device_node(driver, IOMMU_DEV))
    return {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": nodes}
