"""The ComputeDomain loop's pure decision: what each domain gets and in which order, what its
status says about its daemons (why one is not ready, too), how a deleted domain waits for its
channels' holders before it is taken apart, and that a pass over its own result writes nothing."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from gpu_operator.controller.computedomain.decide import (
    FINALIZER,
    WAIT_S,
    DomainDecision,
    DomainSnapshot,
    claim_holders,
    daemon_problem,
    decide_domains,
)
from gpu_operator.controller.runtime.actions import Apply, Patch, Prune
from gpu_operator.render.computedomain import DaemonSettings, daemon_name
from gpu_operator.views import NodeView

NS = "gpu-operator"
SETTINGS = DaemonSettings(namespace=NS, image="example.com/gpu-operator:1")
STAMP = "2026-01-01T00:00:00Z"
NOW = 1_000.0
LABEL = "resource.nvidia.com/computeDomain"
CLIQUE = "nvidia.com/gpu.clique"


def domain(
    name: str = "training",
    uid: str = "uid-1",
    namespace: str = "team-a",
    template: str = "imex-channel",
    finalizers: tuple[str, ...] = (FINALIZER,),
    created: str = "2026-01-01T00:00:00Z",
    **spec: Any,
) -> dict[str, Any]:
    chan: dict[str, Any] = {"resourceClaimTemplate": {"name": template}}
    if "mode" in spec:
        chan["allocationMode"] = spec.pop("mode")
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": 1,
            "resourceVersion": "7",
            "creationTimestamp": created,
            "finalizers": list(finalizers),
        },
        "spec": {"channel": chan, **spec},
    }


def node(name: str, uid: str | None = "uid-1", clique: str | None = "rack-1.0") -> NodeView:
    labels = {}
    if uid:
        labels[LABEL] = uid
    if clique:
        labels[CLIQUE] = clique
    return NodeView(name=name, labels=labels)


def daemon_pod(
    node_name: str | None,
    uid: str = "uid-1",
    ready: bool = True,
    ip: str | None = None,
    **status: Any,
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    pod_status: dict[str, Any] = {"phase": "Running", "conditions": conditions, **status}
    if ip or (node_name and ready):
        pod_status["podIP"] = ip or f"10.0.0.{node_name[-1] if node_name else 0}"
    spec = {"nodeName": node_name} if node_name else {}
    return {
        "metadata": {
            "name": f"{daemon_name(uid)}-{node_name or 'pending'}",
            "namespace": NS,
            "uid": f"pod-{node_name}",
            "labels": {LABEL: uid},
            "creationTimestamp": "2026-01-01T00:01:00Z",
        },
        "spec": spec,
        "status": pod_status,
    }


def crashing(node_name: str) -> dict[str, Any]:
    return daemon_pod(
        node_name,
        ready=False,
        ip="10.0.0.9",
        containerStatuses=[
            {
                "name": "compute-domain-daemon",
                "ready": False,
                "state": {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off 5m0s restarting failed container",
                    }
                },
                "lastState": {
                    "terminated": {
                        "reason": "Error",
                        "exitCode": 1,
                        "message": "nvidia-imex: fabric manager not running",
                    }
                },
            }
        ],
    )


def snapshot(**kwargs: Any) -> DomainSnapshot:
    kwargs.setdefault("domains", (domain(),))
    return DomainSnapshot(now=NOW, stamp=STAMP, **kwargs)


def decide(snap: DomainSnapshot | None = None, **kwargs: Any) -> DomainDecision:
    return decide_domains(snap or snapshot(**kwargs), SETTINGS)


def applied(decision: DomainDecision) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, namespace/name) -> each applied object."""
    return {
        (a.obj["kind"], f"{a.obj['metadata']['namespace']}/{a.obj['metadata']['name']}"): dict(
            a.obj
        )
        for a in decision.actions
        if isinstance(a, Apply)
    }


