"""The MIG manager's state machine (pure step) and its loop against an in-memory Node."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from gpu_operator.agent import mig_manager as mm
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.mig_manager import (
    PAUSED,
    ApplyMig,
    MigObservation,
    PatchNode,
    Paused,
    RecordEvent,
    WaitForPods,
    step,
)
from gpu_operator.agent.migparted import MigPartedConfig
from gpu_operator.agent.nodeapi import PodView
from gpu_operator.agent.nvml import Nvml
from gpu_operator.labels import (
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    MIG_FAILED_CONFIG,
    MIG_PAUSED_LABELS,
    MIG_STATE_REASON,
)
from tests.fakes.kube import Call, FakeKube

from .conftest import Simulate, inventory_with

DP = "nvidia.com/gpu.deploy.device-plugin"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
EXP = "nvidia.com/gpu.deploy.dcgm-exporter"
DCGM = "nvidia.com/gpu.deploy.dcgm"
DEPLOY = {DP: "true", GFD: "true", EXP: "false"}  # dcgm: unset


@pytest.fixture
def config(nvidia_mig_config: MigPartedConfig) -> MigPartedConfig:
    return nvidia_mig_config


def observe(
    inventory: Inventory,
    config: MigPartedConfig,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    pods: list[PodView] | None = None,
    **kwargs: Any,
) -> MigObservation:
    return MigObservation(
        labels=dict(labels),
        annotations=dict(annotations or {}),
        pods=pods or [],
        inventory=inventory,
        config=config,
        now=kwargs.pop("now", 1000.0),
        **kwargs,
    )


def paused_annotation(config: str = "all-1g.5gb", since: float = 1000.0) -> dict[str, str]:
    original = {DP: "true", GFD: "true", EXP: "false", DCGM: None}
    return {MIG_PAUSED_LABELS: Paused(config, since, original).encode()}


PAUSED_LABELS = {DP: PAUSED, GFD: PAUSED, EXP: "false", DCGM: PAUSED, MIG_CONFIG_STATE: "pending"}


def test_no_config_label_nothing_to_do(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:2")
    assert step(observe(inv, config, DEPLOY)).actions == ()


def test_already_applied_only_records_success(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:2")  # MIG off: all-disabled already holds
    result = step(observe(inv, config, {**DEPLOY, MIG_CONFIG: "all-disabled"}))
    assert result.phase == "success"
    assert result.actions == (
        PatchNode(labels={MIG_CONFIG_STATE: "success"}),
        RecordEvent("Normal", "MIGConfigApplied", "MIG config all-disabled applied"),
    )
    settled = {**DEPLOY, MIG_CONFIG: "all-disabled", MIG_CONFIG_STATE: "success"}
    assert step(observe(inv, config, settled)).actions == ()


def test_new_config_pauses_operands_false_stays_false(
    simulate: Simulate, config: MigPartedConfig
) -> None:
    inv = inventory_with(simulate, "a100-40gb:2")
    result = step(
        observe(
            inv,
            config,
            {**DEPLOY, MIG_CONFIG: "all-1g.5gb", MIG_CONFIG_STATE: "success"},
            now=1000.0,
        )
    )
    assert result.phase == "pausing"
    (patch, event) = result.actions
    assert event == RecordEvent(
        "Normal",
        "MIGConfigPending",
        "MIG config all-1g.5gb: pausing GPU operands to repartition the GPUs",
    )
    assert isinstance(patch, PatchNode)
    assert patch.labels == {MIG_CONFIG_STATE: "pending", DP: PAUSED, GFD: PAUSED, DCGM: PAUSED}
    saved = Paused.decode(patch.annotations[MIG_PAUSED_LABELS])
    assert saved == Paused(
        "all-1g.5gb", 1000.0, {DP: "true", GFD: "true", EXP: "false", DCGM: None}
    )


def test_another_components_pause_is_left_alone(
    simulate: Simulate, config: MigPartedConfig
) -> None:
    inv = inventory_with(simulate, "a100-40gb:1")
    labels = {DP: "paused-for-driver-upgrade", GFD: "true", MIG_CONFIG: "all-1g.5gb"}
    (patch, _) = step(observe(inv, config, labels)).actions
    assert isinstance(patch, PatchNode)
    assert DP not in patch.labels and patch.labels[GFD] == PAUSED


def test_waits_for_operand_pods(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:2")
    pods = [
        PodView(
            "nvidia-device-plugin-daemonset-x1",
            "gpu-operator",
            {"app": "nvidia-device-plugin-daemonset"},
            "Running",
        ),
        PodView(
            "nvidia-dcgm-exporter-x2", "gpu-operator", {"app": "nvidia-dcgm-exporter"}, "Running"
        ),
        PodView("training-0", "ml", {"app": "trainer"}, "Running"),  # not an operand
        PodView(
            "gpu-feature-discovery-old",
            "gpu-operator",
            {"app": "gpu-feature-discovery"},
            "Succeeded",
        ),
    ]
    labels = {**PAUSED_LABELS, MIG_CONFIG: "all-1g.5gb"}
    result = step(observe(inv, config, labels, paused_annotation(), pods, now=1100.0))
    assert result.phase == "waiting"
    assert result.actions == (
        WaitForPods(
            (
                "gpu-operator/nvidia-device-plugin-daemonset-x1",
                "gpu-operator/nvidia-dcgm-exporter-x2",
            )
        ),
    )


def test_applies_once_the_operands_are_gone(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:2")
    labels = {**PAUSED_LABELS, MIG_CONFIG: "all-1g.5gb"}
    result = step(observe(inv, config, labels, paused_annotation()))
    assert result.phase == "applying"
    (apply,) = result.actions
    assert isinstance(apply, ApplyMig)
    assert apply.plan.config == "all-1g.5gb"
    assert [g.index for g in apply.plan.gpus if not g.already_applied] == [0, 1]


def test_success_restores_labels_exactly(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:2", "all-1g.5gb")  # the apply happened
    labels = {**PAUSED_LABELS, MIG_CONFIG: "all-1g.5gb"}
    annotations = {
        **paused_annotation(),
        MIG_FAILED_CONFIG: "all-7g.40gb",
        MIG_STATE_REASON: "old",
    }
    result = step(observe(inv, config, labels, annotations))
    assert result.phase == "success"
    assert result.actions == (
        PatchNode(
            labels={DP: "true", GFD: "true", DCGM: None, MIG_CONFIG_STATE: "success"},
            annotations={MIG_PAUSED_LABELS: None, MIG_STATE_REASON: None, MIG_FAILED_CONFIG: None},
        ),
        RecordEvent("Normal", "MIGConfigApplied", "MIG config all-1g.5gb applied"),
    )


def test_a_label_changed_during_the_pause_is_not_overwritten(
    simulate: Simulate, config: MigPartedConfig
) -> None:
    inv = inventory_with(simulate, "a100-40gb:1", "all-1g.5gb")
    labels = {**PAUSED_LABELS, DP: "false", MIG_CONFIG: "all-1g.5gb"}  # an admin disabled it
    (patch, _) = step(observe(inv, config, labels, paused_annotation())).actions
    assert isinstance(patch, PatchNode)
    assert DP not in patch.labels and patch.labels[GFD] == "true"


def test_apply_failure_restores_and_fails_with_reason(
    simulate: Simulate, config: MigPartedConfig
) -> None:
    inv = inventory_with(simulate, "a100-40gb:2")
    labels = {**PAUSED_LABELS, MIG_CONFIG: "all-1g.5gb"}
    result = step(observe(inv, config, labels, paused_annotation(), apply_error="GPU 1: in use"))
    assert result.phase == "failed"
    assert result.actions == (
        PatchNode(
            labels={DP: "true", GFD: "true", DCGM: None, MIG_CONFIG_STATE: "failed"},
            annotations={
                MIG_PAUSED_LABELS: None,
                MIG_STATE_REASON: "GPU 1: in use",
                MIG_FAILED_CONFIG: "all-1g.5gb",
            },
        ),
        RecordEvent("Warning", "MIGConfigFailed", "MIG config all-1g.5gb: GPU 1: in use"),
    )


def test_non_mig_gpu_fails_without_pausing(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "t4:1")
    result = step(observe(inv, config, {**DEPLOY, MIG_CONFIG: "all-1g.5gb"}))
    assert result.phase == "failed"
    assert "Tesla T4) is not MIG capable" in result.reason
    (patch, event) = result.actions
    assert isinstance(patch, PatchNode)
    assert patch.labels == {MIG_CONFIG_STATE: "failed"}
    assert patch.annotations[MIG_STATE_REASON] == result.reason
    assert event == RecordEvent(
        "Warning", "MIGConfigFailed", f"MIG config all-1g.5gb: {result.reason}"
    )


def test_unknown_config_and_unreadable_file_fail(
    simulate: Simulate, config: MigPartedConfig
) -> None:
    inv = inventory_with(simulate, "a100-40gb:1")
    assert (
        "unknown MIG config 'all-9g'" in step(observe(inv, config, {MIG_CONFIG: "all-9g"})).reason
    )
    broken = MigObservation(
        {MIG_CONFIG: "all-1g.5gb"}, {}, [], inv, None, config_error="no such file"
    )
    assert step(broken).reason == "no such file"


def test_a_failed_config_is_retried_only_on_restart(
    simulate: Simulate, config: MigPartedConfig
) -> None:
    inv = inventory_with(simulate, "a100-40gb:1")
    labels = {**DEPLOY, MIG_CONFIG: "all-1g.5gb", MIG_CONFIG_STATE: "failed"}
    annotations = {MIG_FAILED_CONFIG: "all-1g.5gb", MIG_STATE_REASON: "boom"}
    assert step(observe(inv, config, labels, annotations)).actions == ()
    assert step(observe(inv, config, labels, annotations, first_pass=True)).phase == "pausing"
    other = {**labels, MIG_CONFIG: "all-7g.40gb"}
    assert step(observe(inv, config, other, annotations)).phase == "pausing"


def test_restart_mid_way_resumes(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:2")
    labels = {**PAUSED_LABELS, MIG_CONFIG: "all-1g.5gb"}
    result = step(observe(inv, config, labels, paused_annotation(), first_pass=True))
    assert result.phase == "applying"


def test_pause_is_reasserted_if_someone_undid_it(
    simulate: Simulate, config: MigPartedConfig
) -> None:
    inv = inventory_with(simulate, "a100-40gb:1")
    labels = {**PAUSED_LABELS, GFD: "true", MIG_CONFIG: "all-1g.5gb"}
    first, second = step(observe(inv, config, labels, paused_annotation())).actions
    assert first == PatchNode(labels={GFD: PAUSED})
    assert isinstance(second, ApplyMig)


def test_waiting_too_long_fails_and_restores(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:1")
    pods = [PodView("dcgm-1", "gpu-operator", {"app": "nvidia-dcgm"}, "Running")]
    labels = {**PAUSED_LABELS, MIG_CONFIG: "all-1g.5gb"}
    result = step(observe(inv, config, labels, paused_annotation(since=0.0), pods, now=601.0))
    assert result.phase == "failed"
    assert "timed out after 600s waiting for gpu-operator/dcgm-1" in result.reason


def test_label_removed_while_paused_restores(simulate: Simulate, config: MigPartedConfig) -> None:
    inv = inventory_with(simulate, "a100-40gb:1")
    labels = {k: v for k, v in PAUSED_LABELS.items()}
    (patch,) = step(observe(inv, config, labels, paused_annotation())).actions
    assert patch == PatchNode(
        labels={DP: "true", GFD: "true", DCGM: None}, annotations={MIG_PAUSED_LABELS: None}
    )


def test_unreadable_pause_annotation_is_ignored() -> None:
    assert Paused.decode("{not json") is None
    assert Paused.decode(json.dumps({"config": "x"})) is None


# -- the loop against an in-memory API -----------------------------------------------------------
NODE = "gpu-node-1"
OPERANDS = {  # deploy label: the app label of its operand's pods
    DP: "nvidia-device-plugin-daemonset",
    GFD: "gpu-feature-discovery",
    EXP: "nvidia-dcgm-exporter",
    DCGM: "nvidia-dcgm",
}


def operand_node(labels: dict[str, str], kube: FakeKube | None = None) -> FakeKube:
    """``kube`` (a new fake by default) holding the manager's Node and, for each deploy label
    set to true, its operand's pod on it. A paused deploy label makes the matching pods go
    away, as the DaemonSet controller would; a request for anything but what the manager may
    read and write fails."""
    kube = kube if kube is not None else FakeKube()
    node = {"metadata": {"name": NODE, "labels": dict(labels), "annotations": {}}, "status": {}}
    kube.add({"apiVersion": "v1", "kind": "Node", **node})
    for key, app in OPERANDS.items():
        if labels.get(key) == "true":
            meta = {"name": f"{app}-abc", "namespace": "gpu-operator", "labels": {"app": app}}
            pod = {"metadata": meta, "spec": {"nodeName": NODE}, "status": {"phase": "Running"}}
            kube.add({"apiVersion": "v1", "kind": "Pod", **pod})

    def daemonsets(call: Call) -> None:
        if call.kind != "Node":
            return
        now = node_meta(kube, "labels")
        paused = {app for key, app in OPERANDS.items() if now.get(key) != "true"}
        for pod in kube.of_kind("Pod"):
            if pod["metadata"]["labels"]["app"] in paused:
                kube.remove("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])

    kube.on_request = only_what_the_manager_asks
    kube.on_write = daemonsets
    return kube


def only_what_the_manager_asks(call: Call) -> None:
    """Its Node; the pods on it in the operands' namespace; Events about it in ``default``."""
    if call.verb == "list":
        assert (call.kind, call.namespace) == ("Pod", "gpu-operator")
        assert call.body == {"fieldSelector": f"spec.nodeName={NODE}"}
    elif call.verb == "create":
        assert call.kind == "Event" and call.namespace == "default"
    else:
        assert call.kind == "Node"


