"""decide(): one snapshot and the memory in, every write out (no cluster, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from gpu_operator.api import KIND, parse_spec
from gpu_operator.controller.clusterpolicy.decide import (
    APPLIED_KINDS,
    FINALIZER,
    OPTIONAL_KINDS,
    Decision,
    decide,
)
from gpu_operator.controller.clusterpolicy.facts import gather_facts
from gpu_operator.controller.clusterpolicy.memory import Memory
from gpu_operator.controller.clusterpolicy.status import NOT_SERVED
from gpu_operator.controller.runtime.actions import (
    Apply,
    Create,
    DeletePod,
    Evict,
    Patch,
    Prune,
    Stage,
)
from gpu_operator.controller.runtime.plan import Observed
from gpu_operator.controller.runtime.watch import WATCHED
from gpu_operator.labels import (
    APPLIED_HASH,
    DEPLOY_PREFIX,
    GPU_PRESENT,
    MIG_CAPABLE,
    OWNED_ANNOTATION,
    UPGRADE_SINCE,
    UPGRADE_STATE,
    WORKLOAD_CONFIG,
)
from gpu_operator.render import render_components
from gpu_operator.render.components import REGISTRY
from gpu_operator.views import NodeView
from tests.unit.controller.builders import (
    CONFIG,
    NOW,
    cpu_node,
    daemonset,
    gpu_node,
    merge_form,
    patched,
    pod,
    policy,
    revision,
    snapshot,
    validator_pod,
)

SERVICE_MONITOR = {"dcgmExporter": {"serviceMonitor": {"enabled": True}}}
AUTO_UPGRADE = {"driver": {"upgradePolicy": {"autoUpgrade": True}}}
DRIVER_DS = "nvidia-driver-daemonset-ubuntu22.04"


def applied(decision: Decision) -> list[Mapping[str, Any]]:
    return [a.obj for a in decision.actions if isinstance(a, Apply)]


def patches(decision: Decision, purpose: str) -> list[Patch]:
    return [a for a in decision.actions if isinstance(a, Patch) and a.purpose == purpose]


def events(decision: Decision) -> list[tuple[str, str]]:
    return [(a.obj["type"], a.obj["reason"]) for a in decision.actions if isinstance(a, Create)]


def status_of(decision: Decision) -> dict[str, Any]:
    (patch,) = patches(decision, "status")
    assert patch.subresource == "status"
    status: dict[str, Any] = dict(patch.body["status"])
    return status


def labelled(node: NodeView, decision: Decision) -> NodeView:
    """The node after the decision's label patch for it (if any)."""
    for p in patches(decision, "labels"):
        if p.name == node.name:
            return patched(node, p.body)
    return node


def converge(policy_: dict[str, Any], nodes: list[NodeView]) -> tuple[Any, Memory]:
    """The world after the operator's writes took effect and every DaemonSet became ready."""
    memory = Memory()
    snap = snapshot([policy_], nodes)
    for _ in range(4):
        decision = decide(snap, memory, CONFIG)
        objects = applied(decision)
        managed = {o.key: o for o in snap.managed}
        managed |= {(o := Observed.from_k8s(obj)).key: replace(o, generation=1) for obj in objects}
        daemonsets = {d["metadata"]["name"]: d for d in snap.daemonsets}
        for obj in objects:
            if obj["kind"] == "DaemonSet":
                component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
                daemonsets[obj["metadata"]["name"]] = daemonset(obj["metadata"]["name"], component)
        policies = [
            {**p, "status": status_of(decision)} if patches(decision, "status") else p
            for p in snap.policies
        ]
        memory = replace(decision.memory, applied_generations={k: 1 for k in managed})
        snap = replace(
            snap,
            policies=tuple(policies),
            nodes=tuple(labelled(n, decision) for n in snap.nodes),
            changed_nodes=frozenset(),
            managed=tuple(managed.values()),
            daemonsets=tuple(daemonsets.values()),
        )
        if not decision.stages:
            return snap, memory
    raise AssertionError("no fixed point after 4 passes")


# -- which policy acts, finalizers, ignored and deleted policies -----------------------------


