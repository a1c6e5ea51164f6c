"""Deploy labels per GPU workload config (sandbox workloads), as NVIDIA's operator sets them."""

from __future__ import annotations

import pytest

from gpu_operator.api import parse_spec
from gpu_operator.controller.clusterpolicy.facts import node_policy
from gpu_operator.labels import (
    DEPLOY_PREFIX,
    MIG_CAPABLE,
    MIG_CONFIG,
    OWNED_ANNOTATION,
    WORKLOAD_CONFIG,
    WORKLOAD_MOVE,
)
from gpu_operator.node_labels import (
    Move,
    MovePhase,
    NodePolicy,
    Owned,
    is_stack_label,
    plan_node,
    running_config,
    workload_problem,
)
from gpu_operator.views import NodeView

NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
ALL = {
    "sandboxWorkloads": {"enabled": True},
    "sandboxDevicePlugin": {"enabled": True},
    "vfioManager": {"enabled": True},
    "vgpuManager": {"enabled": True},
    "vgpuDeviceManager": {"enabled": True},
    "kataManager": {"enabled": True},
    "ccManager": {"enabled": True},
    "nodeStatusExporter": {"enabled": True},
    "dcgm": {"enabled": True},
}
# NVIDIA's operator's table (controllers/state_manager.go, gpuStateLabels)
CONTAINER = {
    "driver",
    "gpu-feature-discovery",
    "container-toolkit",
    "device-plugin",
    "dcgm",
    "dcgm-exporter",
    "operator-validator",
}
PASSTHROUGH = {
    "sandbox-device-plugin",
    "sandbox-validator",
    "vfio-manager",
    "kata-manager",
    "cc-manager",
}
DRAINING, SWITCHING, VALIDATING = MovePhase
VGPU = {
    "sandbox-device-plugin",
    "vgpu-manager",
    "vgpu-device-manager",
    "sandbox-validator",
    "cc-manager",
}
# What this operator deploys of those in the default mode (kubevirt): not the CC manager, which
# NVIDIA's operator deploys in kata mode only (it labels it in either mode)
PASSTHROUGH_KV = PASSTHROUGH - {"cc-manager"}
VGPU_KV = VGPU - {"cc-manager"}


def view(labels: dict[str, str], annotations: dict[str, str] | None = None) -> NodeView:
    return NodeView("n1", labels={**NFD, **labels}, annotations=annotations or {})


def after(node: NodeView, policy: NodePolicy | None, uninstall: bool = False) -> NodeView:
    patch = plan_node(node, policy, uninstall=uninstall)
    if patch is None:
        return node
    labels = {**node.labels, **patch.labels}
    annotations = {**node.annotations, **patch.annotations}
    return NodeView(
        node.name,
        labels={k: v for k, v in labels.items() if v is not None},
        annotations={k: v for k, v in annotations.items() if v is not None},
        taints=node.taints if patch.taints is None else tuple(patch.taints),
    )


def deployed(node: NodeView) -> set[str]:
    return {
        k.removeprefix(DEPLOY_PREFIX)
        for k, v in node.labels.items()
        if k.startswith(DEPLOY_PREFIX) and v == "true"
    }


@pytest.mark.parametrize(
    ("config", "stack"),
    [("container", CONTAINER), ("vm-passthrough", PASSTHROUGH_KV), ("vm-vgpu", VGPU_KV)],
)
def test_each_workload_config_gets_nvidias_stack(config: str, stack: set[str]) -> None:
    policy = node_policy(parse_spec(ALL))
    assert deployed(after(view({WORKLOAD_CONFIG: config}), policy)) == stack


def test_mig_manager_joins_only_the_container_stack_on_mig_capable_nodes() -> None:
    policy = node_policy(parse_spec(ALL))
    container = after(view({WORKLOAD_CONFIG: "container", MIG_CAPABLE: "true"}), policy)
    assert deployed(container) == CONTAINER | {"mig-manager"}
    assert container.labels[MIG_CONFIG] == "all-disabled"
    vm = after(view({WORKLOAD_CONFIG: "vm-passthrough", MIG_CAPABLE: "true"}), policy)
    assert deployed(vm) == PASSTHROUGH_KV and MIG_CONFIG not in vm.labels


def test_no_label_means_the_default_workload() -> None:
    assert deployed(after(view({}), node_policy(parse_spec(ALL)))) == CONTAINER
    vgpu = parse_spec({**ALL, "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu"}})
    assert deployed(after(view({}), node_policy(vgpu))) == VGPU_KV