def node_meta(kube: FakeKube, section: str) -> dict[str, str]:
    """The Node's ``labels`` or ``annotations`` as stored now."""
    node = kube.obj("Node", NODE)
    assert node is not None
    return dict(node["metadata"].get(section) or {})


def patches(kube: FakeKube) -> list[dict[str, Any]]:
    """The merge patches sent to the Node, in order."""
    return [c.body for c in kube.calls if (c.verb, c.kind) == ("patch", "Node")]


def events(kube: FakeKube) -> list[dict[str, Any]]:
    """The Events recorded, in the order they were."""
    return sorted(kube.of_kind("Event"), key=lambda e: int(e["metadata"]["resourceVersion"]))


def test_reconcile_applies_restores_and_then_writes_nothing(
    simulate: Simulate, nvidia_mig_config: MigPartedConfig
) -> None:
    sim = simulate("a100-40gb:8")
    api = operand_node({**DEPLOY, DCGM: "true", MIG_CONFIG: "all-balanced"})
    with Nvml() as nvml:
        result = mm.reconcile(
            api,
            "gpu-node-1",
            lambda: nvidia_mig_config,
            nvml,
            first_pass=True,
            poll_interval_s=0.01,
        )
        assert result.phase == "success"
        assert node_meta(api, "labels") == {
            **DEPLOY,
            DCGM: "true",
            MIG_CONFIG: "all-balanced",
            MIG_CONFIG_STATE: "success",
        }
        assert node_meta(api, "annotations") == {}
        assert all(
            dict(g.instance_counts()) == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
            for g in nvml.inventory().gpus
        )
        # pending and the pause went out in one patch, the restore in another
        assert patches(api)[0]["metadata"]["labels"][MIG_CONFIG_STATE] == "pending"
        assert MIG_PAUSED_LABELS in patches(api)[0]["metadata"]["annotations"]
        # and the story is told on the Node, where `kubectl describe node` finds it
        assert [e["reason"] for e in events(api)] == ["MIGConfigPending", "MIGConfigApplied"]
        assert events(api)[0]["involvedObject"] == {
            "apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": "gpu-node-1"
        }  # fmt: skip
        assert events(api)[0]["source"] == {"component": "nvidia-mig-manager"}
        # the same config again: no writes (no patch, no Event), no NVML changes
        written = len(api.writes)
        sim.calls.clear()
        mm.reconcile(api, "gpu-node-1", lambda: nvidia_mig_config, nvml, first_pass=True)
        assert api.writes[written:] == []
        assert sim.calls["nvmlDeviceCreateGpuInstanceWithPlacement"] == 0
        assert sim.calls["nvmlGpuInstanceDestroy"] == 0


