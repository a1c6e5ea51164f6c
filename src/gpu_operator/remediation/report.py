"""`gpu-operator health status`: which GPU nodes are unhealthy or quarantined, since when and
why, read from the cluster (node conditions, labels, annotations and the ClusterPolicy status),
so any replica, or none, can answer it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.labels import HEALTH_ACTION, HEALTH_SINCE, HEALTH_STATE, UNHEALTHY_TAINT
from gpu_operator.upgrade.report import age
from gpu_operator.views import GpuHealth, NodeView

MESSAGE_WIDTH = 70


def health_report(
    nodes: Iterable[Mapping[str, Any]],
    policy_status: Mapping[str, Any],
    now: float | None = None,
    *,
    all_nodes: bool = False,
) -> str:
    """One row per node with a ``GPUHealthy`` condition that is not True or that the
    remediation holds (every node with the condition when ``all_nodes``), then the summary."""
    now = time.time() if now is None else now
    rows = [("NODE", "GPUHEALTHY", "FOR", "REMEDIATION", "IN STATE", "TAINT", "WHY")]
    for obj in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        view = NodeView.from_k8s(obj)
        health = view.gpu_health
        phase = view.labels.get(HEALTH_STATE, "")
        if not phase and (health is None or (health.healthy and not all_nodes)):
            continue
        if phase == "remediating":
            phase += f" #{view.annotations.get(HEALTH_ACTION, '0')}"
        taint = next((t for t in view.taints if t.get("key") == UNHEALTHY_TAINT), None)
        rows.append(
            (
                view.name,
                health.status if health else "-",
                _since(health, now),
                phase or "-",
                age(view.annotations.get(HEALTH_SINCE), now) if phase else "-",
                str(taint.get("effect")) if taint else "-",
                _why(health),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    summary = policy_status.get("healthRemediation") or {}
    lines.append("")
    lines.append(str(summary.get("message") or "GPU health remediation off"))
    return "\n".join(lines) + "\n"


def _since(health: GpuHealth | None, now: float) -> str:
    if health is None or not health.since:
        return "-"
    return age(str(health.since), now)


def _why(health: GpuHealth | None) -> str:
    if health is None or health.healthy:
        return ""
    text = f"{health.reason}: {health.message}" if health.message else health.reason
    return text if len(text) <= MESSAGE_WIDTH else text[: MESSAGE_WIDTH - 3] + "..."
