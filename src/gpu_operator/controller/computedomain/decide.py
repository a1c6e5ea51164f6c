"""The ComputeDomain loop's decisions (pure): one snapshot of every domain and what it owns in,
every write out.

For each live domain: NVIDIA's finalizer first, then its daemon claim template and IMEX-daemon
DaemonSet in the driver's namespace and its workload channel template in its own, and a
status built from the daemon pods: ``nodes[]`` as NVIDIA lists them, and a ``Ready`` condition
naming each node whose daemon is not ready with the reason its container gives.

A deleted domain is taken apart in order, under the finalizer: while a pod still holds one of
its channel claims (the IMEX channel is in use), everything stays and the status says who
holds it; then the DaemonSet, the claim templates and the nodes' domain labels go, and the
finalizer comes off once they have (in the same pass when every deletion succeeded).

Objects and node labels carrying the uid of a domain that no longer exists are removed too: a
label's uid always appears in the snapshot's domains before it can appear on a node, because
the kubelet plugin labels a node only when it prepares a claim from a template this loop made
after seeing the domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api import PolicyError
from gpu_operator.api import computedomain as cd
from gpu_operator.api.computedomain import ComputeDomain, claim_domain_id, parse_computedomain
from gpu_operator.controller.conditions import condition
from gpu_operator.controller.runtime.actions import Action, Apply, Patch, Prune, Purpose, Stage
from gpu_operator.controller.runtime.plan import Observed, Owner, key_of, plan_changes, stamp
from gpu_operator.jsonpatch import finalizer_body, map_ops, merge_patch_to
from gpu_operator.labels import (
    COMPUTE_DOMAIN,
    COMPUTE_DOMAIN_CLIQUE,
    GPU_CLIQUE,
    MANAGED_BY,
    OPERATOR_NAME,
)
from gpu_operator.render.computedomain import (
    DAEMON_CONTAINER,
    DaemonSettings,
    daemon_template,
    daemonset,
    workload_template,
)
from gpu_operator.views import NodeView

# NVIDIA's finalizer (its controller's, spelt as its label key): a domain NVIDIA's controller
# made is taken apart by this one, and the other way round.
FINALIZER = COMPUTE_DOMAIN
READY_CONDITION = "Ready"
TERMINATING_CONDITION = "Terminating"
WAIT_S = 10.0  # how soon a teardown waiting on claims looks again, should no watch wake it
REASON_MAX = 300  # characters of one daemon's reason in a condition message
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class DomainSnapshot:
    """What one pass decides from, as the API gives it.

    ``domains``: every ComputeDomain (all namespaces). ``daemonsets`` and ``daemon_pods``: those
    labelled ``resource.nvidia.com/computeDomain``. ``templates``: ResourceClaimTemplates with
    that label, and those at the names the domains ask for. ``claims``: ResourceClaims in the
    domains' namespaces; ``pods``: the pods they are reserved for. ``nodes``: nodes with the
    label. ``now`` (epoch seconds) and ``stamp`` (RFC 3339) are when the pass runs.
    """

    now: float
    stamp: str
    domains: tuple[Mapping[str, Any], ...] = ()
    daemonsets: tuple[Mapping[str, Any], ...] = ()
    daemon_pods: tuple[Mapping[str, Any], ...] = ()
    templates: tuple[Mapping[str, Any], ...] = ()
    claims: tuple[Mapping[str, Any], ...] = ()
    pods: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[NodeView, ...] = ()


@dataclass(frozen=True)
class DomainDecision:
    """What one pass writes, stage by stage, and when to look again (None: when woken)."""

    stages: tuple[Stage, ...] = ()
    requeue_at: float | None = None

    @property
    def actions(self) -> list[Action]:
        return [a for s in self.stages for a in s.actions]

    def patches(self, purpose: Purpose) -> list[Patch]:
        """The patches made for ``purpose`` (status, finalizer, labels)."""
        return [a for a in self.actions if isinstance(a, Patch) and a.purpose == purpose]


@dataclass
class _Plan:
    """What the pass is collecting, before it is put into stages."""

    desired: list[dict[str, Any]] = field(default_factory=list)
    keep: set[str] = field(default_factory=set)  # uids whose objects and node labels stay
    add_finalizers: list[Action] = field(default_factory=list)
    statuses: list[Action] = field(default_factory=list)
    torn_down: list[Action] = field(default_factory=list)  # finalizers off after the deletes
    finished: list[Action] = field(default_factory=list)  # finalizers off, nothing left
    waiting: bool = False


def decide_domains(snap: DomainSnapshot, settings: DaemonSettings) -> DomainDecision:
    """The ComputeDomain loop's judgement, pure: each domain's objects (only those that
    differ from what the API holds), its status (only when it changed), its finalizer, and the
    teardown of deleted domains and of whatever a vanished domain left behind."""
    plan = _Plan()
    owned = _owned_objects(snap)
    conflicts = _template_conflicts(snap)
    for doc in snap.domains:
        meta = doc["metadata"]
        uid = str(meta.get("uid") or "")
        if meta.get("deletionTimestamp"):
            if FINALIZER in (meta.get("finalizers") or ()):
                _teardown(snap, doc, uid, owned, plan, settings)
            continue
        plan.keep.add(uid)
        try:
            domain = parse_computedomain(doc)
        except PolicyError as err:
            problem = "invalid spec, nothing created: " + "; ".join(err.problems)
            status = _status(doc, snap, [], {}, blocked=("InvalidSpec", problem))
            plan.statuses += _status_patch(doc, status)
            continue
        if FINALIZER not in (meta.get("finalizers") or ()):
            plan.add_finalizers.append(_finalizer(doc, add=True))
        conflict = conflicts.get(uid)
        plan.desired += _objects(domain, settings, with_workload_template=conflict is None)
        nodes, problems = daemon_nodes(snap, domain, doc, settings.namespace)
        status = _status(
            doc,
            snap,
            nodes,
            problems,
            blocked=("TemplateConflict", conflict) if conflict else None,
            num_nodes=domain.spec.num_nodes,
        )
        plan.statuses += _status_patch(doc, status)
    return _staged(snap, plan, owned)


def _objects(
    domain: ComputeDomain, settings: DaemonSettings, *, with_workload_template: bool = True
) -> list[dict[str, Any]]:
    """The domain's objects, stamped: those in the driver's namespace without an owner (the
    garbage collector cannot follow a reference across namespaces), the workload template
    owned by its domain."""
    unowned = stamp([daemon_template(domain, settings), daemonset(domain, settings)], None)
    if not with_workload_template:
        return unowned
    owner = Owner(cd.API_VERSION, cd.KIND, domain.name, domain.uid)
    return [*unowned, *stamp([workload_template(domain)], owner)]


def _owned_objects(snap: DomainSnapshot) -> list[Mapping[str, Any]]:
    """DaemonSets and templates this operator made for some domain (its label and ours)."""
    return [
        obj
        for obj in (*snap.daemonsets, *snap.templates)
        if COMPUTE_DOMAIN in _labels(obj) and _labels(obj).get(MANAGED_BY) == OPERATOR_NAME
    ]


def _template_conflicts(snap: DomainSnapshot) -> dict[str, str]:
    """uid -> why the domain cannot have the workload template it names: another object has
    that name in its namespace, or an older domain there names it too."""
    existing = {key_of({**t, "kind": "ResourceClaimTemplate"}): t for t in snap.templates}
    live = [d for d in snap.domains if not d["metadata"].get("deletionTimestamp")]
    live.sort(key=lambda d: (d["metadata"].get("creationTimestamp") or "", d["metadata"]["name"]))
    taken: dict[tuple[str, str], str] = {}
    conflicts: dict[str, str] = {}
    for doc in live:
        meta = doc["metadata"]
        uid, namespace = str(meta.get("uid") or ""), meta.get("namespace") or "default"
        name = ((doc.get("spec") or {}).get("channel") or {}).get("resourceClaimTemplate") or {}
        template = str(name.get("name") or "")
        first = taken.setdefault((namespace, template), meta["name"])
        there = existing.get(("ResourceClaimTemplate", namespace, template))
        if first != meta["name"]:
            conflicts[uid] = (
                f"ComputeDomain {first} already names ResourceClaimTemplate {template} in this "
                "namespace: create this domain again with another template name"
            )
        elif there is not None and _labels(there).get(COMPUTE_DOMAIN) != uid:
            conflicts[uid] = (
                f"ResourceClaimTemplate {namespace}/{template} exists and is not this domain's: "
                "delete it, or create this domain again with another template name"
            )
    return conflicts


def _teardown(
    snap: DomainSnapshot,
    doc: Mapping[str, Any],
    uid: str,
    owned: Sequence[Mapping[str, Any]],
    plan: _Plan,
    settings: DaemonSettings,
) -> None:
    """A deleted domain under the finalizer: everything stays while its channel claims are
    held; then it goes (the staging deletes what is no longer desired) and the finalizer
    after it."""
    holders = claim_holders(snap, uid)
    if holders:
        plan.waiting = True
        plan.keep.add(uid)
        try:
            domain = parse_computedomain(doc)
        except PolicyError:
            domain = None  # nothing was created from an invalid spec
        if domain is not None:
            # Its workload template only while it is there and its own: at this point a new one
            # serves nobody, and one of that name made since is someone else's.
            own = any(
                _labels(t).get(COMPUTE_DOMAIN) == uid
                and key_of({**t, "kind": "ResourceClaimTemplate"})[1:]
                == (domain.namespace, domain.template_name)
                for t in owned
            )
            plan.desired += _objects(domain, settings, with_workload_template=own)
            nodes, problems = daemon_nodes(snap, domain, doc, settings.namespace)
            num_nodes = domain.spec.num_nodes
        else:
            nodes, problems, num_nodes = [], {}, 0
        more = len(holders) - 10
        shown = ", ".join(holders[:10]) + (f" and {more} more" if more > 0 else "")
        terminating = (
            TERMINATING_CONDITION,
            "True",
            "WaitingForClaims",
            f"waiting for pods {shown} to release their IMEX channel claims; the daemons "
            "stay until then",
        )
        status = _status(doc, snap, nodes, problems, num_nodes=num_nodes, extra=[terminating])
        plan.statuses += _status_patch(doc, status)
        return
    left = any(_labels(o).get(COMPUTE_DOMAIN) == uid for o in owned) or any(
        n.labels.get(COMPUTE_DOMAIN) == uid for n in snap.nodes
    )
    plan.waiting = plan.waiting or left
    (plan.torn_down if left else plan.finished).append(_finalizer(doc, add=False))


def _staged(
    snap: DomainSnapshot, plan: _Plan, owned: Sequence[Mapping[str, Any]]
) -> DomainDecision:
    changes = plan_changes(plan.desired, (Observed.from_k8s(o, _kind(o)) for o in owned))
    applies = changes.apply
    labels = [
        Patch(
            "Node",
            node.name,
            map_ops("/metadata/labels", {COMPUTE_DOMAIN: None}, node.labels, guard=True),
            "labels",
            patch_type="json",
        )
        for node in sorted(snap.nodes, key=lambda n: n.name)
        if COMPUTE_DOMAIN in node.labels and node.labels[COMPUTE_DOMAIN] not in plan.keep
    ]
    stages = [
        Stage(tuple(plan.add_finalizers)),
        Stage(tuple(Apply(o) for o in applies if o["kind"] != "DaemonSet")),
        Stage(tuple(Apply(o) for o in applies if o["kind"] == "DaemonSet")),
        Stage(tuple(Prune(k) for k in changes.prune if k[0] == "DaemonSet")),
        Stage(tuple(Prune(k) for k in changes.prune if k[0] != "DaemonSet")),
        Stage(tuple(labels)),
        Stage(tuple(plan.statuses)),
        Stage(tuple(plan.finished)),
        Stage(tuple(plan.torn_down), after_success=True),
    ]
    return DomainDecision(
        stages=tuple(s for s in stages if s.actions),
        requeue_at=snap.now + WAIT_S if plan.waiting else None,
    )


def _kind(obj: Mapping[str, Any]) -> str:
    """An object's kind, where a list from the API leaves it out."""
    if obj.get("kind"):
        return str(obj["kind"])
    return "DaemonSet" if "template" in (obj.get("spec") or {}) else "ResourceClaimTemplate"


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _finalizer(doc: Mapping[str, Any], *, add: bool) -> Patch:
    meta = doc["metadata"]
    return Patch(
        cd.KIND,
        meta["name"],
        finalizer_body(doc, FINALIZER, add=add),
        "finalizer",
        namespace=meta.get("namespace"),
    )


