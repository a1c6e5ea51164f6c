"""Status conditions, as every loop's status writes them (pure).

A condition keeps its ``lastTransitionTime`` unless its status flips, so an unchanged world
gives an unchanged status and no write. ``UpgradeFailed`` is shown alike on a ClusterPolicy
and an NVIDIADriver whose canary rollout failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_operator.labels import UPGRADE_RETRY

UPGRADE_FAILED = "UpgradeFailed"


def condition(
    previous: Sequence[Mapping[str, Any]],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    generation: int,
) -> dict[str, Any]:
    old = next((c for c in previous if c.get("type") == ctype), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
        "observedGeneration": generation,
    }


def upgrade_failed(upgrade: Mapping[str, Any] | None) -> str | None:
    """The message of the ``UpgradeFailed`` condition while a failed canary rollout is rolled
    back or held (node, gate, reason), else None (no condition)."""
    rollout = (upgrade or {}).get("rollout") or {}
    failure = rollout.get("failure")
    if rollout.get("phase") not in ("rollingBack", "held") or not failure:
        return None
    state = "rolling back" if rollout["phase"] == "rollingBack" else "held"
    return (
        f"node {failure['node']}, gate {failure['gate']}: {failure['reason']} ({state}; set "
        f"annotation {UPGRADE_RETRY} to try again, or change the driver)"
    )