def status_of(decision: DomainDecision, name: str = "training") -> dict[str, Any]:
    (patch,) = [p for p in decision.patches("status") if p.name == name]
    body: dict[str, Any] = patch.body["status"]
    return body


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    (cond,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    return cond


# -- a world the decisions are carried out in, as the API server would


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def carried_out(snap: DomainSnapshot, decision: DomainDecision) -> DomainSnapshot:
    """``snap`` after every action of ``decision`` succeeded."""
    domains = {(d["metadata"]["namespace"], d["metadata"]["name"]): copy.deepcopy(d)
               for d in snap.domains}  # fmt: skip
    objects = {
        (o.get("kind") or "", o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in (*snap.daemonsets, *snap.templates)
    }
    nodes = {n.name: n for n in snap.nodes}
    for action in decision.actions:
        if isinstance(action, Apply):
            obj = copy.deepcopy(dict(action.obj))
            objects[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        elif isinstance(action, Prune):
            kind, namespace, name = action.key
            del objects[(kind, namespace, name)]
        elif isinstance(action, Patch) and action.kind == "ComputeDomain":
            key = (action.namespace or "", action.name)
            body = dict(action.body)
            if action.purpose == "finalizer":
                body["metadata"] = {"finalizers": body["metadata"]["finalizers"]}
            domains[key] = merged(domains[key], body)
        elif isinstance(action, Patch) and action.kind == "Node":
            ops = list(action.body)
            labels = dict(nodes[action.name].labels)
            for op in ops:
                key = op["path"].rsplit("/", 1)[1].replace("~1", "/")
                if op["op"] == "test":
                    assert labels.get(key) == op["value"]
                elif op["op"] == "remove":
                    del labels[key]
            nodes[action.name] = replace(nodes[action.name], labels=labels)
    kept = tuple(
        d
        for d in domains.values()
        if not (d["metadata"].get("deletionTimestamp") and not d["metadata"].get("finalizers"))
    )
    return replace(
        snap,
        domains=kept,
        daemonsets=tuple(o for k, o in objects.items() if k[0] == "DaemonSet"),
        templates=tuple(o for k, o in objects.items() if k[0] == "ResourceClaimTemplate"),
        nodes=tuple(nodes.values()),
    )


def converged(snap: DomainSnapshot, passes: int = 4) -> DomainSnapshot:
    for _ in range(passes):
        decision = decide(snap)
        if not decision.actions:
            return snap
        snap = carried_out(snap, decision)
    raise AssertionError(f"still writing after {passes} passes: {decide(snap).actions}")


# -- creation


def test_a_new_domain_gets_the_finalizer_first_then_its_templates_then_its_daemons() -> None:
    decision = decide(domains=(domain(finalizers=()),))
    stages = [[type(a).__name__ for a in s.actions] for s in decision.stages]
    assert stages == [["Patch"], ["Apply", "Apply"], ["Apply"], ["Patch"]]
    (finalizer,) = decision.patches("finalizer")
    assert finalizer.body == {"metadata": {"finalizers": [FINALIZER], "resourceVersion": "7"}}
    assert (finalizer.kind, finalizer.name, finalizer.namespace) == (
        "ComputeDomain", "training", "team-a")  # fmt: skip
    assert FINALIZER == "resource.nvidia.com/computeDomain"  # NVIDIA's, so either takes apart
    assert set(applied(decision)) == {
        ("ResourceClaimTemplate", f"{NS}/{daemon_name('uid-1')}"),
        ("DaemonSet", f"{NS}/{daemon_name('uid-1')}"),
        ("ResourceClaimTemplate", "team-a/imex-channel"),
    }


def test_only_the_workload_template_is_owned_by_its_domain() -> None:
    objects = applied(decide())
    workload = objects[("ResourceClaimTemplate", "team-a/imex-channel")]
    (owner,) = workload["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                     "name": "training", "uid": "uid-1", "controller": True}  # fmt: skip
    for key, obj in objects.items():
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-operator"
        if key[1].startswith(NS):  # another namespace than the domain's: GC would delete them
            assert "ownerReferences" not in obj["metadata"]


def test_a_domain_with_its_finalizer_gets_no_finalizer_patch() -> None:
    assert decide().patches("finalizer") == []


@pytest.mark.parametrize(("mode", "expected"), [(None, "Single"), ("Single", "Single"),
                                                ("All", "All")])  # fmt: skip
def test_the_channel_config_carries_the_allocation_mode(mode: str | None, expected: str) -> None:
    extra = {"mode": mode} if mode else {}
    workload = applied(decide(domains=(domain(**extra),)))[
        ("ResourceClaimTemplate", "team-a/imex-channel")
    ]
    (config,) = workload["spec"]["spec"]["devices"]["config"]
    assert config["opaque"]["parameters"]["allocationMode"] == expected
    assert config["opaque"]["parameters"]["domainID"] == "uid-1"


def test_each_domain_gets_its_own_objects_in_its_own_namespace() -> None:
    decision = decide(
        domains=(domain(), domain("other", uid="uid-2", namespace="team-b", template="ch"))
    )
    keys = set(applied(decision))
    assert ("ResourceClaimTemplate", "team-b/ch") in keys
    assert ("DaemonSet", f"{NS}/{daemon_name('uid-2')}") in keys
    assert len(keys) == 6


# -- idempotence


def test_a_pass_over_its_own_result_writes_nothing() -> None:
    snap = snapshot(domains=(domain(finalizers=()),), nodes=(node("n1"),),
                    daemon_pods=(daemon_pod("n1"),))  # fmt: skip
    after = carried_out(snap, decide(snap))
    second = decide(after)
    assert second.actions == [] and second.requeue_at is None


def test_an_unchanged_status_is_not_written_again_even_with_a_failing_daemon() -> None:
    snap = snapshot(nodes=(node("n1"), node("n2")), daemon_pods=(daemon_pod("n1"), crashing("n2")))
    done = converged(snap)
    assert done.domains[0]["status"]["status"] == "NotReady"
    later = replace(done, stamp="2026-01-01T01:00:00Z")  # time passes, nothing changes
    assert decide(later).actions == []


def test_an_edited_object_is_applied_again() -> None:
    snap = converged(snapshot())
    ds = copy.deepcopy(next(iter(snap.daemonsets)))
    ds["metadata"]["annotations"]["nvidia.com/gpu-operator.applied-hash"] = "edited"
    (again,) = decide(replace(snap, daemonsets=(ds,))).actions
    assert isinstance(again, Apply) and again.obj["kind"] == "DaemonSet"


# -- status from the daemons


def test_a_domain_is_ready_when_every_daemon_is() -> None:
    snap = snapshot(
        nodes=(node("n1"), node("n2", clique=None)),
        daemon_pods=(daemon_pod("n1"), daemon_pod("n2")),
    )
    status = status_of(decide(snap))
    assert status["status"] == "Ready"
    assert status["nodes"] == [
        {"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "rack-1.0", "index": 0,
         "status": "Ready"},
        {"name": "n2", "ipAddress": "10.0.0.2", "cliqueID": "", "index": -1, "status": "Ready"},
    ]  # fmt: skip
    cond = ready_condition(status)
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True", "DaemonsReady", "2 IMEX daemons ready")  # fmt: skip
    assert cond["lastTransitionTime"] == STAMP and cond["observedGeneration"] == 1


def test_a_daemon_on_a_node_not_seen_yet_is_not_counted_ready_in_no_clique() -> None:
    """The node's labels (its clique) come by another watch than its daemon pod: a pass that
    sees the pod first does not list the daemon Ready with an empty clique."""
    pods = (daemon_pod("n1"), daemon_pod("n2"))
    early = status_of(decide(snapshot(nodes=(node("n1"),), daemon_pods=pods)))
    assert early["status"] == "NotReady"
    entry = {n["name"]: n for n in early["nodes"]}["n2"]
    assert (entry["status"], entry["cliqueID"]) == ("NotReady", "")
    assert "n2: its node is not seen labelled" in ready_condition(early)["message"]
    later = status_of(decide(snapshot(nodes=(node("n1"), node("n2")), daemon_pods=pods)))
    assert later["status"] == "Ready"
    assert {n["cliqueID"] for n in later["nodes"]} == {"rack-1.0"}


def test_a_domain_no_workload_has_joined_is_ready_as_nvidias() -> None:
    status = status_of(decide())
    assert status["status"] == "Ready" and "nodes" not in status
    assert "no node has joined yet" in ready_condition(status)["message"]


def test_a_daemon_that_cannot_start_names_its_node_and_its_reason() -> None:
    snap = snapshot(nodes=(node("n1"), node("n2")), daemon_pods=(daemon_pod("n1"), crashing("n2")))
    status = status_of(decide(snap))
    assert status["status"] == "NotReady"
    assert [(n["name"], n["status"]) for n in status["nodes"]] == [("n1", "Ready"),
                                                                   ("n2", "NotReady")]  # fmt: skip
    cond = ready_condition(status)
    assert (cond["status"], cond["reason"]) == ("False", "DaemonNotReady")
    assert cond["message"] == (
        "IMEX daemon not ready on n2: CrashLoopBackOff: back-off 5m0s restarting failed "
        "container; last exit: Error (exit code 1): nvidia-imex: fabric manager not running"
    )


def test_the_daemons_own_clique_label_wins_over_the_nodes() -> None:
    pod = daemon_pod("n1")
    pod["metadata"]["labels"]["resource.nvidia.com/computeDomain.cliqueID"] = "rack-9.1"
    (entry,) = status_of(decide(nodes=(node("n1"),), daemon_pods=(pod,)))["nodes"]
    assert entry["cliqueID"] == "rack-9.1"


def test_a_node_keeps_its_index_and_a_new_one_takes_the_lowest_free() -> None:
    old = domain()
    old["status"] = {
        "status": "Ready",
        "nodes": [
            {"name": "n2", "ipAddress": "10.0.0.2", "cliqueID": "rack-1.0", "index": 1,
             "status": "Ready"},
        ],
    }  # fmt: skip
    snap = snapshot(
        domains=(old,),
        nodes=(node("n1"), node("n2"), node("n3")),
        daemon_pods=(daemon_pod("n1"), daemon_pod("n2"), daemon_pod("n3")),
    )
    indexes = {n["name"]: n["index"] for n in status_of(decide(snap))["nodes"]}
    assert indexes == {"n2": 1, "n1": 0, "n3": 2}


def test_with_num_nodes_the_domain_waits_for_that_many_daemons() -> None:
    snap = snapshot(domains=(domain(numNodes=3),), nodes=(node("n1"),),
                    daemon_pods=(daemon_pod("n1"),))  # fmt: skip
    cond = ready_condition(status := status_of(decide(snap)))
    assert status["status"] == "NotReady"
    assert (cond["reason"], cond["message"]) == (
        "WaitingForNodes", "1 of numNodes 3 IMEX daemons ready")  # fmt: skip


def test_a_labelled_node_without_a_daemon_and_an_unscheduled_pod_are_named() -> None:
    pending = daemon_pod(None, ready=False)
    pending["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient cpu."}],
    }  # fmt: skip
    snap = snapshot(nodes=(node("n1"),), daemon_pods=(pending,))
    message = ready_condition(status_of(decide(snap)))["message"]
    assert "n1: no IMEX daemon pod on this node yet" in message
    assert "not scheduled: Unschedulable: 0/3 nodes are available: 3 Insufficient cpu." in message


def test_daemons_of_other_domains_or_namespaces_do_not_count() -> None:
    stray = daemon_pod("n1")
    stray["metadata"]["namespace"] = "elsewhere"
    snap = snapshot(daemon_pods=(daemon_pod("n2", uid="uid-2", ready=False), stray))
    assert "nodes" not in status_of(decide(snap))


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            {"containerStatuses": [{"name": "compute-domain-daemon", "ready": False,
             "state": {"waiting": {"reason": "ImagePullBackOff",
                                   "message": "Back-off pulling image \"x\""}}}]},
            'ImagePullBackOff: Back-off pulling image "x"',
        ),
        (
            {"containerStatuses": [{"name": "compute-domain-daemon", "ready": False,
             "state": {"terminated": {"reason": "Error", "exitCode": 2}}}]},
            "exited: Error (exit code 2)",
        ),
        (
            {"containerStatuses": [{"name": "compute-domain-daemon", "ready": False,
             "state": {"running": {}}}]},
            "running, not ready: its check fails (the IMEX daemon is not up yet)",
        ),
        ({"phase": "Pending"}, "pending: its container is not created yet (is its daemon "
                               "claim prepared?)"),
    ],
)  # fmt: skip
def test_a_daemons_problem_is_told_in_its_containers_words(
    status: dict[str, Any], expected: str
) -> None:
    assert daemon_problem({"metadata": {"name": "p"}, "status": status}) == expected


