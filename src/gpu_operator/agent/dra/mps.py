"""MPS per claim, decided: which devices share a control daemon, and what runs it (pure).

As NVIDIA's DRA driver does it: the devices of one claim that share one MPS config get one
control daemon, a Deployment ``mps-control-daemon-<id>`` pinned to the node (``id``: the claim's
UID and the first five hex digits of the SHA-256 of the devices' UUIDs), running the driver's
``nvidia-cuda-mps-control -d`` with the config's defaults. Its pipe, log and shared-memory
directories are the plugin's, ``<plugin dir>/mps/<id>/``; a container given the claim gets
``CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`` and the pipe and shm mounts, so every container of
every pod sharing the claim reaches the one daemon. The I/O is
:mod:`gpu_operator.agent.dra.mps_control`'s; the daemon's process is
:mod:`gpu_operator.agent.dra.mps_daemon`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.agent.dra.devices import DeviceRef
from gpu_operator.api import draconfig
from gpu_operator.api.draconfig import DeviceConfig, MpsConfig, VfioDeviceConfig

NAME_PREFIX = "mps-control-daemon-"
COMPONENT = "mps-control-daemon"
PIPE_DIR = "/tmp/nvidia-mps"  # where clients and the daemon find the pipe (NVIDIA's default)
LOG_DIR = "/var/log/nvidia-mps"
SHM_DIR = "/dev/shm"
DRIVER_ROOT = "/driver-root"  # where the daemon's pod mounts the driver root
STARTED = "startup.log"  # in the log directory once the daemon holds its settings
# Environment of the daemon's container (mps_daemon reads them).
ENV_THREADS = "MPS_DEFAULT_ACTIVE_THREAD_PERCENTAGE"
ENV_LIMITS = "MPS_DEFAULT_PINNED_DEVICE_MEMORY_LIMITS"  # "<uuid>=<n>M,..."
CLAIM_LABEL = "gpu.nvidia.com/claim-uid"


@dataclass(frozen=True)
class MpsDaemon:
    """One claim's control daemon: for ``devices`` (CUDA_VISIBLE_DEVICES), on ``gpus`` (whole
    GPUs, put in EXCLUSIVE_PROCESS while it runs), with the config's defaults."""

    id: str
    claim_uid: str
    devices: tuple[str, ...]
    gpus: tuple[str, ...]
    thread_percentage: int | None = None
    pinned_limits: Mapping[str, str] = field(default_factory=dict)  # uuid -> "<MiB>M"

    @property
    def name(self) -> str:
        return f"{NAME_PREFIX}{self.id}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "claimUID": self.claim_uid,
            "devices": list(self.devices),
            "gpus": list(self.gpus),
            "pinnedLimits": dict(self.pinned_limits),
        }
        if self.thread_percentage is not None:
            out["threadPercentage"] = self.thread_percentage
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MpsDaemon:
        threads = data.get("threadPercentage")
        return cls(
            id=str(data["id"]),
            claim_uid=str(data["claimUID"]),
            devices=tuple(data["devices"]),
            gpus=tuple(data["gpus"]),
            thread_percentage=int(threads) if threads is not None else None,
            pinned_limits=dict(data.get("pinnedLimits") or {}),
        )


@dataclass(frozen=True)
class MpsDirs:
    """A daemon's directories on the host (the plugin's directory is mounted at its host path)."""

    root: Path

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def shm(self) -> Path:
        return self.root / "shm"

    @property
    def log(self) -> Path:
        return self.root / "log"


def dirs(plugin_dir: Path, daemon_id: str) -> MpsDirs:
    return MpsDirs(plugin_dir / "mps" / daemon_id)


def daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    digest = hashlib.sha256(",".join(uuids).encode()).hexdigest()
    return f"{claim_uid}-{digest[:5]}"


def mps_config(config: DeviceConfig) -> MpsConfig | None:
    """The MPS settings of a device's config, or None when it does not share with MPS."""
    if isinstance(config, VfioDeviceConfig):  # a GPU on vfio-pci shares nothing
        return None
    sharing = config.sharing
    if sharing is None or sharing.strategy != draconfig.MPS:
        return None
    return sharing.mps_config or MpsConfig()


