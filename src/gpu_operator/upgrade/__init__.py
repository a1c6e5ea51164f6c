"""The fleet driver-upgrade planner: a pure state machine over an observed fleet.

``fleet_from_objects`` builds the observation from watched objects, ``plan(fleet, policy, now)``
returns the next actions; the controller executes them and plans again on the next
observation. The simulated cluster that tests and benchmarks run it on is
:mod:`gpu_operator.testenv.fleetsim` (not in the image).
"""

from gpu_operator.selector import Selector
from gpu_operator.upgrade.fleet import emptying_nodes, fleet_from_objects
from gpu_operator.upgrade.model import (
    IN_PROGRESS,
    Action,
    Fail,
    Fleet,
    Node,
    Policy,
    SetState,
    State,
    Summary,
    UpgradePlan,
    scaled_max_unavailable,
)
from gpu_operator.upgrade.planner import plan, summary_line

__all__ = [
    "IN_PROGRESS",
    "Action",
    "Fail",
    "Fleet",
    "Node",
    "Policy",
    "Selector",
    "SetState",
    "State",
    "Summary",
    "UpgradePlan",
    "emptying_nodes",
    "fleet_from_objects",
    "plan",
    "scaled_max_unavailable",
    "summary_line",
]
