"""What NodePrepareResources does for one claim, as pure functions, and the CDI spec it writes.

The kubelet sends only the claim's namespace, name and UID; the allocation is in the claim's
status (``status.allocation.devices.results``). The results of this driver in this node's pool
become CDI devices in a per-claim spec, vendor ``k8s.gpu.nvidia.com`` as NVIDIA's DRA driver
names it, kind ``k8s.gpu.nvidia.com/device``, one device ``<claim uid>-<device name>`` per
allocated device. Each device injects its device nodes (a MIG device: its GPU's and its
capability nodes, where they exist on the host) and ``NVIDIA_DRA_<DEVICE>=<uuid>``, so a container
can tell what it was given; the spec-wide edits carry the driver (libraries, binaries, firmware,
control nodes: :mod:`gpu_operator.agent.driver_cdi`) and ``NVIDIA_VISIBLE_DEVICES=void``, which
keeps NVIDIA's legacy hook from injecting GPUs again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.dra.devices import DRIVER, DeviceRef
from gpu_operator.agent.driver_cdi import (
    CDI_VERSION,
    HostDriver,
    common_edits,
    gpu_nodes,
    mig_caps,
    mig_minors,
)

CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "claim"  # NVIDIA's DRA driver's: k8s.gpu.nvidia.com/claim=<claim uid>-<device>
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"


class PrepareError(Exception):
    """The claim cannot be prepared on this node; the message goes back to the kubelet."""


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdiIDs": list(self.cdi_ids),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedDevice:
        return cls(
            requests=tuple(data["requests"]),
            pool=str(data["pool"]),
            device=str(data["device"]),
            cdi_ids=tuple(data["cdiIDs"]),
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


def prepare_claim(
    claim: Mapping[str, Any], uid: str, node: str, refs: Mapping[str, DeviceRef]
) -> tuple[PreparedDevice, ...]:
    """The devices of ``claim`` (uid ``uid``) to hand to containers; ``refs`` are this node's
    published devices by name."""
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
    return tuple(
        PreparedDevice(
            requests=tuple(requests),
            pool=node,
            device=device,
            cdi_ids=(f"{CDI_KIND}={cdi_device_name(uid, device)}",),
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
) -> dict[str, Any]:
    """The claim's CDI spec on this driver (only device nodes present on the host: a missing
    one would make the runtime refuse the container)."""
    entries = []
    for p in prepared:
        ref = refs[p.device]
        caps = mig_caps(mig_minors(), ref.minor, *ref.mig) if ref.mig else ()
        edits: dict[str, Any] = {"env": [f"{env_name(p.device)}={ref.uuid}"]}
        nodes = gpu_nodes(driver, ref.minor, caps)
        if nodes:
            edits["deviceNodes"] = nodes
        entries.append({"name": cdi_device_name(uid, p.device), "containerEdits": edits})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": entries,
        "containerEdits": common_edits(driver),
    }