def test_nothing_to_do_without_policies() -> None:
    decision = decide(snapshot([], [gpu_node(), cpu_node()]), Memory(), CONFIG)
    assert decision.stages == ()
    assert decision.gauges.gpu_nodes == 1
    assert decision.gauges.policy_ready is None
    assert not decision.reconciled


def test_the_finalizer_comes_first_and_alone() -> None:
    fresh = policy(finalizers=["someone-else"], resource_version="42")
    decision = decide(snapshot([fresh], [gpu_node()]), Memory(), CONFIG)
    assert decision.actions == [
        Patch(
            KIND,
            "cluster-policy",
            {"metadata": {"finalizers": ["someone-else", FINALIZER], "resourceVersion": "42"}},
            "finalizer",
        )
    ]
    assert not decision.reconciled


def test_a_younger_policy_is_ignored_and_told_why() -> None:
    older = policy("first", created="2027-01-01T00:00:00Z")
    younger = policy("second", created="2027-01-02T00:00:00Z")
    decision = decide(snapshot([younger, older], [gpu_node()]), Memory(), CONFIG)
    ignored = [p for p in patches(decision, "status") if p.name == "second"]
    assert len(ignored) == 1
    status = ignored[0].body["status"]
    assert status["state"] == "ignored"
    assert "first" in status["message"]
    assert ("Normal", "Ignored") in events(decision)
    assert decision.reconciled  # the older one was decided
    assert {p.name for p in patches(decision, "status")} == {"first", "second"}


def test_an_ignored_policy_already_told_gets_no_write() -> None:
    older = policy("first")
    younger = policy("second", created="2027-01-02T00:00:00Z")
    told = decide(snapshot([older, younger], []), Memory(), CONFIG)
    status = next(p for p in patches(told, "status") if p.name == "second").body["status"]
    again = decide(snapshot([older, {**younger, "status": status}], []), Memory(), CONFIG)
    assert [p.name for p in patches(again, "status")] == ["first"]


def test_deleting_the_only_policy_cleans_nodes_before_releasing_it() -> None:
    owned_labels = {GPU_PRESENT: "true", "nvidia.com/gpu.product": "A100"}
    node = gpu_node(
        labels=owned_labels,
        annotations={OWNED_ANNOTATION: '{"labels":["nvidia.com/gpu.present"],"taints":[]}'},
    )
    gone = policy(deleting=True, finalizers=[FINALIZER, "other"])
    decision = decide(snapshot([gone], [node]), Memory(), CONFIG)
    labels_stage, release_stage = decision.stages
    (cleanup,) = labels_stage.actions
    assert isinstance(cleanup, Patch) and cleanup.purpose == "labels"
    # its own label and the rest of the stack's labels go; the ownership record too
    assert merge_form(cleanup.body)["metadata"]["labels"] == {
        GPU_PRESENT: None,
        "nvidia.com/gpu.product": None,
    }
    assert merge_form(cleanup.body)["metadata"]["annotations"] == {OWNED_ANNOTATION: None}
    assert release_stage.after_success  # only once every node is clean
    assert release_stage.actions == (
        Patch(
            KIND,
            "cluster-policy",
            {"metadata": {"finalizers": ["other"], "resourceVersion": "10"}},
            "finalizer",
        ),
    )
    # a later policy must look at every node again
    assert not decision.memory.node_policy_known


def test_deleting_a_second_policy_releases_it_without_cleanup() -> None:
    active = policy("first")
    gone = policy("second", created="2027-01-02T00:00:00Z", deleting=True)
    decision = decide(snapshot([active, gone], [gpu_node()]), Memory(), CONFIG)
    release = decision.stages[-1]
    assert not release.after_success
    assert [(a.kind, a.name, a.purpose) for a in release.actions if isinstance(a, Patch)] == [
        (KIND, "second", "finalizer")
    ]
    assert decision.reconciled


def test_a_deleted_policy_without_our_finalizer_is_left_alone() -> None:
    gone = policy(deleting=True, finalizers=["other"])
    decision = decide(snapshot([gone], [gpu_node()]), Memory(), CONFIG)
    assert decision.stages == ()


