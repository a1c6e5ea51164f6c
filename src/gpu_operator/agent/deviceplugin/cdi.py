"""The Container Device Interface side: qualified device names, the annotations the
cdi-annotations strategy returns, and the spec file containerd v2 reads from /var/run/cdi.

The kind is NVIDIA's plugin's own, ``k8s.device-plugin.nvidia.com/gpu``: the toolkit's node-wide
spec holds ``nvidia.com/gpu``, and two specs of one kind naming the same devices would conflict.
Every GPU and MIG device is named twice, by UUID and by index, so either deviceIDStrategy
resolves. Each device injects its device nodes (a MIG device: its GPU's and its capability
nodes) and ``NVIDIA_GPU_<index>=<uuid>``; the spec-wide edits carry the driver (its libraries,
binaries, firmware, control nodes: :mod:`gpu_operator.agent.driver_cdi`), so a container from
any image can run a CUDA program with nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpu_operator.agent.deviceplugin.resources import Device, physical_devices
from gpu_operator.agent.driver_cdi import (
    CDI_VERSION,
    HostDriver,
    common_edits,
    gpu_nodes,
    mig_caps,
    mig_minors,
)

CDI_VENDOR = "k8s.device-plugin.nvidia.com"
CDI_KIND = f"{CDI_VENDOR}/gpu"
SPEC_FILE = f"{CDI_VENDOR}-gpu.json"
ANNOTATION_PLUGIN = "nvidia-device-plugin"  # the plugin name NVIDIA puts in annotation keys


def qualified_name(device_id: str) -> str:
    return f"{CDI_KIND}={device_id}"


def annotations_for(prefix: str, response_id: str, names: Sequence[str]) -> dict[str, str]:
    """``cdi.k8s.io/nvidia-device-plugin_<id>: <kind>=GPU-a,<kind>=GPU-b``."""
    return {f"{prefix}{ANNOTATION_PLUGIN}_{response_id}": ",".join(names)} if names else {}


def device_env(device: Device) -> str:
    return f"NVIDIA_GPU_{device.index.replace(':', '_')}={device.uuid}"


def device_paths(device: Device) -> tuple[str, ...]:
    """The nodes a device needs, by their path in a container (present or not)."""
    caps = mig_caps(mig_minors(), device.minor, device.mig.gi, device.mig.ci) if device.mig else ()
    return (f"/dev/nvidia{device.minor}", *caps)


def cdi_spec(devices: Iterable[Device], driver: HostDriver) -> dict[str, Any]:
    """The spec for these devices on this driver (only device nodes present on the host: a
    missing one would make the runtime refuse the container)."""
    entries: list[dict[str, Any]] = []
    for device in physical_devices(devices):
        edits: dict[str, Any] = {"env": [device_env(device)]}
        nodes = gpu_nodes(driver, device.minor, device_paths(device)[1:])
        if nodes:
            edits["deviceNodes"] = nodes
        for name in dict.fromkeys((device.uuid, device.index)):
            entries.append({"name": name, "containerEdits": edits})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": entries,
        "containerEdits": common_edits(driver),
    }


def write_spec(directory: Path, spec: dict[str, Any]) -> Path:
    """Atomically (rename), so containerd never reads half a spec."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SPEC_FILE
    tmp = directory / f".{SPEC_FILE}.tmp"
    tmp.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def remove_spec(directory: Path) -> None:
    """When no CDI strategy is configured any more: no stale devices for the runtime."""
    (directory / SPEC_FILE).unlink(missing_ok=True)
