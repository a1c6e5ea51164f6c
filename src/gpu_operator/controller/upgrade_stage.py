"""A driver upgrade plan as a stage of API actions (pure), for the ClusterPolicy's own driver
and each NVIDIADriver's pool alike: the fleet planner (:mod:`gpu_operator.upgrade`) decides
the steps, this turns them into node patches, evictions, pod deletions and Events."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_operator.controller.notices import node_event
from gpu_operator.controller.runtime.actions import Action, DeletePod, Evict, Patch, Stage
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.upgrade import Cordon, Fail, SetState, Uncordon, UpgradePlan
from gpu_operator.upgrade import DeletePod as UpgradeDeletePod
from gpu_operator.upgrade import Event as UpgradeEvent
from gpu_operator.upgrade import Evict as UpgradeEvict


def upgrade_stage(
    upgrade: UpgradePlan, snap: Snapshot, config: OperatorConfig, first: Sequence[Action] = ()
) -> Stage:
    """The planner's steps as API actions, in order; a node's later steps are skipped once
    one of its patches fails (a refused eviction skips nothing: the pod is simply still
    there)."""
    actions: list[Action] = list(first)  # the rollout's own, about its owner
    groups: list[str] = [""] * len(first)
    for step in upgrade.actions:
        requests: list[Action] = []
        if isinstance(step, (SetState, Cordon, Uncordon, Fail)):
            requests.append(Patch("Node", step.node, step.patch(), "upgrade"))
            if isinstance(step, Fail):
                requests.append(
                    node_event(
                        step.node, "Warning", "UpgradeFailed", step.reason, snap.stamp, config
                    )
                )
        elif isinstance(step, UpgradeEvict):
            requests.append(Evict(step.pod, step.namespace))
        elif isinstance(step, UpgradeDeletePod):
            requests.append(DeletePod(step.pod, step.namespace, step.force))
        elif isinstance(step, UpgradeEvent):
            requests.append(
                node_event(step.node, step.type, step.reason, step.message, snap.stamp, config)
            )
        actions += requests
        groups += [step.node] * len(requests)
    return Stage(tuple(actions), concurrent=False, groups=tuple(groups))