# -- the active policy ------------------------------------------------------------------------


def test_an_invalid_spec_is_reported_and_nothing_is_applied() -> None:
    bad = policy(spec={"driver": {"enabled": "maybe"}})
    decision = decide(snapshot([bad], [gpu_node()]), Memory(), CONFIG)
    assert applied(decision) == [] and patches(decision, "labels") == []
    status = status_of(decision)
    assert status["state"] == "notReady"
    assert "spec.driver.enabled" in status["conditions"][0]["message"]
    assert events(decision) == [("Warning", "ReconcileFailed")]
    assert decision.gauges.policy_ready is False
    assert not decision.reconciled


def test_a_fresh_cluster_gets_labels_then_objects_then_daemonsets_then_status() -> None:
    decision = decide(snapshot([policy()], [gpu_node(), cpu_node()]), Memory(), CONFIG)
    kinds = [{type(a).__name__ for a in s.actions} for s in decision.stages]
    assert kinds == [{"Patch"}, {"Apply"}, {"Apply"}, {"Patch", "Create"}]
    first, daemonsets = decision.stages[1], decision.stages[2]
    assert all(a.obj["kind"] != "DaemonSet" for a in first.actions if isinstance(a, Apply))
    assert all(a.obj["kind"] == "DaemonSet" for a in daemonsets.actions if isinstance(a, Apply))
    assert DRIVER_DS in {
        a.obj["metadata"]["name"] for a in daemonsets.actions if isinstance(a, Apply)
    }
    # every applied object points at the policy and carries its content hash
    for obj in applied(decision):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-cluster-policy"
        assert APPLIED_HASH in obj["metadata"]["annotations"]
    # only the GPU node is labelled
    assert [p.name for p in patches(decision, "labels")] == ["gpu-1"]
    labels = merge_form(patches(decision, "labels")[0].body)["metadata"]["labels"]
    assert labels[DEPLOY_PREFIX + "driver"] == "true"
    assert status_of(decision)["state"] == "notReady"
    assert events(decision) == [("Normal", "OperandNotReady")]
    assert decision.reconciled
    assert decision.gauges.gpu_nodes == 1
    assert decision.gauges.components_ready["driver"] is False


def test_an_unchanged_world_costs_no_write() -> None:
    snap, memory = converge(policy(), [gpu_node(), gpu_node("gpu-2"), cpu_node()])
    decision = decide(snap, memory, CONFIG)
    assert decision.stages == ()
    assert decision.gauges.policy_ready is True
    assert all(decision.gauges.components_ready.values())
    assert snap.policies[0]["status"]["state"] == "ready"


def test_a_converged_world_applies_again_what_someone_edited() -> None:
    snap, memory = converge(policy(), [gpu_node()])
    edited = next(o for o in snap.managed if o.key[0] == "DaemonSet")
    managed = tuple(replace(o, generation=2) if o == edited else o for o in snap.managed)
    decision = decide(replace(snap, managed=managed), memory, CONFIG)
    assert [(o["kind"], o["metadata"]["name"]) for o in applied(decision)] == [
        (edited.key[0], edited.key[2])
    ]


def test_objects_no_longer_desired_are_pruned() -> None:
    snap, memory = converge(policy(), [gpu_node()])
    stale = Observed(("DaemonSet", "gpu-operator", "nvidia-old-daemonset"), "h", 1)
    decision = decide(replace(snap, managed=(*snap.managed, stale)), memory, CONFIG)
    assert decision.actions == [Prune(stale.key)]


