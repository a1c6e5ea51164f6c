"""The shared node and pod operations (:mod:`gpu_operator.nodeops`) as API actions (pure): one
translation for the driver upgrade's stage and the GPU health remediation's alike."""

from __future__ import annotations

from gpu_operator.controller.notices import node_event
from gpu_operator.controller.runtime import actions
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.nodeops.operations import Cordon, DeletePod, Evict, NodeOperation, Uncordon


def node_request(
    op: NodeOperation,
    snap: Snapshot,
    config: OperatorConfig,
    *,
    purpose: actions.Purpose,
    tally: actions.Tally | None = None,
) -> actions.Action:
    """The one API action that performs ``op``: a Node patch made for ``purpose``, an
    eviction, a pod deletion or an Event. ``tally`` is counted when a patch or an Event
    succeeds (evictions and deletions count nothing)."""
    if isinstance(op, (Cordon, Uncordon)):
        return actions.Patch("Node", op.node, op.patch(), purpose, tally=tally)
    if isinstance(op, Evict):
        return actions.Evict(op.pod, op.namespace)
    if isinstance(op, DeletePod):
        return actions.DeletePod(op.pod, op.namespace, op.force)
    return node_event(op.node, op.type, op.reason, op.message, snap.stamp, config, tally)
