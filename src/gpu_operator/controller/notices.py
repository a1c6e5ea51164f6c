"""Events the operator records, as Create actions: about a Node, or about one of its objects
(a ClusterPolicy, an NVIDIADriver). Cluster-scoped objects' Events live in ``default``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_operator.controller.runtime.actions import Create, Tally
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.events import event_body

EVENT_SOURCE = "gpu-operator"


def node_event(
    node: str,
    etype: str,
    reason: str,
    message: str,
    stamp: str,
    config: OperatorConfig,
    tally: Tally | None = None,
) -> Create:
    about = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    return Create(object_event(about, etype, reason, message, stamp, config), tally)


def object_event(
    about: Mapping[str, Any],
    etype: str,
    reason: str,
    message: str,
    stamp: str,
    config: OperatorConfig,
) -> dict[str, Any]:
    return event_body(
        about,
        etype,
        reason,
        message,
        component=EVENT_SOURCE,
        instance=config.identity,
        stamp=stamp,
    )