def test_a_long_reason_is_cut() -> None:
    pod = crashing("n1")
    terminated = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    terminated["message"] = "x" * 5000
    message = ready_condition(status_of(decide(nodes=(node("n1"),), daemon_pods=(pod,))))["message"]
    assert message.endswith("...") and len(message) < 400


def test_status_patches_name_the_domains_namespace_and_the_subresource() -> None:
    (patch,) = decide().patches("status")
    assert (patch.namespace, patch.subresource) == ("team-a", "status")


# -- conflicts and bad specs


def test_a_template_someone_else_made_is_left_alone_and_the_status_says_so() -> None:
    theirs = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "imex-channel", "namespace": "team-a", "labels": {}},
    }
    decision = decide(templates=(theirs,))
    assert ("ResourceClaimTemplate", "team-a/imex-channel") not in applied(decision)
    assert not [a for a in decision.actions if isinstance(a, Prune)]
    status = status_of(decision)
    cond = ready_condition(status)
    assert status["status"] == "NotReady" and cond["reason"] == "TemplateConflict"
    assert "team-a/imex-channel exists and is not this domain's" in cond["message"]


def test_of_two_domains_naming_one_template_the_older_has_it() -> None:
    older = domain("first", uid="uid-1")
    newer = domain("second", uid="uid-2", created="2026-01-02T00:00:00Z")
    decision = decide(domains=(newer, older))
    workload = applied(decision)[("ResourceClaimTemplate", "team-a/imex-channel")]
    assert workload["metadata"]["labels"][LABEL] == "uid-1"
    cond = ready_condition(status_of(decision, "second"))
    assert cond["reason"] == "TemplateConflict" and "ComputeDomain first" in cond["message"]


