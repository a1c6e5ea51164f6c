"""The node and pod operations planners ask for (pure data): cordon, uncordon, evict, delete a
pod, record an Event about a node. Each names its node, so an executor can skip a node's later
steps once one of its writes fails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gpu_operator.labels import HEALTH_WAS_CORDONED, UPGRADE_WAS_CORDONED


@dataclass(frozen=True)
class Cordon:
    """Cordon, recording in the same patch whether the node was cordoned already (so the
    driver upgrade uncordons at its end only what it cordoned)."""

    node: str
    was_cordoned: bool

    def patch(self) -> dict[str, Any]:
        value = "true" if self.was_cordoned else "false"
        return {
            "metadata": {"annotations": {UPGRADE_WAS_CORDONED: value}},
            "spec": {"unschedulable": True},
        }


@dataclass(frozen=True)
class Uncordon:
    """Only for nodes the upgrade itself cordoned (NVIDIA issue 2820). A node a GPU health
    quarantine holds stays cordoned: the quarantine is told instead that it may uncordon
    when it lets the node go."""

    node: str
    quarantined: bool = False

    def patch(self) -> dict[str, Any]:
        if self.quarantined:
            return {"metadata": {"annotations": {HEALTH_WAS_CORDONED: "false"}}}
        return {"spec": {"unschedulable": None}}


@dataclass(frozen=True)
class Evict:
    """Through the Eviction API, so PodDisruptionBudgets apply."""

    pod: str
    namespace: str
    node: str


@dataclass(frozen=True)
class DeletePod:
    """Delete a pod; ``force`` means grace period 0 (podDeletion/drain ``force`` after the
    timeout)."""

    pod: str
    namespace: str
    force: bool
    node: str


EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """An Event about a node: what a planner tells the people who watch it."""

    node: str
    type: EventType
    reason: str
    message: str


NodeOperation = Cordon | Uncordon | Evict | DeletePod | Event
