"""A driver upgrade plan as a stage of API actions (pure), for the ClusterPolicy's own driver
and each NVIDIADriver's pool alike: the fleet planner (:mod:`gpu_operator.upgrade`) decides
the steps, this turns them into node patches, evictions, pod deletions and Events."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_operator.controller.nodeops_stage import node_request
from gpu_operator.controller.notices import node_event
from gpu_operator.controller.runtime.actions import Action, Patch, Stage
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.upgrade import Fail, SetState, UpgradePlan


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
        if isinstance(step, (SetState, Fail)):
            requests.append(Patch("Node", step.node, step.patch(), "upgrade"))
            if isinstance(step, Fail):
                requests.append(
                    node_event(
                        step.node, "Warning", "UpgradeFailed", step.reason, snap.stamp, config
                    )
                )
        else:
            requests.append(node_request(step, snap, config, purpose="upgrade"))
        actions += requests
        groups += [step.node] * len(requests)
    return Stage(tuple(actions), concurrent=False, groups=tuple(groups))
