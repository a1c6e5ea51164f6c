"""`gpu-operator upgrade status`: the fleet's driver upgrade as a table and a progress bar,
read from the cluster (node labels and the ClusterPolicy status), so any replica, or none,
can answer it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.labels import (
    DRIVER_POOL,
    UPGRADE_RETRY,
    UPGRADE_SINCE,
    UPGRADE_SKIP,
    UPGRADE_STATE,
    is_true,
)

BAR_WIDTH = 30


def progress_bar(done: int, total: int, failed: int = 0) -> str:
    if total <= 0:
        return "[" + " " * BAR_WIDTH + "] no managed nodes"
    filled = round(BAR_WIDTH * done / total)
    broken = min(BAR_WIDTH - filled, round(BAR_WIDTH * failed / total))
    bar = "#" * filled + "!" * broken + "." * (BAR_WIDTH - filled - broken)
    return f"[{bar}] {done}/{total} done ({100 * done // total}%)"


def age(since: str | None, now: float) -> str:
    """How long ago ``since`` (unix seconds as text) was, in a few characters."""
    try:
        seconds = int(now - float(since or ""))
    except ValueError:
        return "-"
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def pools(
    nodes: Iterable[Mapping[str, Any]], drivers: Iterable[Mapping[str, Any]]
) -> list[tuple[str, list[Mapping[str, Any]], dict[str, Any]]]:
    """Each NVIDIADriver pool, by name: its nodes and its upgrade summary (the shape of a
    ClusterPolicy's ``status.upgrade``)."""
    nodes = list(nodes)
    found = []
    for driver in sorted(drivers, key=lambda d: d["metadata"]["name"]):
        name = driver["metadata"]["name"]
        members = [n for n in nodes if (n["metadata"].get("labels") or {}).get(DRIVER_POOL) == name]
        states = [(n["metadata"].get("labels") or {}).get(UPGRADE_STATE) for n in members]
        conditions = (driver.get("status") or {}).get("conditions") or []
        line = next((c.get("message") for c in conditions if c.get("type") == "Upgrade"), "")
        summary = {
            "rollout": (driver.get("status") or {}).get("rollout"),
            # No state: never needed an upgrade (the planner counts it done too).
            "done": sum(1 for s in states if s in (None, "", "upgrade-done")),
            "failed": sum(1 for s in states if s == "upgrade-failed"),
            "total": len(members),
            "message": line,
        }
        found.append((name, members, summary))
    return found


def pool_report(
    nodes: Iterable[Mapping[str, Any]],
    drivers: Iterable[Mapping[str, Any]],
    now: float | None = None,
) -> str:
    """``status_report`` per NVIDIADriver pool: each pool's nodes, progress and plan line."""
    parts = [
        f"POOL {name} ({len(members)} nodes)\n"
        + status_report(members, {"upgrade": summary}, now, all_nodes=True)
        for name, members, summary in pools(nodes, drivers)
    ]
    return "\n".join(parts) if parts else "no NVIDIADriver pools\n"


def pool_document(
    nodes: Iterable[Mapping[str, Any]],
    drivers: Iterable[Mapping[str, Any]],
    now: float | None = None,
) -> dict[str, Any]:
    """What :func:`pool_report` shows, as data (``-o json|yaml``)."""
    return {
        "pools": [
            {"name": name, "nodes": node_states(members, now, all_nodes=True), "upgrade": summary}
            for name, members, summary in pools(nodes, drivers)
        ]
    }


def node_states(
    nodes: Iterable[Mapping[str, Any]], now: float | None = None, *, all_nodes: bool = False
) -> list[dict[str, Any]]:
    """Each node the table shows, by name: its upgrade state (None: never had one), whether it
    is skipped, since when (unix seconds) and for how long, and whether it is schedulable;
    nodes that never had an upgrade state are left out unless ``all_nodes``."""
    now = time.time() if now is None else now
    states = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        if UPGRADE_STATE not in labels and labels.get(UPGRADE_SKIP) != "true" and not all_nodes:
            continue
        since = unix_seconds((meta.get("annotations") or {}).get(UPGRADE_SINCE))
        states.append(
            {
                "name": meta["name"],
                "state": labels.get(UPGRADE_STATE) or None,
                "skipped": is_true(labels.get(UPGRADE_SKIP)),
                "since": since,
                "secondsInState": None if since is None else int(now - since),
                "schedulable": not (node.get("spec") or {}).get("unschedulable"),
            }
        )
    return states


def unix_seconds(text: str | None) -> float | None:
    """An annotation's unix seconds (as text); None when absent or not a number."""
    try:
        return float(text or "")
    except ValueError:
        return None


def status_document(
    nodes: Iterable[Mapping[str, Any]],
    policy_status: Mapping[str, Any],
    now: float | None = None,
    *,
    all_nodes: bool = False,
) -> dict[str, Any]:
    """What :func:`status_report` shows, as data (``-o json|yaml``)."""
    return {
        "nodes": node_states(nodes, now, all_nodes=all_nodes),
        "upgrade": dict(policy_status.get("upgrade") or {}),
    }


def status_report(
    nodes: Iterable[Mapping[str, Any]],
    policy_status: Mapping[str, Any],
    now: float | None = None,
    *,
    all_nodes: bool = False,
) -> str:
    """Per-node table of upgrade state, time in state and schedulability, then the summary;
    nodes that never had an upgrade state are left out unless ``all_nodes``."""
    now = time.time() if now is None else now
    rows = [("NODE", "STATE", "IN STATE", "SCHEDULABLE")]
    for entry in node_states(nodes, now, all_nodes=all_nodes):
        state = entry["state"] or "-"
        if entry["skipped"]:
            state += " (skipped)"
        since = None if entry["since"] is None else str(entry["since"])
        rows.append(
            (entry["name"], state, age(since, now), "yes" if entry["schedulable"] else "no")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    summary = policy_status.get("upgrade") or {}
    lines.append("")
    lines.append(
        progress_bar(
            int(summary.get("done", 0)), int(summary.get("total", 0)), int(summary.get("failed", 0))
        )
    )
    if summary.get("message"):
        lines.append(str(summary["message"]))
    if summary.get("rollout"):
        lines.append(rollout_line(summary["rollout"]))
    return "\n".join(lines) + "\n"


PHASE_WORDS = {
    "canary": "canary upgrading",
    "soaking": "canary soaking",
    "fleet": "the fleet follows",
    "rollingBack": "FAILED: rolling the canary back",
    "held": "FAILED: held",
    "done": "done",
}


def rollout_line(rollout: Mapping[str, Any]) -> str:
    """The canary rollout in one line: phase, canary nodes, since, the failed gate, the hold."""
    phase = str(rollout.get("phase") or "")
    words = [f"rollout {rollout.get('target', '?')}: {PHASE_WORDS.get(phase, phase)}"]
    if rollout.get("nodes") and phase != "done":
        words.append(f"canary {', '.join(rollout['nodes'])}")
    if rollout.get("since") and phase != "done":
        words.append(f"since {rollout['since']}")
    failure = rollout.get("failure")
    if failure:
        words.append(f"node {failure['node']}, gate {failure['gate']}: {failure['reason']}")
    if phase == "held":
        words.append(f"waiting for a new driver spec or annotation {UPGRADE_RETRY}")
    return "; ".join(words)
