"""`gpu-operator health status` output."""

from __future__ import annotations

from gpu_operator.labels import HEALTH_ACTION, HEALTH_SINCE, HEALTH_STATE, UNHEALTHY_TAINT
from gpu_operator.remediation.report import health_report
from tests.unit.remediation.cluster import node

T0 = 1_000_000.0


def test_the_table_shows_unhealthy_and_held_nodes_with_why_and_since() -> None:
    nodes = [
        node("fine", since=T0),
        node("sick", healthy=False, since=T0 - 30),
        node(
            "held",
            healthy=False,
            since=T0 - 600,
            labels={HEALTH_STATE: "remediating"},
            annotations={HEALTH_SINCE: str(int(T0 - 90)), HEALTH_ACTION: "1"},
            taints=[{"key": UNHEALTHY_TAINT, "value": "quarantined", "effect": "NoSchedule"}],
        ),
        node("no-agent", healthy=None),
    ]
    status = {"healthRemediation": {"message": "GPU health remediation on: 2 unhealthy, 1/1"}}
    text = health_report(nodes, status, now=T0)
    lines = text.splitlines()
    assert lines[0].split() == [
        "NODE",
        "GPUHEALTHY",
        "FOR",
        "REMEDIATION",
        "IN",
        "STATE",
        "TAINT",
        "WHY",
    ]
    rows = {line.split()[0]: line for line in lines[1:] if line}
    assert set(rows) == {"held", "sick", "GPU"}
    assert "remediating #1" in rows["held"] and "90s" in rows["held"] and "10m" in rows["held"]
    assert "NoSchedule" in rows["held"] and "XID 79" in rows["sick"] and "30s" in rows["sick"]
    assert lines[-1].startswith("GPU health remediation on")
    every = health_report(nodes, {}, now=T0, all_nodes=True)
    assert "fine" in every and "no-agent" not in every and "remediation off" in every
