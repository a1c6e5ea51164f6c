"""`gpu-operator health status`: which GPU nodes are unhealthy or quarantined, since when and
why, read from the cluster (node conditions, labels, annotations and the ClusterPolicy status),
so any replica, or none, can answer it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.labels import HEALTH_ACTION, HEALTH_SINCE, HEALTH_STATE, UNHEALTHY_TAINT
from gpu_operator.upgrade.report import age, unix_seconds
from gpu_operator.views import NodeView

MESSAGE_WIDTH = 70


def health_states(
    nodes: Iterable[Mapping[str, Any]], now: float | None = None, *, all_nodes: bool = False
) -> list[dict[str, Any]]:
    """Each node with a ``GPUHealthy`` condition that is not True or that the remediation holds
    (every node with the condition when ``all_nodes``), by name: the condition, since when
    (unix seconds), the remediation phase and its action, the quarantine taint's effect."""
    now = time.time() if now is None else now
    states = []
    for obj in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        view = NodeView.from_k8s(obj)
        health = view.gpu_health
        phase = view.labels.get(HEALTH_STATE, "")
        if not phase and (health is None or (health.healthy and not all_nodes)):
            continue
        taint = next((t for t in view.taints if t.get("key") == UNHEALTHY_TAINT), None)
        since = (health.since or None) if health else None
        held = unix_seconds(view.annotations.get(HEALTH_SINCE)) if phase else None
        states.append(
            {
                "name": view.name,
                "gpuHealthy": health.status if health else None,
                "reason": health.reason if health else "",
                "message": health.message if health else "",
                "since": since,
                "secondsUnhealthy": None if since is None else int(now - since),
                "remediation": phase or None,
                "action": view.annotations.get(HEALTH_ACTION, "0") if phase else None,
                "remediationSince": held,
                "taint": str(taint.get("effect")) if taint else None,
            }
        )
    return states


def health_document(
    nodes: Iterable[Mapping[str, Any]],
    policy_status: Mapping[str, Any],
    now: float | None = None,
    *,
    all_nodes: bool = False,
) -> dict[str, Any]:
    """What :func:`health_report` shows, as data (``-o json|yaml``)."""
    return {
        "nodes": health_states(nodes, now, all_nodes=all_nodes),
        "healthRemediation": dict(policy_status.get("healthRemediation") or {}),
    }


def health_report(
    nodes: Iterable[Mapping[str, Any]],
    policy_status: Mapping[str, Any],
    now: float | None = None,
    *,
    all_nodes: bool = False,
    wide: bool = False,
) -> str:
    """One row per node :func:`health_states` lists, then the summary; ``wide`` prints the
    whole reason and message, which the table otherwise cuts to fit."""
    now = time.time() if now is None else now
    rows = [("NODE", "GPUHEALTHY", "FOR", "REMEDIATION", "IN STATE", "TAINT", "WHY")]
    for entry in health_states(nodes, now, all_nodes=all_nodes):
        phase = entry["remediation"] or "-"
        if phase == "remediating":
            phase += f" #{entry['action']}"
        held = entry["remediationSince"]
        rows.append(
            (
                entry["name"],
                entry["gpuHealthy"] or "-",
                "-" if entry["since"] is None else age(str(entry["since"]), now),
                phase,
                age(None if held is None else str(held), now) if entry["remediation"] else "-",
                entry["taint"] or "-",
                _why(entry, wide),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    summary = policy_status.get("healthRemediation") or {}
    lines.append("")
    lines.append(str(summary.get("message") or "GPU health remediation off"))
    return "\n".join(lines) + "\n"


def _why(entry: Mapping[str, Any], wide: bool) -> str:
    if entry["gpuHealthy"] in (None, "True"):
        return ""
    reason, message = entry["reason"], entry["message"]
    text = f"{reason}: {message}" if message else reason
    return text if wide or len(text) <= MESSAGE_WIDTH else text[: MESSAGE_WIDTH - 3] + "..."
