"""GPU node detection and uninstall cleanup (the label planning itself: test_node_labels.py)."""

from __future__ import annotations

import pytest

from gpu_operator.labels import (
    GKE_ACCELERATOR,
    GPU_PRESENT,
    GPU_RESOURCE,
    OWNED_ANNOTATION,
    UPGRADE_SINCE,
)
from gpu_operator.node_labels import NodePolicy, is_gpu_node, plan_node
from gpu_operator.views import NodeView
from tests.unit.controller.builders import NFD_GPU


@pytest.mark.parametrize(
    ("node", "gpu"),
    [
        (NodeView("a", labels={NFD_GPU: "true"}), True),
        (NodeView("a", labels={NFD_GPU: "false"}), False),
        (NodeView("a", labels={GKE_ACCELERATOR: "nvidia-l4"}), True),
        (NodeView("a", labels={GPU_PRESENT: "true"}), True),  # a person said so
        # the operator's own label does not keep a node a GPU node
        (NodeView("a", labels={GPU_PRESENT: "true"},
                  annotations={OWNED_ANNOTATION: '{"labels":["nvidia.com/gpu.present"]}'}), False),
        (NodeView("a", capacity={GPU_RESOURCE: "4"}), True),  # the device plugin says so
        (NodeView("a", capacity={GPU_RESOURCE: "0"}), False),
        (NodeView("a", capacity={GPU_RESOURCE: "lots"}), False),  # unreadable: not a GPU node
        (NodeView("a"), False),
    ],
)  # fmt: skip
def test_is_gpu_node(node: NodeView, gpu: bool) -> None:
    assert is_gpu_node(node) is gpu


def test_uninstall_also_removes_the_stacks_bookkeeping_annotations() -> None:
    node = NodeView(
        "a",
        labels={NFD_GPU: "true", "nvidia.com/gpu.count": "8", "team": "ml"},
        annotations={UPGRADE_SINCE: "123", "keep": "me"},
    )
    patch = plan_node(node, None, uninstall=True)
    assert patch is not None
    assert patch.labels == {"nvidia.com/gpu.count": None}
    assert patch.annotations == {UPGRADE_SINCE: None}
    # without uninstall (no active policy), the rest of the stack's marks stay
    assert plan_node(node, None) is None
    assert plan_node(node, NodePolicy(deploy=()), uninstall=False) is not None
