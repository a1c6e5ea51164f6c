"""Upgrades per pool: each NVIDIADriver's own upgradePolicy, only its pool's nodes, and every
pool together within the ClusterPolicy's limits."""

from __future__ import annotations

from typing import Any

from gpu_operator.controller.nvidiadriver.decide import decide_drivers
from gpu_operator.controller.runtime.actions import DeletePod, Evict, Patch
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.labels import UPGRADE_STATE
from gpu_operator.views import NodeView
from tests.unit.controller.nvidiadriver.fleet import (
    THREE_POOLS,
    applied,
    on_server,
    policy,
    revision,
    running,
    snapshot,
    twelve_nodes,
)

CONFIG = OperatorConfig(namespace="gpu-operator", identity="test")
POOLED = {f"{g}-{i}": g for g in ("a100", "h100", "t4") for i in range(4)}
AUTO = {"autoUpgrade": True, "maxParallelUpgrades": 2, "maxUnavailable": "50%"}


def with_policy(drivers: tuple[dict[str, Any], ...], **upgrade: Any) -> tuple[dict[str, Any], ...]:
    return tuple(
        {**d, "spec": {**d["spec"], "upgradePolicy": {**AUTO, **upgrade}}} for d in drivers
    )


def cluster(
    bumped: set[str], drivers: tuple[dict[str, Any], ...], *, marked: bool = True, **cp: Any
) -> Any:
    """Every pool running revision r1; the ``bumped`` pools' DaemonSets have a newer r2 and,
    ``marked``, their nodes are already upgrade-required (the planner's first pass)."""
    nodes = twelve_nodes(**POOLED)
    first = decide_drivers(snapshot(nodes, drivers, cluster_policy=policy(**cp)), CONFIG)
    daemonsets, pods, revisions = [], [], []
    for ds in applied(first, "DaemonSet"):
        pool = ds["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.driver-pool"]
        server = on_server(ds, 4)
        daemonsets.append(server)
        pods += running(server, [f"{pool}-{i}" for i in range(4)], "r1")
        revisions.append(revision(server, "r1", 1))
        if pool in bumped:
            revisions.append(revision(server, "r2", 2))
    if marked:
        nodes = [
            NodeView(n.name, {**n.labels, UPGRADE_STATE: "upgrade-required"})
            if n.name.split("-")[0] in bumped
            else n
            for n in nodes
        ]
    return snapshot(
        nodes, drivers, cluster_policy=policy(**cp), daemonsets=daemonsets, pods=pods,
        revisions=revisions,
    )  # fmt: skip


def touched_nodes(decision: Any) -> dict[str, set[str]]:
    """Node -> the upgrade states it is moved to this pass."""
    out: dict[str, set[str]] = {}
    for action in decision.actions:
        if isinstance(action, Patch) and action.kind == "Node" and action.purpose == "upgrade":
            labels = (action.body.get("metadata") or {}).get("labels") or {}
            out.setdefault(action.name, set()).add(labels.get(UPGRADE_STATE, "cordon"))
        if isinstance(action, (Evict, DeletePod)):
            out.setdefault(action.pod, set()).add("pod")
    return out


def test_a_version_bump_upgrades_only_its_pool() -> None:
    decision = decide_drivers(cluster({"a100"}, with_policy(THREE_POOLS), marked=False), CONFIG)
    touched = touched_nodes(decision)
    assert touched and all(n.startswith("a100-") for n in touched), touched
    (pool,) = [u for u in decision.upgrades if u.plan.summary.pending or u.plan.actions]
    assert pool.driver == "a100"


def test_each_pool_keeps_its_own_max_parallel_upgrades() -> None:
    drivers = with_policy(THREE_POOLS, maxParallelUpgrades=1)
    decision = decide_drivers(cluster({"a100", "t4"}, drivers), CONFIG)
    starts = [n for n, states in touched_nodes(decision).items() if "cordon-required" in states]
    assert sorted(s.split("-")[0] for s in starts) == ["a100", "t4"]


def test_two_pools_upgrade_together_within_the_cluster_limit() -> None:
    drivers = with_policy(THREE_POOLS, maxParallelUpgrades=4, maxUnavailable=4)
    cp = {"upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 3, "maxUnavailable": 3}}
    decision = decide_drivers(cluster({"a100", "t4"}, drivers, **cp), CONFIG)
    starts = [n for n, states in touched_nodes(decision).items() if "cordon-required" in states]
    assert len(starts) == 3
    assert {s.split("-")[0] for s in starts} == {"a100", "t4"}


def test_autoupgrade_off_in_one_pool_leaves_it_alone() -> None:
    a100, h100, t4 = with_policy(THREE_POOLS)
    a100 = {**a100, "spec": {**a100["spec"], "upgradePolicy": {"autoUpgrade": False}}}
    decision = decide_drivers(cluster({"a100", "t4"}, (a100, h100, t4)), CONFIG)
    assert all(n.startswith("t4-") for n in touched_nodes(decision))


def test_upgrade_status_groups_by_pool() -> None:
    from gpu_operator.upgrade.report import pool_report

    def k8s_node(name: str, pool: str, state: str | None) -> dict[str, Any]:
        labels = {"nvidia.com/gpu.driver-pool": pool, **({UPGRADE_STATE: state} if state else {})}
        return {"metadata": {"name": name, "labels": labels}, "spec": {}}

    nodes = [k8s_node("a100-0", "a100", "upgrade-done"), k8s_node("a100-1", "a100", None),
             k8s_node("t4-0", "t4", "upgrade-done")]  # fmt: skip
    upgrade = {"type": "Upgrade", "message": "driver upgrade: 1/2 done"}
    drivers = [
        {"metadata": {"name": "a100"}, "status": {"conditions": [upgrade]}},
        {"metadata": {"name": "t4"}},
    ]
    report = pool_report(nodes, drivers, now=0)
    a100, t4 = report.split("POOL ")[1:]
    assert a100.startswith("a100 (2 nodes)") and "a100-1" in a100 and "1/2 done" in a100
    assert "t4-0" in t4 and "a100" not in t4 and "1/1 done" in t4