def test_disabling_a_component_prunes_it_and_relabels_every_node() -> None:
    snap, memory = converge(policy(), [gpu_node(), gpu_node("gpu-2")])
    off = policy(spec={"dcgmExporter": {"enabled": False}}, status=snap.policies[0]["status"])
    decision = decide(replace(snap, policies=(off,)), memory, CONFIG)
    assert {k[2] for a in decision.actions if isinstance(a, Prune) for k in [a.key]} >= {
        "nvidia-dcgm-exporter"
    }
    # the node policy changed: every node is looked at, though none changed
    relabelled = {
        p.name: merge_form(p.body)["metadata"]["labels"] for p in patches(decision, "labels")
    }
    assert relabelled == {
        "gpu-1": {DEPLOY_PREFIX + "dcgm-exporter": None},
        "gpu-2": {DEPLOY_PREFIX + "dcgm-exporter": None},
    }


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        (frozenset(), []),  # nothing changed: no node is looked at
        (frozenset({"gpu-2"}), ["gpu-2"]),
        (None, ["gpu-2"]),  # a full look finds the one that needs it
    ],
)
def test_only_changed_nodes_are_looked_at(
    changed: frozenset[str] | None, expected: list[str]
) -> None:
    snap, memory = converge(policy(), [gpu_node(), gpu_node("gpu-2")])
    gpu_2 = snap.nodes[1]
    labels = {k: v for k, v in gpu_2.labels.items() if not k.startswith(DEPLOY_PREFIX)}
    stripped = replace(gpu_2, labels=labels)
    snap = replace(snap, nodes=(snap.nodes[0], stripped), changed_nodes=changed)
    decision = decide(snap, memory, CONFIG)
    assert [p.name for p in patches(decision, "labels")] == expected


def test_an_apply_error_in_memory_is_reported_as_a_failed_reconcile() -> None:
    snap, memory = converge(policy(), [gpu_node()])
    failing = replace(memory, apply_error="forbidden (DaemonSet/x)")
    decision = decide(snap, failing, CONFIG)
    status = status_of(decision)
    assert status["conditions"][0]["reason"] == "ReconcileFailed"
    assert status["conditions"][0]["message"] == "forbidden (DaemonSet/x)"
    assert events(decision) == [("Warning", "ReconcileFailed")]
    assert decision.gauges.policy_ready is False


# -- ServiceMonitors (applied only where the Prometheus operator's CRD is served) -------------

SERVED = frozenset({"ServiceMonitor"})