def test_shared_nvswitch_keeps_the_driver_on_passthrough_nodes() -> None:
    policy = node_policy(parse_spec({**ALL, "fabricManager": {"mode": "shared-nvswitch"}}))
    assert deployed(after(view({WORKLOAD_CONFIG: "vm-passthrough"}), policy)) == PASSTHROUGH_KV | {
        "driver"
    }
    assert deployed(after(view({WORKLOAD_CONFIG: "vm-vgpu"}), policy)) == VGPU_KV
    full = node_policy(parse_spec({**ALL, "fabricManager": {"mode": "full-passthrough"}}))
    assert deployed(after(view({WORKLOAD_CONFIG: "vm-passthrough"}), full)) == PASSTHROUGH_KV


def test_kata_mode_swaps_the_passthrough_device_plugin() -> None:
    spec = {
        **ALL,
        "sandboxWorkloads": {"enabled": True, "mode": "kata"},
        "kataSandboxDevicePlugin": {"enabled": True},
    }
    policy = node_policy(parse_spec(spec))
    passthrough = deployed(after(view({WORKLOAD_CONFIG: "vm-passthrough"}), policy))
    assert passthrough == PASSTHROUGH - {"sandbox-device-plugin"} | {"kata-sandbox-device-plugin"}
    # NVIDIA's operator labels vm-vgpu nodes for KubeVirt's plugin but deploys none in kata
    # mode; this one labels only what it deploys
    assert deployed(after(view({WORKLOAD_CONFIG: "vm-vgpu"}), policy)) == VGPU - {
        "sandbox-device-plugin"
    }


def test_disabled_sections_get_no_label() -> None:
    policy = node_policy(parse_spec({**ALL, "vgpuDeviceManager": {"enabled": False}}))
    assert deployed(after(view({WORKLOAD_CONFIG: "vm-vgpu"}), policy)) == VGPU_KV - {
        "vgpu-device-manager"
    }


def test_without_sandbox_workloads_the_label_changes_nothing() -> None:
    spec = {k: v for k, v in ALL.items() if k != "sandboxWorkloads"}
    policy = node_policy(parse_spec(spec))
    assert policy.sandbox is None
    node = view({WORKLOAD_CONFIG: "vm-passthrough"})
    assert deployed(after(node, policy)) == CONTAINER
    assert workload_problem(view({WORKLOAD_CONFIG: "bogus"}), policy) is None


def in_phase(node: NodeView, source: str, target: str, phase: MovePhase) -> NodeView:
    """``node`` with a move record in ``phase`` (what the move planner writes)."""
    record = Move(source, target, phase, 0.0, was_cordoned=False).dump()
    annotations = {**node.annotations, WORKLOAD_MOVE: record}
    return NodeView(node.name, labels=node.labels, annotations=annotations, taints=node.taints)


def relabel(node: NodeView, config: str) -> NodeView:
    labels = {**node.labels, WORKLOAD_CONFIG: config}
    return NodeView(node.name, labels=labels, annotations=node.annotations, taints=node.taints)


def test_a_new_workload_config_keeps_the_old_stack_until_a_move_switches_it() -> None:
    policy = node_policy(parse_spec(ALL))
    container = after(view({WORKLOAD_CONFIG: "container"}), policy)
    assert Owned.parse(container.annotations).workload == "container"
    relabelled = relabel(container, "vm-passthrough")
    assert running_config(relabelled) == "container"
    assert deployed(after(relabelled, policy)) == CONTAINER  # no move record yet
    draining = after(in_phase(relabelled, "container", "vm-passthrough", DRAINING), policy)
    assert deployed(draining) == CONTAINER
    switching = after(in_phase(draining, "container", "vm-passthrough", SWITCHING), policy)
    assert deployed(switching) == set()
    assert switching.labels["nvidia.com/gpu.present"] == "true"
    validating = after(in_phase(switching, "container", "vm-passthrough", VALIDATING), policy)
    assert deployed(validating) == PASSTHROUGH_KV
    assert Owned.parse(validating.annotations).workload == "vm-passthrough"
    done = NodeView(
        "n1",
        labels=validating.labels,
        annotations={k: v for k, v in validating.annotations.items() if k != WORKLOAD_MOVE},
        taints=validating.taints,
    )
    assert plan_node(done, policy) is None  # settled: the move record gone, nothing changes
    back = relabel(done, "container")
    assert deployed(after(back, policy)) == PASSTHROUGH_KV  # until the move back switches
    assert deployed(after(in_phase(back, "vm-passthrough", "container", VALIDATING), policy)) == (
        CONTAINER
    )


