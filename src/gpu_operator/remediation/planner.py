"""The health-remediation planner: one observation in, the next node writes out (pure).

Per node, in this order each pass:
- a node the remediation holds whose ``GPUHealthy`` has been True for ``recoveryDelay`` is
  released: the taint it added comes off, the cordon too if the node was not cordoned before,
  and its bookkeeping goes. This happens even with remediation disabled: only a healthy node
  is ever let go, and only what the quarantine did is undone.
- while the condition is True but not yet for ``recoveryDelay``, nothing else happens to the
  node: a GPU that came back needs no more eviction or remediation.
- ``draining``: its GPU pods (and, with ``drain.enable``, the pods the drain picks) are
  evicted through the shared drain (:mod:`gpu_operator.nodeops.drain`); then the first
  remediation action starts, or the node waits ``quarantined``.
- ``remediating``: each action (restart the driver pod, ask the agent to reset idle GPUs, hand
  over to an external controller by a label) gets ``timeout`` to bring the condition back;
  then the next; after the last the node waits ``quarantined`` and a Warning Event says so.
- a node whose ``GPUHealthy`` is False and that is not held yet is quarantined, oldest fault
  first, while fewer than ``maxUnavailable`` GPU nodes are held (counted from a view that
  shows every earlier write: while one is not seen yet, no node is quarantined). The rest are
  reported (status, metric) and wait: a storm of false positives cannot empty the fleet. A
  node in the middle of a driver upgrade waits for it to end (its GPUs vanish and return with
  the driver, and the upgrade validates the new one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpu_operator.labels import HEALTH_RESET_REQUESTED
from gpu_operator.nodeops.drain import drain_pods, gpu_pods, names, remove
from gpu_operator.nodeops.operations import DeletePod, Event, EventType
from gpu_operator.nodeops.pods import Pod
from gpu_operator.remediation.model import (
    Action,
    HealthNode,
    HealthPlan,
    HealthPolicy,
    HealthSummary,
    Phase,
    Quarantine,
    Release,
    SetPhase,
    Tally,
)
from gpu_operator.upgrade.model import scaled_max_unavailable

EMPTYING_RECHECK_S = 3.0  # workload pods are not watched: look again this soon while draining


@dataclass
class _Steps:
    """The plan being built: actions in order, the counts they make, when to look again."""

    policy: HealthPolicy
    now: float
    actions: list[Action] = field(default_factory=list)
    tallies: dict[int, Tally] = field(default_factory=dict)
    deadlines: list[float] = field(default_factory=list)

    @property
    def stamp(self) -> int:
        return int(self.now)

    def add(self, action: Action, tally: Tally | None = None) -> None:
        if tally is not None:
            self.tallies[len(self.actions)] = tally
        self.actions.append(action)

    def event(self, node: str, etype: EventType, reason: str, message: str) -> None:
        self.add(Event(node, etype, reason, message))


def plan_health(
    nodes: Sequence[HealthNode], policy: HealthPolicy, now: float, *, gpu_nodes: int
) -> HealthPlan:
    """The next steps for every node (see the module docstring for the rules)."""
    steps = _Steps(policy, now)
    limit = scaled_max_unavailable(policy.max_unavailable, gpu_nodes)
    holding = sorted((n for n in nodes if n.phase is not None), key=lambda n: n.name)
    for node in holding:
        if not node.pending:
            _advance(node, steps)

    held: list[str] = []
    if policy.enabled and not any(n.pending for n in nodes):
        room = max(0, limit - len(holding))
        candidates = sorted(
            (
                n
                for n in nodes
                if n.phase is None and n.health and n.health.unhealthy and not n.mid_upgrade
            ),
            key=lambda n: (n.health.since if n.health else 0.0, n.name),
        )
        for node in candidates:
            if room <= 0:
                held.append(node.name)
                continue
            room -= 1
            reason = _reason(node)
            steps.add(
                Quarantine(node.view, policy.taint_effect, reason, steps.stamp),
                Tally("quarantine", "started"),
            )
            steps.event(node.name, "Warning", "GPUQuarantined", f"quarantined: {reason}")
    unhealthy = sum(1 for n in nodes if n.health is not None and n.health.unhealthy)
    summary = HealthSummary(
        enabled=policy.enabled,
        unhealthy=unhealthy,
        quarantined=len(holding),
        limit=limit,
        held=tuple(held),
        line=_line(policy.enabled, unhealthy, len(holding), limit, held),
    )
    return HealthPlan(
        tuple(steps.actions), summary, steps.tallies, min(steps.deadlines, default=None)
    )


def _reason(node: HealthNode) -> str:
    health = node.health
    if health is None:
        return "GPUHealthy is False"
    text = f"{health.reason}: {health.message}" if health.message else health.reason
    return text or "GPUHealthy is False"


def _line(enabled: bool, unhealthy: int, holding: int, limit: int, held: list[str]) -> str:
    line = (
        f"GPU health remediation {'on' if enabled else 'off'}: {unhealthy} unhealthy, "
        f"{holding}/{limit} quarantined"
    )
    if held:
        line += f"; {len(held)} held back by maxUnavailable: {names(held)}"
    return line


def _advance(node: HealthNode, steps: _Steps) -> None:
    """The next steps of one node the remediation holds."""
    policy, now = steps.policy, steps.now
    health = node.health
    if health is not None and health.healthy:
        quiet = now - health.since
        if quiet < policy.recovery_delay_s:
            steps.deadlines.append(health.since + policy.recovery_delay_s)
            return
        steps.add(
            Release(
                node.view,
                policy.external_label,
                uncordon=not node.was_cordoned and not node.upgrading,
                hand_over_cordon=not node.was_cordoned and node.upgrading,
            ),
            Tally("recover", "succeeded"),
        )
        message = f"GPUHealthy True for {quiet:.0f}s: quarantine lifted"
        steps.event(node.name, "Normal", "GPURecovered", message)
        return
    if not policy.enabled:
        return  # held as it is until the GPU is healthy again or remediation is back on
    since, phase = node.since, node.phase or Phase.QUARANTINED
    if since is None:
        # Entered by someone who did not record the time: start the clock now.
        action = node.action_index if phase is Phase.REMEDIATING else None
        steps.add(SetPhase(node.view, phase, steps.stamp, action))
    elif phase is Phase.DRAINING:
        _drain(node, since, steps)
    elif phase is Phase.REMEDIATING:
        _remediate(node, since, steps)


def _drain(node: HealthNode, since: float, steps: _Steps) -> None:
    policy, now = steps.policy, steps.now
    pods = gpu_pods(node.pods)
    if policy.drain_enable:
        pods += [p for p in drain_pods(node.pods, policy.drain_selector) if p not in pods]
    timeout = policy.drain_timeout_s
    timed_out = bool(pods) and timeout > 0 and now - since >= timeout
    removal = remove(
        pods,
        node=node.name,
        stage="GPU health drain",
        force=policy.drain_force,
        timeout_s=timeout,
        empty_dir=policy.drain_delete_empty_dir,
        timed_out=timed_out,
    )
    if removal.done:
        steps.event(node.name, "Normal", "GPUDrained", "GPU pods evicted")
        _start_action(node, 0, steps)
    elif removal.failure is not None:
        steps.add(SetPhase(node.view, Phase.QUARANTINED, steps.stamp), Tally("drain", "failed"))
        steps.event(node.name, "Warning", "GPUDrainIncomplete", removal.failure)
    else:
        for request in removal.requests:
            steps.add(request)
        if timeout > 0:
            steps.deadlines.append(since + timeout)
        steps.deadlines.append(now + EMPTYING_RECHECK_S)


def _start_action(node: HealthNode, index: int, steps: _Steps) -> None:
    """Start remediation action ``index``; past the last, wait quarantined for the GPU."""
    policy, stamp = steps.policy, steps.stamp
    if index >= len(policy.actions):
        if not policy.actions:
            steps.add(SetPhase(node.view, Phase.QUARANTINED, stamp), Tally("drain", "succeeded"))
            return
        steps.add(SetPhase(node.view, Phase.QUARANTINED, stamp))
        tried = ", ".join(policy.actions)
        message = f"remediation ({tried}) did not bring GPUHealthy back: the node stays quarantined"
        steps.event(node.name, "Warning", "GPURemediationFailed", message)
        return
    action = policy.actions[index]
    tally = Tally(action, "started")
    if action == "restartDriver":
        steps.add(SetPhase(node.view, Phase.REMEDIATING, stamp, index), tally)
        drivers = _restart_driver(node, stamp, steps)
        detail = (
            f"restarting driver pod {names(p.name for p in drivers)}"
            if drivers
            else "no driver pod on the node to restart"
        )
    elif action == "resetGPU":
        request = {HEALTH_RESET_REQUESTED: str(stamp)}
        steps.add(SetPhase(node.view, Phase.REMEDIATING, stamp, index, annotations=request), tally)
        detail = "asked the device-plugin agent to reset the unhealthy GPUs no process holds"
    else:
        label = {policy.external_label: "requested"}
        steps.add(SetPhase(node.view, Phase.REMEDIATING, stamp, index, labels=label), tally)
        detail = f"handed over to an external controller ({policy.external_label}=requested)"
    steps.event(node.name, "Normal", "GPURemediationStarted", f"{action}: {detail}")


def _remediate(node: HealthNode, since: float, steps: _Steps) -> None:
    policy, now = steps.policy, steps.now
    index, timeout = node.action_index, policy.action_timeout_s
    if index < len(policy.actions):
        if now - since < timeout:
            steps.deadlines.append(since + timeout)
            if policy.actions[index] == "restartDriver":
                _restart_driver(node, since, steps)  # again only if a deletion was lost
            return
        action = policy.actions[index]
        message = f"{action}: GPUHealthy not True after {timeout:.0f}s"
        steps.add(
            Event(node.name, "Warning", "GPURemediationTimedOut", message),
            Tally(action, "failed"),
        )
    _start_action(node, index + 1, steps)


def _restart_driver(node: HealthNode, since: float, steps: _Steps) -> list[Pod]:
    """Delete the node's driver pods created before ``since`` that are not on their way out:
    asked once per pod, and again after a restart only if the deletion never landed."""
    stale = [p for p in node.drivers if not p.deleting and p.created < since]
    for pod in stale:
        steps.add(DeletePod(pod.name, pod.namespace, False, node.name))
    return stale