def monitor(decision_objects: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    (sm,) = [o for o in decision_objects if o["kind"] == "ServiceMonitor"]
    return sm


def test_service_monitors_are_applied_only_where_their_kind_is_served() -> None:
    policies, nodes = [policy(spec=SERVICE_MONITOR)], [gpu_node()]
    # no Prometheus operator: nothing of that kind is applied, everything else is
    without = decide(snapshot(policies, nodes), Memory(), CONFIG)
    assert all(o["kind"] != "ServiceMonitor" for o in applied(without))
    assert applied(without)
    # ... and status says which field asked for it and what to do
    (note,) = [c for c in status_of(without)["conditions"] if c["type"] == NOT_SERVED]
    assert note["status"] == "True" and note["reason"] == "PrometheusOperatorMissing"
    assert "dcgmExporter.serviceMonitor.enabled" in note["message"]
    assert "ServiceMonitor gpu-operator/nvidia-dcgm-exporter" in note["message"]
    assert "install the Prometheus operator" in note["message"]
    served = decide(snapshot(policies, nodes, served_optional=SERVED), Memory(), CONFIG)
    assert monitor(applied(served))["metadata"]["name"] == "nvidia-dcgm-exporter"
    assert all(c["type"] != NOT_SERVED for c in status_of(served)["conditions"])


def test_a_service_monitor_is_applied_when_the_server_differs_and_pruned_when_unwanted() -> None:
    policies, nodes = [policy(spec=SERVICE_MONITOR)], [gpu_node()]
    first = decide(snapshot(policies, nodes, served_optional=SERVED), Memory(), CONFIG)
    sm = monitor(applied(first))
    key = ("ServiceMonitor", sm["metadata"]["namespace"], sm["metadata"]["name"])

    def on_server(applied_hash: str) -> Decision:
        managed = (Observed(key, applied_hash, 1),)
        snap = snapshot(policies, nodes, served_optional=SERVED, managed=managed)
        return decide(snap, Memory(), CONFIG)

    same = on_server(sm["metadata"]["annotations"][APPLIED_HASH])
    assert all(o["kind"] != "ServiceMonitor" for o in applied(same))
    assert monitor(applied(on_server("someone-elses")))["metadata"]["name"] == key[2]
    # turned off in the policy: the one on the server goes
    off = snapshot(
        [policy(spec={"dcgmExporter": {"serviceMonitor": {"enabled": False}}})],
        nodes,
        served_optional=SERVED,
        managed=(Observed(key, "h", 1),),
    )
    assert Prune(key) in decide(off, Memory(), CONFIG).actions


# -- driver upgrades ----------------------------------------------------------------------------


def upgrade_world(state: str | None, *, spec: Mapping[str, Any] = AUTO_UPGRADE, **node: Any) -> Any:
    """One GPU node whose driver pod runs the old revision of the driver DaemonSet."""
    ds = daemonset(DRIVER_DS, "driver", on_delete=True)
    uid = ds["metadata"]["uid"]
    return snapshot(
        [policy(spec=spec)],
        [gpu_node(upgrade_state=state, **node)],
        daemonsets=(ds,),
        pods=(pod("driver-gpu-1", owner_uid=uid, revision="old"), validator_pod()),
        revisions=(revision(uid, 1, "old"), revision(uid, 2, "new")),
    )


def test_an_out_of_date_driver_is_marked_for_upgrade() -> None:
    decision = decide(upgrade_world(None), Memory(), CONFIG)
    (step,) = patches(decision, "upgrade")
    assert step.kind == "Node" and step.name == "gpu-1"
    assert step.body["metadata"]["labels"][UPGRADE_STATE] == "upgrade-required"
    stage = next(s for s in decision.stages if step in s.actions)
    assert not stage.concurrent  # steps run in the planner's order
    assert stage.groups == ("gpu-1",)
    assert decision.gauges.upgrade is not None and decision.gauges.upgrade.pending == 1
    assert status_of(decision)["upgrade"]["pending"] == 1


def test_automatic_upgrades_off_plan_no_step() -> None:
    decision = decide(upgrade_world(None, spec={}), Memory(), CONFIG)
    assert patches(decision, "upgrade") == []
    assert "automatic upgrades off" in status_of(decision)["upgrade"]["message"]


def test_no_upgrade_is_planned_when_the_driver_is_disabled() -> None:
    spec = {"driver": {"enabled": False, "upgradePolicy": {"autoUpgrade": True}}}
    decision = decide(upgrade_world(None, spec=spec), Memory(), CONFIG)
    assert patches(decision, "upgrade") == []
    assert "upgrade" not in status_of(decision)
    assert decision.gauges.upgrade is None


def test_a_started_upgrade_cordons_with_an_event_in_the_nodes_group() -> None:
    decision = decide(upgrade_world("upgrade-required"), Memory(), CONFIG)
    stage = next(
        s for s in decision.stages if any(a in s.actions for a in patches(decision, "upgrade"))
    )
    assert set(stage.groups) == {"gpu-1"} and len(stage.groups) == len(stage.actions)
    node_events = [a.obj for a in stage.actions if isinstance(a, Create)]
    assert [(e["reason"], e["involvedObject"]["kind"]) for e in node_events] == [
        ("DriverUpgradeStarted", "Node")
    ]
    assert node_events[0]["reportingInstance"] == CONFIG.identity


def test_a_timed_out_drain_fails_the_node_with_a_warning_event() -> None:
    spec = {"driver": {"upgradePolicy": {"autoUpgrade": True, "drain": {
        "enable": True, "timeoutSeconds": 10}}}}  # fmt: skip
    workload = pod("job", namespace="team", node="gpu-1")
    world = upgrade_world(
        "drain-required", spec=spec, annotations={UPGRADE_SINCE: str(int(NOW - 60))}
    )
    decision = decide(replace(world, workload_pods=(workload,)), Memory(), CONFIG)
    assert ("Warning", "UpgradeFailed") in events(decision)
    failed = patches(decision, "upgrade")
    assert failed and failed[0].body["metadata"]["labels"][UPGRADE_STATE] == "upgrade-failed"


def test_pods_on_a_node_being_emptied_are_evicted_and_it_is_looked_at_again_soon() -> None:
    spec = {"driver": {"upgradePolicy": {"autoUpgrade": True, "drain": {"enable": True}}}}
    workload = pod("job", namespace="team", node="gpu-1")
    world = upgrade_world(
        "drain-required", spec=spec, annotations={UPGRADE_SINCE: str(int(NOW - 1))}
    )
    decision = decide(replace(world, workload_pods=(workload,)), Memory(), CONFIG)
    assert Evict("job", "team") in decision.actions
    assert decision.requeue_at is not None and NOW < decision.requeue_at <= NOW + 10


def test_a_forced_pod_deletion_deletes_with_no_grace() -> None:
    spec = {"driver": {"upgradePolicy": {"autoUpgrade": True, "podDeletion": {
        "force": True, "timeoutSeconds": 10}}}}  # fmt: skip
    gpu_job = pod("trainer", namespace="team", node="gpu-1", gpus=1)
    world = upgrade_world(
        "pod-deletion-required", spec=spec, annotations={UPGRADE_SINCE: str(int(NOW - 60))}
    )
    decision = decide(replace(world, workload_pods=(gpu_job,)), Memory(), CONFIG)
    assert DeletePod("trainer", "team", True) in decision.actions


def test_decision_actions_flatten_the_stages_in_order() -> None:
    a, b, c = Prune(("X", "", "a")), Prune(("X", "", "b")), Prune(("X", "", "c"))
    decision = Decision(Memory(), (Stage((a, b)), Stage((c,))))
    assert decision.actions == [a, b, c]


def test_every_kind_the_renderer_produces_is_one_the_operator_applies() -> None:
    """A rendered kind outside APPLIED_KINDS | OPTIONAL_KINDS would be skipped without a word
    (plan_changes' ``skipped`` is not reported), so a template adding a kind must add it here."""
    everything: dict[str, Any] = {c.spec_field: {"enabled": True} for c in REGISTRY}
    everything["dcgmExporter"]["serviceMonitor"] = {"enabled": True}
    nodes = [gpu_node("a"), gpu_node("b", os=("rhel", "9.4"), labels={MIG_CAPABLE: "true"})]
    spec = parse_spec(everything)
    facts = gather_facts(nodes, spec, namespace=CONFIG.namespace, configmap_hashes={})
    rendered = {o["kind"] for part in render_components(spec, facts) for o in part.objects}
    assert "DaemonSet" in rendered and "ServiceMonitor" in rendered
    assert rendered <= APPLIED_KINDS | OPTIONAL_KINDS
    # and everything applied is watched (so it can be diffed and pruned), the optional kinds as
    # optional (the operator runs without them)
    assert {w.kind.kind for w in WATCHED} >= APPLIED_KINDS | OPTIONAL_KINDS
    assert {w.kind.kind for w in WATCHED if w.optional} >= OPTIONAL_KINDS


# -- GPU health remediation -------------------------------------------------------------------

HEALTH_ON = {"healthRemediation": {"enabled": True, "maxUnavailable": 1}}


def _unhealthy(node: NodeView) -> NodeView:
    from gpu_operator.views import GpuHealth

    health = GpuHealth("False", "GPUXid", "GPU 0 GPU-a: XID 79", NOW - 5)
    return replace(node, gpu_health=health, resource_version="7")  # as the agent's write left it


def test_an_unhealthy_gpu_node_is_quarantined_in_one_json_patch_counted_and_reported() -> None:
    snap, memory = converge(policy(spec=HEALTH_ON), [gpu_node("gpu-1"), gpu_node("gpu-2")])
    sick = _unhealthy(snap.nodes[0])
    snap = replace(snap, nodes=(sick, snap.nodes[1]), changed_nodes=frozenset({sick.name}))
    decision = decide(snap, memory, CONFIG)
    (patch,) = patches(decision, "health")
    assert (patch.name, patch.patch_type) == ("gpu-1", "json")
    assert patch.tally == ("remediations", "quarantine", "started")
    assert ("Warning", "GPUQuarantined") in events(decision)
    status = status_of(decision)["healthRemediation"]
    assert status["unhealthy"] == 1 and status["limit"] == 1 and status["enabled"] is True
    # The watch has not shown the write yet: the next pass writes nothing to that node.
    again = decide(snap, decision.memory, CONFIG)
    assert not patches(again, "health")


def test_without_health_remediation_the_status_has_no_new_field_and_nothing_is_written() -> None:
    snap, memory = converge(policy(), [gpu_node("gpu-1")])
    sick = _unhealthy(snap.nodes[0])
    snap = replace(snap, nodes=(sick,), changed_nodes=frozenset({sick.name}))
    decision = decide(snap, memory, CONFIG)
    assert not patches(decision, "health")
    for p in patches(decision, "status"):
        assert "healthRemediation" not in p.body["status"]


def test_health_remediation_makes_every_operand_tolerate_the_quarantine_taint() -> None:
    snap, _ = converge(policy(spec=HEALTH_ON), [gpu_node("gpu-1")])
    spec = parse_spec(policy(spec=HEALTH_ON)["spec"])
    facts = gather_facts(snap.nodes, spec, namespace="gpu-operator", configmap_hashes={})
    daemonsets = [
        o
        for part in render_components(spec, facts)
        for o in part.objects
        if o["kind"] == "DaemonSet"
    ]
    assert daemonsets
    for ds in daemonsets:
        keys = {t.get("key") for t in ds["spec"]["template"]["spec"].get("tolerations") or ()}
        assert "nvidia.com/gpu.unhealthy" in keys, ds["metadata"]["name"]


# -- sandbox workloads -----------------------------------------------------------------------------


SANDBOX = {"sandboxWorkloads": {"enabled": True}, "vfioManager": {"enabled": True}}


def test_a_bad_workload_config_is_told_on_the_node_once_and_in_the_status() -> None:
    bad = gpu_node("gpu-2", labels={WORKLOAD_CONFIG: "vm"})
    snap, memory = converge(policy(spec=SANDBOX), [gpu_node(), bad])
    conditions = {c["type"]: c for c in snap.policies[0]["status"]["conditions"]}
    message = conditions["WorkloadConfigInvalid"]["message"]
    assert message.startswith("node gpu-2: nvidia.com/gpu.workload.config='vm' is none of")
    assert "gpu-1" not in message
    # the first pass told the node; a converged world tells nothing again
    first = decide(snapshot([policy(spec=SANDBOX)], [gpu_node(), bad]), Memory(), CONFIG)
    told = [
        (a.obj["involvedObject"]["kind"], a.obj["involvedObject"]["name"])
        for a in first.actions
        if isinstance(a, Create) and a.obj["reason"] == "InvalidWorkloadConfig"
    ]
    assert told == [("Node", "gpu-2")]
    assert decide(snap, memory, CONFIG).stages == ()
    # the bad node got no deploy label; the good one the container stack
    by_name = {n.name: n for n in snap.nodes}
    assert not any(k.startswith(DEPLOY_PREFIX) for k in by_name["gpu-2"].labels)
    assert by_name["gpu-1"].labels[DEPLOY_PREFIX + "driver"] == "true"


@pytest.mark.parametrize(
    ("mode", "operands"),
    [
        (
            "kubevirt",
            {"vfio-manager", "sandbox-validator", "sandbox-device-plugin", "kata-manager"},
        ),
        (
            "kata",
            {"vfio-manager", "sandbox-validator", "kata-sandbox-device-plugin", "kata-manager"},
        ),
    ],
)
def test_sandbox_operands_count_in_readiness(mode: str, operands: set[str]) -> None:
    spec = {
        **SANDBOX,
        "sandboxWorkloads": {"enabled": True, "mode": mode},
        "sandboxDevicePlugin": {"enabled": True},
        "kataSandboxDevicePlugin": {"enabled": True},
        "kataManager": {"enabled": True},
    }
    vm = gpu_node(labels={WORKLOAD_CONFIG: "vm-passthrough"})
    snap, _ = converge(policy(spec=spec), [vm])
    components = {c["name"]: c for c in snap.policies[0]["status"]["components"]}
    assert operands <= set(components)
    assert all(components[name]["ready"] for name in operands)
    assert snap.policies[0]["status"]["state"] == "ready"
