"""The operator's GPU reset request and the agent's answer: pure.

The operator sets ``nvidia.com/gpu-health.reset-requested=<value>`` on the Node; the agent
resets each unhealthy GPU that no process holds and answers with
``nvidia.com/gpu-health.reset-done=<value>:<outcome>``. A request already answered (the answer
starts with ``<value>:``) is never carried out twice, so a restarted agent or a re-read Node
cannot reset a GPU again for the same request. A GPU whose processes NVML cannot list is not
reset: unknown is not idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_operator.labels import HEALTH_RESET_DONE, HEALTH_RESET_REQUESTED


def pending_request(annotations: Mapping[str, str]) -> str | None:
    """The request not answered yet, or None."""
    value = (annotations.get(HEALTH_RESET_REQUESTED) or "").strip()
    if not value or (annotations.get(HEALTH_RESET_DONE) or "").startswith(value + ":"):
        return None
    return value


@dataclass(frozen=True)
class ResetPlan:
    reset: tuple[tuple[int, str], ...]  # (index, UUID) of the GPUs to reset
    refused: tuple[str, ...]  # why the others are not


def plan_reset(
    unhealthy: Sequence[tuple[int, str]], processes: Mapping[str, tuple[int, ...] | None]
) -> ResetPlan:
    """Which unhealthy GPUs (index, UUID) to reset, given the pids on each (None: unknown)."""
    reset: list[tuple[int, str]] = []
    refused: list[str] = []
    for index, uuid in sorted(unhealthy):
        pids = processes.get(uuid)
        if pids is None:
            refused.append(f"{uuid} processes unknown")
        elif pids:
            refused.append(f"{uuid} in use by pid {','.join(map(str, pids))}")
        else:
            reset.append((index, uuid))
    return ResetPlan(tuple(reset), tuple(refused))


def outcome(plan: ResetPlan, failed: Mapping[str, str]) -> tuple[bool, str]:
    """(all went well, the outcome text): ``reset GPU-a,GPU-b``, ``refused: GPU-c in use by
    pid 123``, ``failed: GPU-d (why)``, joined by ``; ``."""
    done = [uuid for _, uuid in plan.reset if uuid not in failed]
    parts = []
    if done:
        parts.append("reset " + ",".join(done))
    if plan.refused:
        parts.append("refused: " + ", ".join(plan.refused))
    if failed:
        parts.append("failed: " + ", ".join(f"{u} ({why})" for u, why in sorted(failed.items())))
    if not parts:
        return True, "nothing to reset: no unhealthy GPU"
    return not plan.refused and not failed, "; ".join(parts)
