"""The Container Device Interface side: qualified device names, the annotations the
cdi-annotations strategy returns, and the spec file containerd v2 reads from /var/run/cdi.

Every GPU and MIG device is named twice in the spec, by UUID and by index, so either
deviceIDStrategy resolves. Each device injects its device node (where it exists on the host) and
one environment variable ``NVIDIA_GPU_<index>=<uuid>``, so a container can tell which devices
CDI gave it; the spec-wide ``NVIDIA_VISIBLE_DEVICES=void`` keeps NVIDIA's legacy runtime hook
from injecting GPUs a second time, as nvidia-ctk's specs do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpu_operator.agent.deviceplugin.resources import Device, physical_devices

CDI_VERSION = "0.6.0"
CDI_KIND = "nvidia.com/gpu"
SPEC_FILE = "gpu-operator.nvidia.com-gpu.json"
ANNOTATION_PLUGIN = "nvidia-device-plugin"  # the plugin name NVIDIA puts in annotation keys
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def qualified_name(device_id: str) -> str:
    return f"{CDI_KIND}={device_id}"


def annotations_for(prefix: str, response_id: str, names: Sequence[str]) -> dict[str, str]:
    """``cdi.k8s.io/nvidia-device-plugin_<id>: nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b``."""
    return {f"{prefix}{ANNOTATION_PLUGIN}_{response_id}": ",".join(names)} if names else {}


def device_env(device: Device) -> str:
    return f"NVIDIA_GPU_{device.index.replace(':', '_')}={device.uuid}"


def gpu_node(device: Device) -> str:
    return f"/dev/nvidia{device.minor}"


def host_path(dev_root: str, path: str) -> str:
    return path if dev_root in ("", "/") else os.path.join(dev_root, path.lstrip("/"))


def _node(path: str, dev_root: str) -> dict[str, str]:
    host = host_path(dev_root, path)
    return {"path": path} if host == path else {"path": path, "hostPath": host}


def cdi_spec(
    devices: Iterable[Device], present: frozenset[str], dev_root: str = "/"
) -> dict[str, Any]:
    """The spec for these devices; ``present`` lists the /dev paths that exist on the host
    (a node that does not exist would make the runtime refuse the container)."""
    entries: list[dict[str, Any]] = []
    for device in physical_devices(devices):
        edits: dict[str, Any] = {"env": [device_env(device)]}
        if gpu_node(device) in present:
            edits["deviceNodes"] = [_node(gpu_node(device), dev_root)]
        for name in dict.fromkeys((device.uuid, device.index)):
            entries.append({"name": name, "containerEdits": edits})
    common: dict[str, Any] = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    control = [_node(p, dev_root) for p in CONTROL_NODES if p in present]
    if control:
        common["deviceNodes"] = control
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": entries,
        "containerEdits": common,
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