class ChangedAfterReadKube(FakeKube):
    """The Node's layout label is changed by someone just after the manager's ``read``-th read;
    a watch returns at once when the Node has changed since the version it is given, else
    ends the test (nothing more will change)."""

    def __init__(self, read: int, layout: str, stop: threading.Event) -> None:
        super().__init__()
        self.reads, self.read_no, self.layout, self.stop = 0, read, layout, stop

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        node = super().get(kind, name, namespace)
        self.reads += 1
        if self.reads == self.read_no:
            changed = copy.deepcopy(self.obj(kind, name, namespace))
            assert changed is not None
            changed["metadata"]["labels"][MIG_CONFIG] = self.layout
            self.add(changed)  # someone else's write: a new resourceVersion
        return node

    def wait_for_change(
        self,
        kind: str,
        name: str,
        resource_version: str,
        timeout_s: int,
        namespace: str | None = None,
    ) -> bool:
        changed = super().wait_for_change(kind, name, resource_version, 0, namespace)
        if not changed:
            self.stop.set()
        return changed


def test_a_layout_chosen_just_after_the_managers_last_read_is_applied(
    simulate: Simulate, nvidia_mig_config: MigPartedConfig
) -> None:
    """The manager watches from the version its last decision was read at: a change between
    that read and the watch is a change, not something already seen (ci-h4 waited for it)."""
    simulate("a100-40gb:2")
    stop = threading.Event()
    # read 1: all-disabled, success written; read 2: idle, and the label changes right after
    kube = ChangedAfterReadKube(2, "all-1g.5gb", stop)
    api = operand_node({**DEPLOY, MIG_CONFIG: "all-disabled"}, kube)
    with Nvml() as nvml:
        mm.run_mig_manager(
            api, "gpu-node-1", lambda: nvidia_mig_config, nvml, stop=stop, poll_interval_s=0.01
        )
        assert all(dict(g.instance_counts()) == {"1g.5gb": 7} for g in nvml.inventory().gpus)
    assert node_meta(api, "labels")[MIG_CONFIG_STATE] == "success"
    assert [e["message"] for e in events(api)] == [
        "MIG config all-disabled applied",
        "MIG config all-1g.5gb: pausing GPU operands to repartition the GPUs",
        "MIG config all-1g.5gb applied",
    ]


def test_reconcile_reports_an_nvml_failure_and_restores(
    simulate: Simulate, nvidia_mig_config: MigPartedConfig
) -> None:
    import pynvml

    sim = simulate("h100-80gb:2")
    sim.fail("nvmlDeviceCreateGpuInstanceWithPlacement", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    api = operand_node({**DEPLOY, MIG_CONFIG: "all-7g.80gb"})
    with Nvml() as nvml:
        result = mm.reconcile(
            api, "gpu-node-1", lambda: nvidia_mig_config, nvml, poll_interval_s=0.01
        )
    assert result.phase == "failed"
    annotations = node_meta(api, "annotations")
    assert node_meta(api, "labels") == {
        **DEPLOY,
        MIG_CONFIG: "all-7g.80gb",
        MIG_CONFIG_STATE: "failed",
    }
    assert "GPU 0" in annotations[MIG_STATE_REASON]
    assert "insufficient resources" in annotations[MIG_STATE_REASON]
    assert MIG_PAUSED_LABELS not in annotations
    assert [(e["type"], e["reason"]) for e in events(api)] == [
        ("Normal", "MIGConfigPending"),
        ("Warning", "MIGConfigFailed"),
    ]
    assert "insufficient resources" in events(api)[1]["message"]
