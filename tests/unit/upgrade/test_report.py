"""`gpu-operator upgrade status` output."""

from __future__ import annotations

from typing import Any

from gpu_operator.upgrade.report import progress_bar, status_report


def node(name: str, state: str | None, since: int = 1000, cordoned: bool = False) -> dict[str, Any]:
    labels = {"nvidia.com/gpu-driver-upgrade-state": state} if state else {}
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"nvidia.com/gpu-driver-upgrade-state.since": str(since)},
        },
        "spec": {"unschedulable": True} if cordoned else {},
    }


def test_progress_bar() -> None:
    assert progress_bar(0, 0) == "[" + " " * 30 + "] no managed nodes"
    assert progress_bar(3, 6) == "[" + "#" * 15 + "." * 15 + "] 3/6 done (50%)"
    assert progress_bar(3, 6, failed=1) == "[" + "#" * 15 + "!" * 5 + "." * 10 + "] 3/6 done (50%)"


def test_report_lists_managed_nodes_with_time_in_state() -> None:
    nodes = [
        node("gpu-b", "pod-restart-required", since=1000, cordoned=True),
        node("gpu-a", "upgrade-done", since=100),
        node("cpu-a", None),
    ]
    status = {"upgrade": {"total": 2, "done": 1, "failed": 0, "message": "1/2 done"}}
    out = status_report(nodes, status, now=1090).splitlines()
    assert out[0].split() == ["NODE", "STATE", "IN", "STATE", "SCHEDULABLE"]
    assert out[1].split() == ["gpu-a", "upgrade-done", "16m", "yes"]
    assert out[2].split() == ["gpu-b", "pod-restart-required", "90s", "no"]
    assert "cpu-a" not in "\n".join(out)
    assert out[-2].endswith("1/2 done (50%)")
    assert out[-1] == "1/2 done"


def test_a_held_canary_rollout_says_node_gate_reason_and_how_to_go_on() -> None:
    from gpu_operator.upgrade.report import status_report

    status = {
        "upgrade": {
            "done": 3,
            "total": 3,
            "rollout": {
                "phase": "held",
                "target": "abc123",
                "nodes": ["gpu-0"],
                "since": "2026-11-27T10:00:00Z",
                "failure": {"node": "gpu-0", "gate": "driver", "reason": "ImagePullBackOff"},
            },
        }
    }
    text = status_report([], status, now=0.0)
    line = text.splitlines()[-1]
    assert "FAILED: held" in line and "canary gpu-0" in line
    assert "node gpu-0, gate driver: ImagePullBackOff" in line
    assert "nvidia.com/gpu-driver-upgrade.retry" in line
