"""Small builders for upgrade-planner tests: a fleet in a few lines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpu_operator.labels import (
    UPGRADE_SINCE,
    UPGRADE_STATE,
    UPGRADE_WAS_CORDONED,
    VALIDATOR_APP,
)
from gpu_operator.nodeops.pods import Pod
from gpu_operator.upgrade import (
    Fleet,
    Node,
    Policy,
)

NOW = 100_000.0
DS = "nvidia-driver-daemonset"
NEW = "new-hash"
OLD = "old-hash"
AUTO = Policy(auto_upgrade=True)


def node(
    name: str = "n1",
    state: str = "",
    *,
    since: float | None = None,
    cordoned: bool = False,
    ready: bool = True,
    was_cordoned: bool | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Node:
    all_labels = dict(labels or {})
    if state:
        all_labels[UPGRADE_STATE] = state
    all_annotations = dict(annotations or {})
    if since is not None:
        all_annotations[UPGRADE_SINCE] = str(int(since))
    if was_cordoned is not None:
        all_annotations[UPGRADE_WAS_CORDONED] = "true" if was_cordoned else "false"
    return Node(name, all_labels, all_annotations, unschedulable=cordoned, ready=ready)


def driver(
    on: str = "n1",
    revision: str = OLD,
    *,
    ready: bool = True,
    deleting: bool = False,
    created: float = 0.0,
    restarts: int = 0,
    name: str | None = None,
    owner: str = DS,
) -> Pod:
    return Pod(
        name or f"driver-{on}-{revision}",
        "gpu-operator",
        on,
        {"app": DS},
        owner=owner,
        revision_hash=revision,
        ready=ready,
        phase="Running" if ready else "Pending",
        restart_count=restarts,
        is_daemonset_pod=True,
        deleting=deleting,
        created=created,
    )


def validator(
    on: str = "n1",
    *,
    ready: bool = True,
    ready_since: float = 0.0,
    deleting: bool = False,
    name: str | None = None,
) -> Pod:
    return Pod(
        name or f"validator-{on}",
        "gpu-operator",
        on,
        {"app": VALIDATOR_APP},
        owner="nvidia-operator-validator",
        ready=ready,
        is_daemonset_pod=True,
        deleting=deleting,
        ready_since=ready_since,
    )


def workload(
    name: str,
    on: str = "n1",
    *,
    gpu: bool = True,
    labels: Mapping[str, str] | None = None,
    phase: str = "Running",
    deleting: bool = False,
    empty_dir: bool = False,
    daemonset: bool = False,
) -> Pod:
    return Pod(
        name,
        "work",
        on,
        dict(labels or {}),
        owner="DaemonSet/x" if daemonset else "ReplicaSet/x",
        phase=phase,
        uses_gpu=gpu,
        is_daemonset_pod=daemonset,
        deleting=deleting,
        uses_empty_dir=empty_dir,
    )


def fleet(
    nodes: Iterable[Node],
    drivers: Iterable[Pod] | None = None,
    workloads: Iterable[Pod] = (),
    validators: Iterable[Pod] = (),
) -> Fleet:
    """``drivers`` None: one old driver pod on every node."""
    nodes = tuple(nodes)
    pods = tuple(drivers) if drivers is not None else tuple(driver(n.name) for n in nodes)
    return Fleet(nodes, pods, tuple(workloads), tuple(validators), {DS: NEW})