def test_an_invalid_spec_creates_nothing_and_says_why() -> None:
    bad = domain(finalizers=())
    bad["spec"]["channel"]["allocationMode"] = "Many"
    decision = decide(domains=(bad,))
    assert [type(a).__name__ for a in decision.actions] == ["Patch"]
    cond = ready_condition(status_of(decision))
    assert cond["reason"] == "InvalidSpec"
    assert "spec.channel.allocationMode" in cond["message"]


# -- deletion


def deleted(doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"]["deletionTimestamp"] = "2026-01-01T02:00:00Z"
    return doc


def channel_claim(holder: str | None, uid: str = "uid-1") -> dict[str, Any]:
    config = [{"requests": ["channel"], "opaque": {"driver": "compute-domain.nvidia.com",
               "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
                              "kind": "ComputeDomainChannelConfig", "domainID": uid,
                              "allocationMode": "Single"}}}]  # fmt: skip
    reserved = [{"resource": "pods", "name": holder, "uid": f"uid-{holder}"}] if holder else []
    return {
        "metadata": {"name": f"{holder}-channel", "namespace": "team-a"},
        "spec": {"devices": {"config": config}},
        "status": {"reservedFor": reserved},
    }


def workload_pod(name: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
            "status": {"phase": phase}}  # fmt: skip


