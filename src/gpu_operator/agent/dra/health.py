"""Device taints from GPU health: what the DRA plugin puts on its ResourceSlice devices.

Pure. An unhealthy GPU's device, and the MIG devices cut from it, carry a ``NoSchedule`` taint
with NVIDIA's keys: ``gpu.nvidia.com/xid`` (the value: the XID) and ``gpu.nvidia.com/gpu-lost``;
a fault NVIDIA's plugin does not watch for (ECC, a row remap, a slowdown where enabled) has
this project's ``gpu.nvidia.com/unhealthy`` (the value: what). The scheduler places no new
claim on a tainted device; claims already there stay (never ``NoExecute``). The health state
is the device plugin's (:mod:`gpu_operator.agent.gpuhealth`): a taint goes once the GPU has
been quiet for the quiet period, not when the plugin restarts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_operator.agent.dra.devices import DRIVER
from gpu_operator.agent.gpuhealth.state import FaultKind, GpuHealth

XID_TAINT = f"{DRIVER}/xid"
LOST_TAINT = f"{DRIVER}/gpu-lost"
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
EFFECT = "NoSchedule"
EVENT_COMPONENT = "nvidia-dra-driver"  # the source of its GPUHealthy Events
_OTHER = {
    FaultKind.ECC: "ecc",
    FaultKind.ROW_REMAP: "row-remap",
    FaultKind.THERMAL: "thermal",
    FaultKind.POWER: "power",
}


def gpu_taints(gpu: GpuHealth) -> list[dict[str, str]]:
    """The taints of an unhealthy GPU's devices, one per key, the most severe kind first."""
    if gpu.healthy:
        return []
    kinds = {s.kind for s in gpu.seen}
    taints = []
    if FaultKind.LOST in kinds:
        taints.append({"key": LOST_TAINT, "effect": EFFECT})
    xids = [m.group(1) for s in gpu.seen if (m := re.fullmatch(r"XID (\d+)", s.what))]
    if xids:
        taints.append({"key": XID_TAINT, "value": xids[-1], "effect": EFFECT})
    other = sorted((k for k in kinds if k in _OTHER), reverse=True)
    if other:
        taints.append({"key": UNHEALTHY_TAINT, "value": _OTHER[other[0]], "effect": EFFECT})
    if not taints:  # unhealthy with nothing kept to say why (carried over a restart)
        taints.append({"key": UNHEALTHY_TAINT, "value": "unknown", "effect": EFFECT})
    return taints


def _uuid(device: Mapping[str, Any], attribute: str) -> str | None:
    value = ((device.get("attributes") or {}).get(attribute) or {}).get("string")
    return str(value) if value is not None else None


def taint_devices(
    devices: Sequence[dict[str, Any]], health: Mapping[str, GpuHealth]
) -> list[dict[str, Any]]:
    """``devices`` with the taints of their GPU (``parentUUID`` for a MIG device)."""
    out = []
    for device in devices:
        gpu = health.get(_uuid(device, "parentUUID") or _uuid(device, "uuid") or "")
        taints = gpu_taints(gpu) if gpu is not None else []
        out.append({**device, "taints": taints} if taints else dict(device))
    return out
