"""The fleet driver-upgrade planner: one observation in, the next steps out.

``plan(fleet, policy, now)`` is pure and level-based: it reads the whole fleet each pass, keeps no
memory (what it must remember is on the Nodes) and returns only the next steps; the executor
applies them and the next observation shows their effect. The same fleet at the same ``now``
gives the same plan.

Budget rules (reference/gpu-facts.md section 6, with NVIDIA's two known flaws avoided):
- A node is *unavailable* when it is cordoned (by anyone), NotReady, or in progress (a node in
  ``cordon-required`` is counted before it is cordoned, so every node counts once).
- New upgrades per pass: ``maxParallelUpgrades - in progress`` (no limit when 0), and each start
  that makes an available node unavailable needs room under ``maxUnavailable`` (scaled from the
  managed nodes, percent rounded up). A node that is already cordoned costs no room, so it is
  upgraded even when pre-existing unavailability exceeds the budget; nothing else starts then.
- A failed node gives back its parallel slot but stays cordoned, so it keeps counting as
  unavailable: with maxUnavailable 1 a failure stops further starts (the budget allows no
  more), with a larger budget the others go on. Nothing can block the fleet forever: every
  waiting state has a timeout except wait-for-jobs, pod deletion and drain with timeout 0,
  which the user asked to wait forever.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.labels import VALIDATOR_APP
from gpu_operator.nodeops.drain import drain_pods, gpu_pods, names, remove
from gpu_operator.nodeops.operations import Cordon, DeletePod, Event, Evict, Uncordon
from gpu_operator.nodeops.pods import Pod
from gpu_operator.upgrade.model import (
    EMPTYING,
    EMPTYING_RECHECK_S,
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

_KNOWN_STATES = {s.value: s for s in State}
# States whose timeout is measured from the recorded entry time.
_TIMED = frozenset(
    {State.WAIT_FOR_JOBS, State.POD_DELETION, State.DRAIN, State.POD_RESTART, State.VALIDATION}
)


@dataclass(slots=True)
class _NodeView:
    """A managed node with the pods that decide its next step."""

    name: str
    node: Node
    state: State
    drivers: list[Pod]
    workloads: list[Pod]
    validators: list[Pod]
    needs_upgrade: bool
    reserved: bool  # counts against maxUnavailable: cordoned, NotReady, or taken by an upgrade


@dataclass(frozen=True)
class _Ctx:
    policy: Policy
    now: float
    newest: dict[str, str]
    validators_deployed: bool
    unobserved: frozenset[str] = frozenset()  # Fleet.unobserved
    deadlines: list[float] = field(default_factory=list)  # when a waiting node times out

    @property
    def stamp(self) -> int:
        return int(self.now)

    def is_current(self, pod: Pod) -> bool:
        """The pod runs the newest driver template (unknown DaemonSets are taken as current:
        without their revisions there is nothing to upgrade to)."""
        newest = self.newest.get(pod.owner)
        return newest is None or pod.revision_hash == newest

    def delete(self, view: _NodeView, pods: Iterable[Pod]) -> list[Action]:
        """Deletions of ``pods``, but none while their DaemonSet's controller has not seen
        every pod of it this observation has (its status will say, and wake a pass)."""
        return [
            DeletePod(p.name, p.namespace, False, view.name)
            for p in pods
            if p.owner not in self.unobserved
        ]


def plan(
    fleet: Fleet, policy: Policy, now: float, allowed: frozenset[str] | None = None
) -> UpgradePlan:
    """The next steps of the fleet's driver upgrade (see the module docstring for the rules).

    ``allowed`` (a canary rollout's gate, :mod:`.canary`): only these nodes are marked for,
    start or restart an upgrade; the others are not written at all (None: every node)."""
    views, notes = _views(fleet)
    ctx = _Ctx(policy, now, dict(fleet.newest_hash), bool(fleet.validator_pods), fleet.unobserved)
    max_unavailable = scaled_max_unavailable(policy.max_unavailable, len(views))
    reserved = sum(1 for v in views if v.reserved)
    in_progress = sum(1 for v in views if v.state in IN_PROGRESS)
    parallel_free = (
        None if policy.max_parallel_upgrades == 0 else policy.max_parallel_upgrades - in_progress
    )
    room = max(0, max_unavailable - reserved)
    slots = room if parallel_free is None else max(0, min(parallel_free, room))
    summary = _summary(views, reserved, slots, max_unavailable)

    if not policy.auto_upgrade:
        notes.append(
            f"automatic driver upgrades are off (upgradePolicy.autoUpgrade); "
            f"{summary.pending} of {summary.total} nodes need a new driver"
        )
        if summary.in_progress or summary.failed:
            notes.append(
                f"{summary.in_progress + summary.failed} nodes stopped mid-upgrade are left as "
                "they are until automatic upgrades are on again"
            )
        line = (
            f"driver upgrade: automatic upgrades off; {summary.pending} of {summary.total} "
            "nodes need a new driver"
        )
        return UpgradePlan((), summary, tuple(notes), line)

    actions: list[Action] = []
    recoverable: list[_NodeView] = []
    waiting: list[_NodeView] = []
    for view in views:
        if view.state in IN_PROGRESS:
            actions.extend(_advance(view, ctx))
        elif allowed is not None and view.name not in allowed:
            continue  # held back by the canary: not written at all
        elif view.state is State.FAILED:
            if view.node.requested:
                actions.append(
                    SetState(view.name, State.REQUIRED, ctx.stamp, "upgrade requested again")
                )
            elif view.node.failed_template not in ("", _target(view, ctx)):
                # The template changed since it failed (a rollback, a newer version): a new try.
                reason = "another driver template than the one that failed"
                actions.append(SetState(view.name, State.REQUIRED, ctx.stamp, reason))
            else:
                # A failed node recovers once its new driver is Ready and validation agrees (a
                # node that failed validation must not go back in service on its driver alone);
                # stale validators are restarted so that they can agree.
                recovered, restart = _validity(view, ctx)
                if recovered:
                    recoverable.append(view)
                actions.extend(ctx.delete(view, restart))
        elif view.state is State.REQUIRED:
            waiting.append(view)
        elif view.needs_upgrade:  # "" or upgrade-done
            reason = "upgrade requested" if view.node.requested else "driver pod out of date"
            actions.append(SetState(view.name, State.REQUIRED, ctx.stamp, reason))

    # Starts, under the budget. Recovered failed nodes go first: they hold a node out of service
    # and finishing them gives it back.
    not_ready = [v.name for v in waiting if not v.node.ready]
    blocked_parallel = blocked_room = 0
    for view in [*recoverable, *(v for v in waiting if v.node.ready)]:
        if parallel_free is not None and parallel_free <= 0:
            blocked_parallel += 1
            continue
        cost = 0 if view.reserved else 1
        if cost > room:
            blocked_room += 1
            continue
        room -= cost
        if parallel_free is not None:
            parallel_free -= 1
        if view.state is State.FAILED:
            actions.append(
                SetState(view.name, State.UNCORDON, ctx.stamp, "new driver Ready: recovered")
            )
            actions.append(
                Event(view.name, "Normal", "DriverUpgradeRecovered", "new driver pod is Ready")
            )
        else:
            actions.append(SetState(view.name, State.CORDON, ctx.stamp, "upgrade started"))
            actions.append(
                Event(view.name, "Normal", "DriverUpgradeStarted", "driver upgrade started")
            )

    if not_ready:
        notes.append(f"{len(not_ready)} nodes wait to be Ready to start: {names(not_ready)}")
    if blocked_parallel:
        notes.append(
            f"{blocked_parallel} nodes wait for a slot under maxParallelUpgrades "
            f"{policy.max_parallel_upgrades} ({in_progress} in progress)"
        )
    if blocked_room:
        notes.append(
            f"{blocked_room} nodes wait for room under maxUnavailable {max_unavailable} "
            f"({reserved} unavailable)"
        )
    failed = [v.name for v in views if v.state is State.FAILED]
    if failed:
        notes.append(f"{len(failed)} nodes failed (see their Events): {names(failed)}")
    if any(v.state in EMPTYING for v in views) or any(
        isinstance(a, (Evict, DeletePod)) for a in actions
    ):
        ctx.deadlines.append(now + EMPTYING_RECHECK_S)
    deadline = min(ctx.deadlines, default=None)
    return UpgradePlan(tuple(actions), summary, tuple(notes), summary_line(summary), deadline)


def summary_line(summary: Summary) -> str:
    s = summary
    return (
        f"driver upgrade: {s.done}/{s.total} done, {s.in_progress} in progress, "
        f"{s.pending} pending, {s.failed} failed; "
        f"{s.unavailable}/{s.max_unavailable} unavailable"
    )


def _views(fleet: Fleet) -> tuple[list[_NodeView], list[str]]:
    """Managed nodes in name order: those with a driver pod or a state label, less skipped ones."""
    by_node: dict[str, list[Pod]] = defaultdict(list)
    for pod in fleet.driver_pods:
        by_node[pod.node].append(pod)
    workloads: dict[str, list[Pod]] = defaultdict(list)
    for pod in fleet.workload_pods:
        workloads[pod.node].append(pod)
    validators: dict[str, list[Pod]] = defaultdict(list)
    for pod in fleet.validator_pods:
        if pod.labels.get("app") == VALIDATOR_APP:
            validators[pod.node].append(pod)

    newest = fleet.newest_hash
    notes: list[str] = []
    unknown: list[str] = []
    skipped_mid_upgrade: list[str] = []
    views: list[_NodeView] = []
    for node in sorted(fleet.nodes, key=lambda n: n.name):
        label = node.state_label
        if node.name not in by_node and not label:
            continue
        state = _KNOWN_STATES.get(label)
        if node.skipped:
            if state in IN_PROGRESS or state is State.FAILED:
                skipped_mid_upgrade.append(node.name)
            continue
        if state is None:
            unknown.append(node.name)
            state = State.UNKNOWN
        drivers = by_node.get(node.name, [])
        needs = node.requested
        for p in drivers:
            want = newest.get(p.owner)
            if want is not None and p.revision_hash != want and not p.deleting:
                needs = True
        reserved = node.unschedulable or not node.ready or state in IN_PROGRESS
        views.append(
            _NodeView(
                node.name,
                node,
                state,
                drivers,
                workloads.get(node.name, []),
                validators.get(node.name, []),
                needs,
                reserved,
            )
        )
    if unknown:
        notes.append(f"unknown upgrade state labels, treated as unset: {names(unknown)}")
    if skipped_mid_upgrade:
        notes.append(
            f"nodes labelled skip in the middle of an upgrade are left as they are: "
            f"{names(skipped_mid_upgrade)}"
        )
    return views, notes


def _summary(views: Sequence[_NodeView], reserved: int, slots: int, max_u: int) -> Summary:
    idle = [v for v in views if v.state in (State.UNKNOWN, State.DONE)]
    return Summary(
        total=len(views),
        done=sum(1 for v in idle if not v.needs_upgrade),
        in_progress=sum(1 for v in views if v.state in IN_PROGRESS),
        failed=sum(1 for v in views if v.state is State.FAILED),
        pending=sum(1 for v in views if v.state is State.REQUIRED)
        + sum(1 for v in idle if v.needs_upgrade),
        unavailable=reserved,
        budget_slots=slots,
        max_unavailable=max_u,
    )


def _elapsed(view: _NodeView, ctx: _Ctx) -> float:
    since = view.node.since
    return 0.0 if since is None else max(0.0, ctx.now - since)


def _timed_out(timeout_s: int, view: _NodeView, ctx: _Ctx) -> bool:
    """Whether the node has waited ``timeout_s`` (0: for ever) in its state; while it has not,
    the deadline is noted so the caller knows when to pass again without a change."""
    if timeout_s <= 0:
        return False
    elapsed = _elapsed(view, ctx)
    if elapsed >= timeout_s:
        return True
    ctx.deadlines.append(ctx.now + timeout_s - elapsed)
    return False


def _advance(view: _NodeView, ctx: _Ctx) -> list[Action]:
    """The next steps of one node in progress."""
    handler = {
        State.CORDON: _cordon,
        State.WAIT_FOR_JOBS: _wait_for_jobs,
        State.POD_DELETION: _pod_deletion,
        State.DRAIN: _drain,
        State.POD_RESTART: _pod_restart,
        State.VALIDATION: _validation,
        State.UNCORDON: _uncordon,
    }[view.state]
    actions = handler(view, ctx)
    moved = any(isinstance(a, (SetState, Fail)) for a in actions)
    if view.state in _TIMED and view.node.since is None and not moved:
        # Entered by someone who did not record the time (NVIDIA's operator, a person): start
        # the clock now so the timeout can ever fire.
        actions.append(SetState(view.name, view.state, ctx.stamp, "entry time recorded"))
    return actions


def _next(state: State, policy: Policy) -> State:
    """The following state, skipping stages the policy turns off."""
    if state is State.CORDON:
        return State.WAIT_FOR_JOBS if policy.wait_selector else State.POD_DELETION
    if state is State.WAIT_FOR_JOBS:
        return State.POD_DELETION
    if state is State.POD_DELETION:
        return State.DRAIN if policy.drain_enable else State.POD_RESTART
    order = [State.DRAIN, State.POD_RESTART, State.VALIDATION, State.UNCORDON, State.DONE]
    return order[order.index(state) + 1]


def _cordon(view: _NodeView, ctx: _Ctx) -> list[Action]:
    actions: list[Action] = []
    node = view.node
    recorded = node.was_cordoned
    if recorded is None or not node.unschedulable:
        # A recorded value wins: after our own cordon it would otherwise read "true".
        was = node.unschedulable if recorded is None else recorded
        actions.append(Cordon(node.name, was))
    actions.append(SetState(node.name, _next(State.CORDON, ctx.policy), ctx.stamp, "cordoned"))
    return actions


def _wait_for_jobs(view: _NodeView, ctx: _Ctx) -> list[Action]:
    selector = ctx.policy.wait_selector
    nxt = _next(State.WAIT_FOR_JOBS, ctx.policy)
    if selector is None:
        return [SetState(view.name, nxt, ctx.stamp, "no jobs to wait for")]
    running = [p for p in view.workloads if p.running and selector.matches(p.labels)]
    if not running:
        return [SetState(view.name, nxt, ctx.stamp, "jobs finished")]
    if _timed_out(ctx.policy.wait_timeout_s, view, ctx):
        message = (
            f"{len(running)} jobs still running after {ctx.policy.wait_timeout_s}s: "
            f"{names(p.name for p in running)}; deleting pods"
        )
        return [
            SetState(view.name, nxt, ctx.stamp, "wait for jobs timed out"),
            Event(view.name, "Warning", "WaitForJobsTimedOut", message),
        ]
    return []


def _pod_deletion(view: _NodeView, ctx: _Ctx) -> list[Action]:
    p = ctx.policy
    return _remove(
        view,
        ctx,
        gpu_pods(view.workloads),
        stage="GPU pod deletion",
        force=p.pod_deletion_force,
        timeout_s=p.pod_deletion_timeout_s,
        empty_dir=p.pod_deletion_delete_empty_dir,
        nxt=_next(State.POD_DELETION, p),
    )


def _drain(view: _NodeView, ctx: _Ctx) -> list[Action]:
    p = ctx.policy
    nxt = _next(State.DRAIN, p)
    if not p.drain_enable:
        return [SetState(view.name, nxt, ctx.stamp, "drain disabled")]
    return _remove(
        view,
        ctx,
        drain_pods(view.workloads, p.drain_selector),
        stage="drain",
        force=p.drain_force,
        timeout_s=p.drain_timeout_s,
        empty_dir=p.drain_delete_empty_dir,
        nxt=nxt,
    )


def _remove(
    view: _NodeView,
    ctx: _Ctx,
    pods: list[Pod],
    *,
    stage: str,
    force: bool,
    timeout_s: int,
    empty_dir: bool,
    nxt: State,
) -> list[Action]:
    """:func:`drain.remove` as upgrade steps: done moves on, a failure fails the node."""
    removal = remove(
        pods,
        node=view.name,
        stage=stage,
        force=force,
        timeout_s=timeout_s,
        empty_dir=empty_dir,
        timed_out=bool(pods) and _timed_out(timeout_s, view, ctx),
    )
    if removal.done:
        return [SetState(view.name, nxt, ctx.stamp, f"{stage} complete")]
    if removal.failure is not None:
        return [_fail(view, ctx, removal.failure)]
    return list(removal.requests)


def _pod_restart(view: _NodeView, ctx: _Ctx) -> list[Action]:
    """Delete the old driver pod once, then wait for a new one to be Ready.

    A driver pod is *fresh* when it runs the newest template and was created after the node
    entered this state, so an upgrade that was only requested (same template) restarts the
    driver too; a pod already terminating is never asked again.
    """
    since = view.node.since

    def fresh(pod: Pod) -> bool:
        return ctx.is_current(pod) and not pod.deleting and (since is None or pod.created >= since)

    stale = [p for p in view.drivers if not p.deleting and not fresh(p)]
    new = [p for p in view.drivers if fresh(p)]
    limit = ctx.policy.max_driver_restarts
    crashing = [p for p in new if p.restart_count > limit]
    if crashing:
        pod = crashing[0]
        return [
            _fail(
                view,
                ctx,
                f"new driver pod {pod.name} restarted {pod.restart_count} times (limit {limit})",
            )
        ]
    if not stale and any(p.ready for p in new):
        return [SetState(view.name, State.VALIDATION, ctx.stamp, "new driver pod Ready")]
    if _timed_out(ctx.policy.restart_timeout_s, view, ctx):
        detail = "never appeared" if not new else f"{new[0].name} is {new[0].phase}, not Ready"
        return [
            _fail(
                view,
                ctx,
                f"new driver pod not Ready after {ctx.policy.restart_timeout_s}s: {detail}",
            )
        ]
    return ctx.delete(view, stale)


def _target(view: _NodeView, ctx: _Ctx) -> str:
    """The driver template the node is to run: its DaemonSet's newest revision."""
    owners = sorted({p.owner for p in view.drivers if p.owner in ctx.newest})
    return ctx.newest[owners[0]] if owners else ""


def _fail(view: _NodeView, ctx: _Ctx, reason: str) -> Fail:
    return Fail(view.name, reason, ctx.stamp, _target(view, ctx))


def _new_driver(view: _NodeView, ctx: _Ctx) -> Pod | None:
    """The newest Ready driver pod of the current template on the node."""
    ready = [p for p in view.drivers if ctx.is_current(p) and p.ready and not p.deleting]
    return max(ready, key=lambda p: p.created, default=None)


def _validity(view: _NodeView, ctx: _Ctx) -> tuple[bool, list[Pod]]:
    """(validated, stale validator pods to restart) against the node's new driver pod.

    A validator only proves the new driver if it turned Ready after that driver pod was
    created: one that stayed Ready through the restart validated the old driver. Such a stale
    pod is deleted so its DaemonSet recreates it and it validates again. No validator anywhere
    means validation is not deployed, and there is nothing to wait for. Without a Ready new
    driver pod there is nothing to validate yet.
    """
    driver = _new_driver(view, ctx)
    if driver is None:
        return False, []
    live = [p for p in view.validators if not p.deleting]
    if not live:
        return not ctx.validators_deployed, []
    if any(p.ready and (p.ready_since or p.created) >= driver.created for p in live):
        return True, []
    return False, [p for p in live if p.ready]


def _validation(view: _NodeView, ctx: _Ctx) -> list[Action]:
    validated, stale = _validity(view, ctx)
    if validated:
        return [SetState(view.name, State.UNCORDON, ctx.stamp, "validated")]
    live = [p for p in view.drivers if not p.deleting]
    if live and not any(ctx.is_current(p) for p in live):
        # The template moved under the upgrade (a canary rolled back, a newer version): the
        # driver pod is replaced again, with that one.
        reason = "driver template changed during validation"
        return [SetState(view.name, State.POD_RESTART, ctx.stamp, reason)]
    timeout = ctx.policy.validation_timeout_s
    if _timed_out(timeout, view, ctx):
        what = (
            "validator pod not Ready"
            if _new_driver(view, ctx)
            else "no Ready driver pod of the new version"
        )
        return [_fail(view, ctx, f"{what} after {timeout}s")]
    return ctx.delete(view, stale)


def _uncordon(view: _NodeView, ctx: _Ctx) -> list[Action]:
    node = view.node
    actions: list[Action] = []
    was = node.was_cordoned
    if was is False and node.unschedulable:
        actions.append(Uncordon(node.name, quarantined=node.quarantined))
    elif was is None and node.unschedulable:
        actions.append(
            Event(
                node.name,
                "Warning",
                "LeftCordoned",
                "left cordoned: no record of whether it was cordoned before the upgrade",
            )
        )
    actions.append(SetState(node.name, State.DONE, ctx.stamp, "upgraded"))
    actions.append(Event(node.name, "Normal", "DriverUpgraded", "driver upgrade done"))
    return actions


@dataclass(frozen=True)
class NodeProgress:
    """One managed node as a rollout sees it."""

    name: str
    state: State
    current: bool  # runs the newest driver template and needs nothing
    ready: bool
    labels: Mapping[str, str]
    since: float | None  # when it entered its state
    driver_waiting: str = ""  # why its newest driver pod's container waits, if it does


def progress(fleet: Fleet) -> list[NodeProgress]:
    """Every managed node's upgrade state and whether it is on the newest template."""
    views, _ = _views(fleet)
    out = []
    for view in views:
        newest = [p for p in view.drivers if not p.deleting]
        waiting = next((p.waiting for p in newest if p.waiting), "")
        out.append(
            NodeProgress(
                view.name,
                view.state,
                not view.needs_upgrade and view.state in (State.UNKNOWN, State.DONE),
                view.node.ready,
                view.node.labels,
                view.node.since,
                waiting,
            )
        )
    return out