def running_world() -> DomainSnapshot:
    return converged(
        snapshot(nodes=(node("n1"), node("n2")), daemon_pods=(daemon_pod("n1"), daemon_pod("n2")))
    )


def test_a_deleted_domain_waits_while_a_pod_holds_its_channel() -> None:
    world = running_world()
    snap = replace(
        world,
        domains=(deleted(copy.deepcopy(world.domains[0])),),
        claims=(channel_claim("worker-0"), channel_claim("worker-1")),
        pods=(workload_pod("worker-0"), workload_pod("worker-1")),
    )
    decision = decide(snap)
    assert not [a for a in decision.actions if isinstance(a, (Prune, Apply))]
    assert decision.patches("finalizer") == [] and decision.patches("labels") == []
    assert decision.requeue_at == NOW + WAIT_S
    (terminating,) = [c for c in status_of(decision)["conditions"] if c["type"] == "Terminating"]
    assert terminating["reason"] == "WaitingForClaims"
    assert "team-a/worker-0, team-a/worker-1" in terminating["message"]
    assert decide(carried_out(snap, decision)).actions == []  # waiting writes nothing more


def test_finished_or_vanished_holders_and_other_domains_claims_do_not_hold_it() -> None:
    snap = snapshot(
        claims=(channel_claim("done"), channel_claim("gone"), channel_claim("x", uid="uid-2"),
                channel_claim(None)),
        pods=(workload_pod("done", "Succeeded"), workload_pod("x")),
    )  # fmt: skip
    assert claim_holders(snap, "uid-1") == []
    assert claim_holders(snap, "uid-2") == ["team-a/x"]


