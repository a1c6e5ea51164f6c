"""Node health -> the ``GPUHealthy`` condition, its status patch and its Events: pure.

False names one reason, the most severe fault seen on any GPU, and a message listing each
unhealthy GPU (``GPU 3 GPU-abc...: XID 79 at 10:02:03Z, row remap pending at 10:02:04Z``).
The condition is written only when status, reason or message change, so the message holds no
clock that moves by itself; ``lastTransitionTime`` moves only with the status.

The message is also what survives a restart of the agent: :func:`seed` reads it back, so a
restarted agent keeps a node unhealthy (for a fresh quiet period) instead of reporting it
healthy before it has looked long enough.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpu_operator.agent.gpuhealth.state import FaultKind, GpuHealth, NodeHealth, Seen
from gpu_operator.labels import GPU_HEALTHY_CONDITION

HEALTHY_REASON = "GPUsHealthy"
REASONS = {
    FaultKind.LOST: "GPULost",
    FaultKind.XID: "GPUXid",
    FaultKind.ECC: "GPUEccError",
    FaultKind.ROW_REMAP: "GPURowRemap",
    FaultKind.THERMAL: "GPUThermal",
    FaultKind.POWER: "GPUPower",
}
_KINDS = {reason: kind for kind, reason in REASONS.items()}
_SEGMENT = re.compile(r"GPU (\d+) (\S+): (.*?)(?=; GPU \d+ \S+: |$)")


@dataclass(frozen=True)
class Condition:
    status: str  # "True" or "False"
    reason: str
    message: str

    @classmethod
    def of(cls, entry: Mapping[str, Any] | None) -> Condition | None:
        """The condition as a Node carries it (``status.conditions[]``), or None."""
        if not entry:
            return None
        return cls(
            str(entry.get("status") or ""),
            str(entry.get("reason") or ""),
            str(entry.get("message") or ""),
        )


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%SZ")


def describe(seen: Seen) -> str:
    return seen.what if seen.at is None else f"{seen.what} at {_clock(seen.at)}"


def node_condition(state: NodeHealth) -> Condition:
    sick = sorted((g for g in state.values() if not g.healthy), key=lambda g: (g.index, g.uuid))
    if not sick:
        count = len(state)
        return Condition("True", HEALTHY_REASON, f"{count} GPU{'' if count == 1 else 's'} healthy")
    worst = max(s.kind for g in sick for s in g.seen)
    message = "; ".join(
        f"GPU {g.index} {g.uuid}: " + ", ".join(describe(s) for s in g.seen) for g in sick
    )
    return Condition("False", REASONS[worst], message)


def seed(state: NodeHealth, previous: Condition | None, now: float) -> dict[str, GpuHealth]:
    """The GPUs a False condition written before a restart names, unhealthy again as of
    ``now`` with what it said of them (so the message reads the same)."""
    seeded = dict(state)
    if previous is None or previous.status != "False":
        return seeded
    kind = _KINDS.get(previous.reason, FaultKind.XID)
    for index, uuid, what in _SEGMENT.findall(previous.message):
        gpu = seeded.get(uuid) or GpuHealth(uuid, int(index))
        seeded[uuid] = GpuHealth(
            gpu.uuid, gpu.index, healthy=False, last_fault_s=now, seen=(Seen(kind, what, None),)
        )
    return seeded


def condition_entry(
    desired: Condition, current: Mapping[str, Any] | None, now_iso: str
) -> dict[str, Any] | None:
    """The ``status.conditions[]`` entry to write, or None when the Node has it already."""
    if Condition.of(current) == desired:
        return None
    same_status = current is not None and current.get("status") == desired.status
    transition = current.get("lastTransitionTime") if current and same_status else None
    return {
        "type": GPU_HEALTHY_CONDITION,
        "status": desired.status,
        "reason": desired.reason,
        "message": desired.message,
        "lastHeartbeatTime": now_iso,
        "lastTransitionTime": transition or now_iso,
    }


def transition_event(previous: Condition | None, desired: Condition) -> tuple[str, str, str] | None:
    """The Node Event (type, reason, message) when the condition turns False, or True again."""
    was_false = previous is not None and previous.status == "False"
    if desired.status == "False" and not was_false:
        return "Warning", "GPUUnhealthy", f"{desired.reason}: {desired.message}"
    if desired.status == "True" and was_false:
        return "Normal", "GPUHealthy", f"GPUs healthy again: {desired.message}"
    return None