def test_a_node_labelled_before_the_record_tells_its_stack_by_its_labels() -> None:
    policy = node_policy(parse_spec(ALL))
    vgpu = after(view({WORKLOAD_CONFIG: "vm-vgpu"}), policy)
    owned = Owned.parse(vgpu.annotations)
    unrecorded = Owned(owned.labels, owned.taints).dump()
    assert unrecorded is not None
    older = NodeView("n1", labels=vgpu.labels, annotations={OWNED_ANNOTATION: unrecorded})
    assert running_config(older) == "vm-vgpu"
    fresh = view({WORKLOAD_CONFIG: "vm-vgpu"})
    assert running_config(fresh) is None  # nothing deployed: no move, the stack comes at once


def test_a_persons_false_and_a_paused_value_survive_the_move() -> None:
    policy = node_policy(parse_spec(ALL))
    container = after(view({WORKLOAD_CONFIG: "container"}), policy)
    labels = {
        **container.labels,
        DEPLOY_PREFIX + "dcgm": "false",
        DEPLOY_PREFIX + "device-plugin": "paused-for-mig-change",
        DEPLOY_PREFIX + "vfio-manager": "false",  # a person keeps VFIO off this node
        WORKLOAD_CONFIG: "vm-passthrough",
    }
    node = NodeView("n1", labels=labels, annotations=container.annotations)
    for phase in (DRAINING, SWITCHING, VALIDATING):
        node = after(in_phase(node, "container", "vm-passthrough", phase), policy)
    assert node.labels[DEPLOY_PREFIX + "dcgm"] == "false"
    assert node.labels[DEPLOY_PREFIX + "vfio-manager"] == "false"
    assert deployed(node) == PASSTHROUGH_KV - {"vfio-manager"}


def test_an_invalid_workload_config_keeps_the_labels_and_is_reported() -> None:
    policy = node_policy(parse_spec(ALL))
    container = after(view({WORKLOAD_CONFIG: "container"}), policy)
    bad = NodeView(
        "n1",
        labels={**container.labels, WORKLOAD_CONFIG: "vm-passthru"},
        annotations=container.annotations,
        taints=container.taints,
    )
    assert plan_node(bad, policy) is None  # nothing the operator set goes, nothing comes
    why = workload_problem(bad, policy)
    assert why is not None and "'vm-passthru'" in why and "vm-passthrough" in why
    # a fresh node with a bad label gets only gpu.present
    fresh = after(view({WORKLOAD_CONFIG: "vgpu"}), policy)
    assert deployed(fresh) == set()
    assert fresh.labels["nvidia.com/gpu.present"] == "true"
    assert workload_problem(view({WORKLOAD_CONFIG: "container"}), policy) is None
    assert workload_problem(NodeView("cpu", labels={WORKLOAD_CONFIG: "x"}), policy) is None


# What the sandbox operands write on their node (NVIDIA's vGPU device manager and CC manager) and
# what feature discovery writes in a vGPU guest; then what a person sets to ask for a layout, a
# CC mode or a workload config.
WRITTEN_BY_THE_STACK = {
    "nvidia.com/vgpu.config.state": "success",
    "nvidia.com/cc.mode.state": "on",
    "nvidia.com/cc.ready.state": "true",
    "nvidia.com/vgpu.present": "true",
    "nvidia.com/vgpu.host-driver-version": "580.95.05",
    "nvidia.com/vgpu.host-driver-branch": "r580_00",
}
SET_BY_A_PERSON = {
    "nvidia.com/vgpu.config": "A100-4C",
    "nvidia.com/cc.mode": "on",
    WORKLOAD_CONFIG: "vm-vgpu",
}


def test_uninstall_takes_the_sandbox_operands_labels_and_leaves_a_persons() -> None:
    policy = node_policy(parse_spec(ALL))
    labelled = after(view(SET_BY_A_PERSON), policy)
    assert deployed(labelled) == VGPU_KV
    worked_on = NodeView(
        "n1", labels={**labelled.labels, **WRITTEN_BY_THE_STACK}, annotations=labelled.annotations
    )
    gone = after(worked_on, None, uninstall=True)
    assert gone.labels == {**NFD, **SET_BY_A_PERSON}


@pytest.mark.parametrize(
    ("key", "stack"),
    [
        *((key, True) for key in WRITTEN_BY_THE_STACK),
        *((key, False) for key in SET_BY_A_PERSON),
        ("nvidia.com/cc.capable", False),  # NFD's rule writes it, and takes it back
        ("nvidia.com/vgpu.config.state.reason", False),
        ("nvidia.com/cc.mode.state.x", False),
    ],
)
def test_is_stack_label_knows_the_sandbox_operands_labels(key: str, stack: bool) -> None:
    assert is_stack_label(key) is stack