def test_a_deleted_domain_without_holders_is_taken_apart_in_order() -> None:
    world = running_world()
    snap = replace(world, domains=(deleted(copy.deepcopy(world.domains[0])),))
    decision = decide(snap)
    stages = [(s.after_success, sorted(_what(a) for a in s.actions)) for s in decision.stages]
    assert stages == [
        (False, [f"delete DaemonSet {daemon_name('uid-1')}"]),
        (False, [f"delete ResourceClaimTemplate {daemon_name('uid-1')}",
                 "delete ResourceClaimTemplate imex-channel"]),
        (False, ["labels n1", "labels n2"]),
        (True, ["finalizer training"]),
    ]  # fmt: skip
    (label,) = [p for p in decision.patches("labels") if p.name == "n1"]
    assert label.patch_type == "json"
    assert label.body == [  # only if it still names this domain: the plugin may relabel it
        {"op": "test", "path": "/metadata/labels/resource.nvidia.com~1computeDomain",
         "value": "uid-1"},
        {"op": "remove", "path": "/metadata/labels/resource.nvidia.com~1computeDomain"},
    ]  # fmt: skip
    (finalizer,) = decision.patches("finalizer")
    assert finalizer.body == {"metadata": {"finalizers": [], "resourceVersion": "7"}}
    assert decision.requeue_at == NOW + WAIT_S


def _what(action: Any) -> str:
    if isinstance(action, Prune):
        return f"delete {action.key[0]} {action.key[2]}"
    return f"{action.purpose} {action.name}"


def test_the_finalizer_comes_off_alone_once_nothing_is_left() -> None:
    decision = decide(domains=(deleted(domain()),))
    ((stage),) = decision.stages
    assert not stage.after_success
    assert [_what(a) for a in stage.actions] == ["finalizer training"]
    assert decision.requeue_at is None


def test_a_deleted_domain_with_someone_elses_finalizer_only_is_left_alone() -> None:
    decision = decide(domains=(deleted(domain(finalizers=("example.com/keep",))),))
    assert decision.actions == []


def test_the_whole_life_of_a_domain() -> None:
    world = running_world()
    assert world.domains[0]["status"]["status"] == "Ready"
    held = replace(
        world,
        domains=(deleted(copy.deepcopy(world.domains[0])),),
        claims=(channel_claim("worker-0"),),
        pods=(workload_pod("worker-0"),),
    )
    held = converged(held)
    assert len(held.daemonsets) == 1 and len(held.templates) == 2  # still serving
    released = replace(held, pods=(workload_pod("worker-0", "Succeeded"),))
    gone = converged(released)
    assert gone.domains == () and gone.daemonsets == () and gone.templates == ()
    assert all(LABEL not in n.labels for n in gone.nodes)
    assert all(CLIQUE in n.labels for n in gone.nodes)  # others' labels stay


# -- what a vanished domain left behind


def test_objects_and_labels_of_a_vanished_domain_go_and_nobody_elses() -> None:
    world = running_world()
    nvidias = copy.deepcopy(next(t for t in world.templates if t["metadata"]["namespace"] == NS))
    nvidias["metadata"]["labels"] = {LABEL: "uid-9"}  # NVIDIA's controller's, not ours
    nvidias["metadata"]["name"] = "computedomain-daemon-uid-9"
    snap = replace(world, domains=(), templates=(*world.templates, nvidias),
                   nodes=(*world.nodes, node("n3", uid="uid-9")))  # fmt: skip
    decision = decide(snap)
    pruned = {a.key for a in decision.actions if isinstance(a, Prune)}
    assert pruned == {
        ("DaemonSet", NS, daemon_name("uid-1")),
        ("ResourceClaimTemplate", NS, daemon_name("uid-1")),
        ("ResourceClaimTemplate", "team-a", "imex-channel"),
    }
    assert sorted(p.name for p in decision.patches("labels")) == ["n1", "n2", "n3"]
    assert decision.patches("status") == []


def test_labels_of_a_live_domain_stay() -> None:
    decision = decide(nodes=(node("n1"), node("n2", uid="uid-2")))
    assert [p.name for p in decision.patches("labels")] == ["n2"]


def test_a_deleted_domain_never_takes_a_template_made_since_under_its_name() -> None:
    world = running_world()
    templates = [t for t in world.templates if t["metadata"]["namespace"] == NS]
    someone = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "imex-channel", "namespace": "team-a", "labels": {}},
    }
    snap = replace(
        world,
        domains=(deleted(copy.deepcopy(world.domains[0])),),
        templates=(*templates, someone),
        claims=(channel_claim("worker-0"),),
        pods=(workload_pod("worker-0"),),
    )
    decision = decide(snap)
    assert not [a for a in decision.actions if isinstance(a, (Apply, Prune))]
