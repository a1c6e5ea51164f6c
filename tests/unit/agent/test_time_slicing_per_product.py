"""NVIDIA issue 1712: different time-slicing replica counts per GPU product in one cluster.

The recipe NVIDIA documents: one ConfigMap holds a named config per product, and each node's
``nvidia.com/device-plugin.config`` label picks its own; nodes without the label get the
default. Each node then advertises, and feature discovery labels, its own replica count, and
the operator's node labelling never touches the user's config label.
"""

from __future__ import annotations

from pathlib import Path

from gpu_operator.agent.deviceplugin.config_file import load_device_plugin_config
from gpu_operator.agent.deviceplugin.configs import available_configs, select_config
from gpu_operator.agent.deviceplugin.resources import advertised_resources
from gpu_operator.agent.discovery import labels_for
from gpu_operator.labels import DEVICE_PLUGIN_CONFIG
from gpu_operator.node_labels import NodePolicy, plan_node
from gpu_operator.views import NodeView

from .conftest import Simulate, inventory_with

SLICED = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""
# node -> (simulated GPUs, its config label or None, replicas expected per GPU, GPU count)
NODES = {
    "a100-node": ("a100-40gb:8", "a100-40gb", 4, 8),
    "t4-node": ("t4:1", "tesla-t4", 10, 1),
    "l4-node": ("l4:2", None, 1, 2),  # no label: the default config, no sharing
}


def test_each_product_gets_its_own_replica_count(simulate: Simulate, tmp_path: Path) -> None:
    configs = tmp_path / "configs"  # the mounted ConfigMap
    configs.mkdir()
    (configs / "default").write_text("version: v1\n")
    (configs / "a100-40gb").write_text(SLICED.format(replicas=4))
    (configs / "tesla-t4").write_text(SLICED.format(replicas=10))
    (configs / "..data").mkdir()  # the kubelet's own entries are not configs
    available = available_configs(configs)
    assert available == ["a100-40gb", "default", "tesla-t4"]

    for name, (spec, label, replicas, gpus) in NODES.items():
        chosen = select_config(label, available)
        assert chosen == (label or "default"), name
        config = load_device_plugin_config(configs / chosen)
        inventory = inventory_with(simulate, spec, seed=name)
        assert advertised_resources(inventory, config) == {"nvidia.com/gpu": gpus * replicas}
        labels = labels_for(inventory, "none", config.sharing, "machine")
        assert labels["nvidia.com/gpu.replicas"] == str(replicas), name
        strategy = "time-slicing" if replicas > 1 else "none"
        assert labels["nvidia.com/gpu.sharing-strategy"] == strategy, name


def test_the_operator_never_writes_the_config_label() -> None:
    node = NodeView(
        "t4-node",
        labels={
            "feature.node.kubernetes.io/pci-10de.present": "true",
            DEVICE_PLUGIN_CONFIG: "tesla-t4",
        },
        resource_version="1",
    )
    patch = plan_node(node, NodePolicy(deploy=("device-plugin",)))
    assert patch is not None and DEVICE_PLUGIN_CONFIG not in patch.labels
    gone = plan_node(node, None, uninstall=True)
    assert gone is None or DEVICE_PLUGIN_CONFIG not in gone.labels
