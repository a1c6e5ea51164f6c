"""The fleet driver-upgrade planner: a pure state machine over an observed fleet.

``plan(fleet, policy, now)`` returns the next actions; the controller applies them and calls it
again on the next observation. ``simulate`` plays a cluster for tests and benchmarks.
"""

from gpu_operator.upgrade.model import (
    DRAIN_SKIP_LABEL,
    IN_PROGRESS,
    REQUESTED_ANNOTATION,
    SINCE_ANNOTATION,
    SKIP_LABEL,
    STATE_LABEL,
    VALIDATOR_APP,
    WAS_CORDONED_ANNOTATION,
    Action,
    Cordon,
    DeletePod,
    Event,
    Evict,
    Fail,
    Fleet,
    Node,
    Plan,
    Pod,
    Policy,
    SetState,
    State,
    Summary,
    Uncordon,
    scaled_max_unavailable,
)
from gpu_operator.upgrade.planner import plan, summary_line
from gpu_operator.upgrade.selector import Selector

__all__ = [
    "DRAIN_SKIP_LABEL",
    "IN_PROGRESS",
    "REQUESTED_ANNOTATION",
    "SINCE_ANNOTATION",
    "SKIP_LABEL",
    "STATE_LABEL",
    "VALIDATOR_APP",
    "WAS_CORDONED_ANNOTATION",
    "Action",
    "Cordon",
    "DeletePod",
    "Event",
    "Evict",
    "Fail",
    "Fleet",
    "Node",
    "Plan",
    "Pod",
    "Policy",
    "Selector",
    "SetState",
    "State",
    "Summary",
    "Uncordon",
    "plan",
    "scaled_max_unavailable",
    "summary_line",
]