# -- holders of a domain's channels


def claim_holders(snap: DomainSnapshot, uid: str) -> list[str]:
    """``namespace/name`` of each pod, not yet finished, that a channel claim of the domain
    ``uid`` is reserved for: while one is, the domain's IMEX channel is in use."""
    by_uid = {(p["metadata"].get("uid") or ""): p for p in snap.pods}
    by_name = {(p["metadata"].get("namespace") or "", p["metadata"]["name"]): p for p in snap.pods}
    held: set[str] = set()
    for claim in snap.claims:
        if claim_domain_id(claim) != uid:
            continue
        namespace = claim["metadata"].get("namespace") or ""
        for ref in (claim.get("status") or {}).get("reservedFor") or ():
            if ref.get("resource") != "pods":
                continue
            pod = by_uid.get(ref.get("uid") or "") or by_name.get((namespace, ref.get("name")))
            if pod is None or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                continue  # gone or finished: the kubelet has let the claim go
            held.add(f"{namespace}/{pod['metadata']['name']}")
    return sorted(held)


# -- status from the daemons


def daemon_problem(pod: Mapping[str, Any]) -> str:
    """Why a daemon pod is not ready, in the words its status gives: not scheduled, its
    container waiting (with how it last exited) or exited, or running with its check failing."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "terminating"
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return "not scheduled: " + _said(cond)
    containers = sorted(
        status.get("containerStatuses") or (), key=lambda c: c.get("name") != DAEMON_CONTAINER
    )
    for container in containers:
        state = container.get("state") or {}
        if "waiting" in state:
            text = _said(state["waiting"] or {})
            last = (container.get("lastState") or {}).get("terminated")
            return f"{text}; last exit: {_exit(last)}" if last else text
        if "terminated" in state:
            return "exited: " + _exit(state["terminated"] or {})
        if "running" in state and not container.get("ready"):
            return "running, not ready: its check fails (the IMEX daemon is not up yet)"
    if status.get("phase") in (None, "Pending"):
        return "pending: its container is not created yet (is its daemon claim prepared?)"
    return f"not ready (pod phase {status.get('phase')})"


def _said(state: Mapping[str, Any]) -> str:
    reason, message = state.get("reason") or "", (state.get("message") or "").strip()
    return f"{reason}: {message}" if reason and message else reason or message or "no reason given"


def _exit(terminated: Mapping[str, Any]) -> str:
    text = f"{terminated.get('reason') or 'exited'} (exit code {terminated.get('exitCode')})"
    message = (terminated.get("message") or "").strip()
    return f"{text}: {message}" if message else text


def _best(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Of a node's daemon pods (a new one beside one terminating), the one that counts."""
    return max(
        pods,
        key=lambda p: (
            not (p.get("metadata") or {}).get("deletionTimestamp"),
            _pod_ready(p),
            (p.get("metadata") or {}).get("creationTimestamp") or "",
        ),
    )


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def daemon_nodes(
    snap: DomainSnapshot, domain: ComputeDomain, doc: Mapping[str, Any], namespace: str
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The domain's ``status.nodes`` from its daemon pods (in the driver's ``namespace``), and
    what is wrong where (node, or pod when it has none, -> reason).

    An entry per node with a daemon pod, as NVIDIA's: its pod IP (empty until it has one),
    clique (the daemon's own label, else the node's ``nvidia.com/gpu.clique``; NotReady until
    the node is seen, as its clique is not known before) and index, which
    a node keeps while it stays in its clique; a new one takes the lowest free index there,
    and a node in no clique has -1. A node labelled for the domain with no daemon pod is a
    problem but no entry (it has no daemon to describe).
    """
    uid = domain.uid
    pods = [
        p
        for p in snap.daemon_pods
        if _labels(p).get(COMPUTE_DOMAIN) == uid and p["metadata"].get("namespace") == namespace
    ]
    problems: dict[str, str] = {}
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            by_node.setdefault(node, []).append(pod)
        else:
            problems[f"pod {pod['metadata']['name']}"] = daemon_problem(pod)
    node_labels = {n.name: n.labels for n in snap.nodes}
    previous = {
        n.get("name"): n for n in ((doc.get("status") or {}).get("nodes") or ()) if n.get("name")
    }
    entries: list[dict[str, Any]] = []
    for name in sorted(by_node):
        pod = _best(by_node[name])
        clique = _labels(pod).get(COMPUTE_DOMAIN_CLIQUE)
        # The node's labels come by another watch than its pod: until they are seen, its
        # clique is not known, and the daemon is not counted ready in a clique it may not be in.
        unseen = clique is None and name not in node_labels
        if clique is None:
            clique = (node_labels.get(name) or {}).get(GPU_CLIQUE, "")
        ready = _pod_ready(pod) and not unseen
        if not _pod_ready(pod):
            problems[name] = daemon_problem(pod)
        elif unseen:
            problems[name] = (
                "its node is not seen labelled for the domain yet (its clique is read there)"
            )
        entries.append(
            {
                "name": name,
                "ipAddress": (pod.get("status") or {}).get("podIP") or "",
                "cliqueID": clique,
                "status": cd.READY if ready else cd.NOT_READY,
            }
        )
    _assign_indexes(entries, previous)
    for name, labels in sorted(node_labels.items()):
        if labels.get(COMPUTE_DOMAIN) == uid and name not in by_node:
            problems[name] = "no IMEX daemon pod on this node yet"
    return entries, problems


def _assign_indexes(
    entries: list[dict[str, Any]], previous: Mapping[str, Mapping[str, Any]]
) -> None:
    used: dict[str, set[int]] = {}
    fresh = []
    for entry in entries:
        old = previous.get(entry["name"]) or {}
        index = old.get("index")
        if (
            entry["cliqueID"]
            and old.get("cliqueID") == entry["cliqueID"]
            and isinstance(index, int)
            and index >= 0
            and index not in used.get(entry["cliqueID"], set())
        ):
            entry["index"] = index
            used.setdefault(entry["cliqueID"], set()).add(index)
        else:
            fresh.append(entry)
    for entry in fresh:
        if not entry["cliqueID"]:
            entry["index"] = -1
            continue
        taken = used.setdefault(entry["cliqueID"], set())
        entry["index"] = next(i for i in range(len(taken) + 1) if i not in taken)
        taken.add(entry["index"])


def _status(
    doc: Mapping[str, Any],
    snap: DomainSnapshot,
    nodes: list[dict[str, Any]],
    problems: Mapping[str, str],
    *,
    blocked: tuple[str, str] | None = None,
    num_nodes: int = 0,
    extra: Sequence[tuple[str, str, str, str]] = (),
) -> dict[str, Any]:
    """The domain's status: NVIDIA's ``status`` and ``nodes``, and the Ready condition saying
    why it is not (``blocked``: a reason and message that come before the daemons', such as
    InvalidSpec); ``extra``: more conditions (type, status, reason, message)."""
    ready_count = sum(1 for n in nodes if n["status"] == cd.READY)
    if blocked:
        ready, (reason, message) = False, blocked
    elif problems:
        ready, reason = False, "DaemonNotReady"
        message = "IMEX daemon not ready on " + "; ".join(
            f"{where}: {_cut(why)}" for where, why in sorted(problems.items())
        )
    elif ready_count < num_nodes:
        ready, reason = False, "WaitingForNodes"
        message = f"{ready_count} of numNodes {num_nodes} IMEX daemons ready"
    else:
        ready, reason = True, "DaemonsReady"
        message = (
            f"{ready_count} IMEX daemon{'s' if ready_count != 1 else ''} ready"
            if ready_count
            else "no node has joined yet: a node joins when a workload pod there claims a channel"
        )
    previous = (doc.get("status") or {}).get("conditions") or []
    generation = int(doc["metadata"].get("generation") or 0)
    wanted = [(READY_CONDITION, "True" if ready else "False", reason, message), *extra]
    status: dict[str, Any] = {"status": cd.READY if ready else cd.NOT_READY}
    if nodes:
        status["nodes"] = nodes
    status["conditions"] = [
        condition(previous, t, s, r, m, snap.stamp, generation) for t, s, r, m in wanted
    ]
    return status


def _cut(text: str) -> str:
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def _status_patch(doc: Mapping[str, Any], status: Mapping[str, Any]) -> list[Action]:
    """The merge patch to exactly ``status``, or none when it is what the domain has."""
    current = doc.get("status") or {}
    if current == status:
        return []
    meta = doc["metadata"]
    return [
        Patch(
            cd.KIND,
            meta["name"],
            {"status": merge_patch_to(current, status)},
            "status",
            subresource="status",
            namespace=meta.get("namespace"),
        )
    ]