def daemons(
    claim_uid: str,
    configs: Mapping[str, DeviceConfig],
    refs: Mapping[str, DeviceRef],
) -> dict[str, MpsDaemon]:
    """The daemon of each of a claim's devices that shares with MPS, by device name: one per
    distinct MPS config, over the devices it applies to (in name order). A per-device limit
    naming no device of the group is a :class:`~gpu_operator.api.draconfig.ConfigError`
    (admission cannot see which devices a claim gets)."""
    groups: dict[str, tuple[MpsConfig, list[str]]] = {}
    for device in sorted(configs):
        mps = mps_config(configs[device])
        if mps is not None:
            groups.setdefault(mps.model_dump_json(), (mps, []))[1].append(device)
    out: dict[str, MpsDaemon] = {}
    for mps, devices in groups.values():
        uuids = [refs[d].uuid for d in devices]
        daemon = MpsDaemon(
            id=daemon_id(claim_uid, uuids),
            claim_uid=claim_uid,
            devices=tuple(uuids),
            gpus=tuple(sorted({refs[d].gpu_uuid for d in devices})),
            thread_percentage=mps.default_active_thread_percentage,
            pinned_limits=draconfig.pinned_limits(mps, uuids),
        )
        out.update({d: daemon for d in devices})
    return out


def limits_text(limits: Mapping[str, str]) -> str:
    return ",".join(f"{uuid}={limit}" for uuid, limit in sorted(limits.items()))


def parse_limits(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def _host_volume(name: str, path: str | Path) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": str(path)}}


@dataclass(frozen=True)
class DaemonPod:
    """What the daemon's pod is made of, besides the daemon: where it runs and from what."""

    node: str
    namespace: str
    image: str
    host_driver_root: str
    pull_policy: str = "IfNotPresent"
    pull_secrets: tuple[str, ...] = ()


def deployment(daemon: MpsDaemon, where: MpsDirs, pod: DaemonPod) -> dict[str, Any]:
    """The daemon's Deployment: one replica bound to the node (no scheduling: it must run where
    the claim was prepared), privileged, the driver root and its three directories mounted;
    Ready once the daemon holds its settings (it writes ``startup.log``)."""
    labels = {"app": daemon.name, "app.kubernetes.io/component": COMPONENT}
    env = [
        {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(daemon.devices)},
        {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": PIPE_DIR},
        {"name": "CUDA_MPS_LOG_DIRECTORY", "value": LOG_DIR},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": ENV_LIMITS, "value": limits_text(daemon.pinned_limits)},
    ]
    if daemon.thread_percentage is not None:
        env.append({"name": ENV_THREADS, "value": str(daemon.thread_percentage)})
    container = {
        "name": COMPONENT,
        "image": pod.image,
        "imagePullPolicy": pod.pull_policy,
        "args": ["agent", "mps-claim-daemon", "--driver-root", DRIVER_ROOT],
        "env": env,
        "securityContext": {"privileged": True, "runAsUser": 0},
        "readinessProbe": {
            "exec": {"command": ["cat", f"{LOG_DIR}/{STARTED}"]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
        "volumeMounts": [
            {"name": "driver-root", "mountPath": DRIVER_ROOT, "readOnly": True},
            {"name": "mps-shm", "mountPath": SHM_DIR},
            {"name": "mps-pipe", "mountPath": PIPE_DIR},
            {"name": "mps-log", "mountPath": LOG_DIR},
        ],
    }
    spec: dict[str, Any] = {
        "nodeName": pod.node,
        "hostPID": True,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 10,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": [
            _host_volume("driver-root", pod.host_driver_root),
            _host_volume("mps-shm", where.shm),
            _host_volume("mps-pipe", where.pipe),
            _host_volume("mps-log", where.log),
        ],
    }
    if pod.pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in pod.pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": daemon.name,
            "namespace": pod.namespace,
            "labels": {**labels, CLAIM_LABEL: daemon.claim_uid},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": daemon.name}},
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def cdi_edits(where: MpsDirs) -> dict[str, Any]:
    """What a container given an MPS-shared device gets: the daemon's pipe and shm."""
    options = ["rw", "nosuid", "nodev", "bind"]
    return {
        "env": [f"CUDA_MPS_PIPE_DIRECTORY={PIPE_DIR}"],
        "mounts": [
            {"hostPath": str(where.shm), "containerPath": SHM_DIR, "options": options},
            {"hostPath": str(where.pipe), "containerPath": PIPE_DIR, "options": options},
        ],
    }
