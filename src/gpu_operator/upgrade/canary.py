"""Canary-gated driver rollouts (pure): which nodes may take the new driver, and when the
rollout fails, rolls back and holds.

A rollout is one driver setting (its digest, ``target``) going across one pool. With
``upgradePolicy.canary`` set:

- ``canary``: only the canary nodes (``nodeSelector``, else the first ``nodes`` by name) are
  marked for and take the upgrade; every other node is not written at all. A canary node that
  fails its upgrade (driver pod not Ready, validation), or is not upgraded and validated within
  ``timeout``, fails the rollout.
- ``soaking``: every canary node runs and validated the new driver; it must stay out of
  ``GPUHealthy=False`` for ``soak``.
- ``fleet``: the other nodes follow under the usual limits, with ``batchSoak`` between batches.
- ``rollingBack``: a failed gate renders the previous settings again (``stable``, recorded when
  the last rollout reached every node): the canary nodes go back through the same drain
  rules; then ``held``: the spec still names the failed settings, and nothing moves until it
  changes or the retry annotation is set.

What must survive a restart is in the returned :class:`Rollout` (the owner's status), and in the
Nodes' upgrade labels.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpu_operator.api.base import duration_s
from gpu_operator.api.spec import CanarySpec
from gpu_operator.upgrade.model import State
from gpu_operator.upgrade.planner import NodeProgress
from gpu_operator.views import GpuHealth, parse_time

Phase = Literal["canary", "soaking", "fleet", "rollingBack", "held", "done"]
IN_FLIGHT = frozenset({"canary", "soaking", "fleet"})


def settings_digest(settings: Mapping[str, Any]) -> str:
    """A short digest of driver settings (the spec minus its upgrade policy)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CanaryPolicy:
    nodes: int | str = 1
    selector: Mapping[str, str] | None = None
    soak_s: float = 600.0
    timeout_s: float = 1800.0
    batch_soak_s: float = 0.0

    @classmethod
    def from_spec(cls, spec: CanarySpec | None) -> CanaryPolicy | None:
        if spec is None:
            return None
        return cls(
            nodes=1 if spec.nodes is None else spec.nodes,
            selector=dict(spec.node_selector) if spec.node_selector else None,
            soak_s=duration_s(spec.soak or "10m"),
            timeout_s=duration_s(spec.timeout or "30m"),
            batch_soak_s=duration_s(spec.batch_soak or "0s"),
        )


@dataclass(frozen=True)
class Failure:
    node: str
    gate: str  # driver, validation, GPUHealthy
    reason: str


@dataclass(frozen=True)
class Rollout:
    """The owner's ``status...rollout`` as plain data."""

    phase: Phase
    target: str
    stable: str = ""
    stable_spec: Mapping[str, Any] | None = None
    nodes: tuple[str, ...] = ()
    since: float = 0.0
    failure: Failure | None = None

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> Rollout | None:
        if not status or not status.get("phase") or not status.get("target"):
            return None
        failure = status.get("failure") or None
        return cls(
            phase=status["phase"],
            target=str(status["target"]),
            stable=str(status.get("stable") or ""),
            stable_spec=status.get("stableSpec"),  # {}: the defaults, a real setting
            nodes=tuple(status.get("nodes") or ()),
            since=parse_time(status.get("since")),
            failure=Failure(failure["node"], failure["gate"], failure["reason"])
            if failure
            else None,
        )

    def to_status(self, iso: Any) -> dict[str, Any]:
        """The status form; ``iso(seconds)`` formats the phase's start."""
        out: dict[str, Any] = {"phase": self.phase, "target": self.target, "stable": self.stable}
        if self.stable_spec is not None:
            out["stableSpec"] = dict(self.stable_spec)
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.since:
            out["since"] = iso(self.since)
        if self.failure is not None:
            out["failure"] = {
                "node": self.failure.node,
                "gate": self.failure.gate,
                "reason": self.failure.reason,
            }
        return out


@dataclass(frozen=True)
class RolloutDecision:
    rollout: Rollout
    render_stable: bool = False  # render ``rollout.stable_spec`` in place of the spec's settings
    allowed: frozenset[str] | None = None  # nodes the planner may touch; None: every node
    events: tuple[tuple[str, str, str], ...] = ()  # (type, reason, message) about the owner
    consume_retry: bool = False
    deadline: float | None = None

    @property
    def failed(self) -> bool:
        return self.rollout.phase in ("rollingBack", "held") and self.rollout.failure is not None


def decide_rollout(
    previous: Rollout | None,
    canary: CanaryPolicy | None,
    target_spec: Mapping[str, Any],
    nodes: Sequence[NodeProgress],
    health: Mapping[str, GpuHealth | None],
    *,
    retry: bool,
    now: float,
    synced: bool = True,
) -> RolloutDecision:
    """The rollout's next state and what it lets the planner do (module docstring).

    ``synced``: the driver DaemonSets as observed are the ones rendered now, and their
    controller has seen them; until then which nodes are current says nothing about this
    rollout, and no phase ends."""
    target = settings_digest(target_spec)
    settled = synced and bool(nodes) and all(n.current for n in nodes)
    if previous is None:
        # A first install (or the first look at a fleet): nothing to gate, it settles. (No
        # start time: the same observation gives the same status, not one write per pass.)
        if settled:
            return RolloutDecision(Rollout("done", target, target, dict(target_spec)))
        return RolloutDecision(Rollout("fleet", target))
    if previous.target != target:
        stable, stable_spec = _stable_of(previous)
        if settled:
            return RolloutDecision(Rollout("done", target, target, dict(target_spec)))
        if canary is None or not nodes:  # (no node yet runs a driver: nothing to gate)
            return RolloutDecision(Rollout("fleet", target, stable, stable_spec, since=now))
        chosen = choose_canary(nodes, canary)
        started = Rollout("canary", target, stable, stable_spec, chosen, now)
        message = f"driver settings {target}: canary {', '.join(chosen) or '(none)'} first"
        event = ("Normal", "CanaryStarted", message)
        return RolloutDecision(started, allowed=frozenset(chosen), events=(event,))
    if retry and previous.phase == "held":
        chosen = previous.nodes or (choose_canary(nodes, canary) if canary else ())
        again = replace(previous, phase="canary", nodes=chosen, since=now, failure=None)
        event = ("Normal", "CanaryStarted", f"driver settings {target}: retried on request")
        return RolloutDecision(
            again, allowed=frozenset(chosen), events=(event,), consume_retry=True
        )
    if not synced:
        return _hold_still(previous)
    return _step(previous, canary, nodes, health, now, [], target_spec)


def _hold_still(rollout: Rollout) -> RolloutDecision:
    """The phase as it is, no transition: what each phase lets the planner do."""
    phase = rollout.phase
    if phase in ("canary", "soaking"):
        return RolloutDecision(rollout, allowed=frozenset(rollout.nodes))
    if phase == "rollingBack":
        return RolloutDecision(rollout, True, frozenset(rollout.nodes))
    if phase == "held":
        return RolloutDecision(rollout, rollout.stable_spec is not None, frozenset())
    return RolloutDecision(rollout)


def _stable_of(previous: Rollout | None) -> tuple[str, Mapping[str, Any] | None]:
    if previous is None:
        return "", None
    if previous.phase == "done":
        return previous.target, previous.stable_spec
    return previous.stable, previous.stable_spec


def choose_canary(nodes: Sequence[NodeProgress], canary: CanaryPolicy) -> tuple[str, ...]:
    """The selector's nodes, else the first ``nodes`` (count or percent, at least 1) by name
    among the Ready ones: the same set from the same fleet, so a restart keeps it."""
    if canary.selector:
        return tuple(
            n.name
            for n in sorted(nodes, key=lambda n: n.name)
            if all(n.labels.get(k) == v for k, v in canary.selector.items())
        )
    ready = sorted((n for n in nodes if n.ready), key=lambda n: n.name)
    count = canary.nodes
    if isinstance(count, str) and count.endswith("%"):
        wanted = math.ceil(int(count[:-1]) * len(nodes) / 100)
    else:
        wanted = int(count)
    return tuple(n.name for n in ready[: max(1, wanted)])


def _step(
    rollout: Rollout,
    canary: CanaryPolicy | None,
    nodes: Sequence[NodeProgress],
    health: Mapping[str, GpuHealth | None],
    now: float,
    events: list[tuple[str, str, str]],
    target_spec: Mapping[str, Any],
) -> RolloutDecision:
    by_name = {n.name: n for n in nodes}
    members = [by_name[n] for n in rollout.nodes if n in by_name]
    phase = rollout.phase
    if phase == "done":
        if nodes and all(n.current for n in nodes):
            return RolloutDecision(rollout, events=tuple(events))
        return RolloutDecision(replace(rollout, phase="fleet", since=now), events=tuple(events))
    if phase in ("canary", "soaking") and canary is None:
        rollout = replace(rollout, phase="fleet", since=now)  # the canary was taken away
        phase = "fleet"
    allowed = frozenset(rollout.nodes)
    if phase == "canary" and canary is not None:
        if not rollout.nodes:
            none = Failure("-", "canary", "no node is a canary (nodeSelector matches none)")
            return _fail(rollout, none, now, events)
        failure = _canary_failure(members, rollout, canary, now)
        if failure is not None:
            return _fail(rollout, failure, now, events)
        if members and all(n.current for n in members):
            events.append(("Normal", "CanaryUpgraded", f"canary {', '.join(rollout.nodes)} "
                           f"upgraded and validated; soaking {canary.soak_s:.0f}s"))  # fmt: skip
            rollout = replace(rollout, phase="soaking", since=now)
            return RolloutDecision(
                rollout, allowed=allowed, events=tuple(events), deadline=now + canary.soak_s
            )
        deadline = rollout.since + canary.timeout_s
        return RolloutDecision(rollout, allowed=allowed, events=tuple(events), deadline=deadline)
    if phase == "soaking" and canary is not None:
        for node in members:
            seen = health.get(node.name)
            if seen is not None and seen.unhealthy:
                reason = f"{seen.reason}: {seen.message}" if seen.message else seen.reason
                return _fail(rollout, Failure(node.name, "GPUHealthy", reason), now, events)
        if now - rollout.since >= canary.soak_s:
            events.append(("Normal", "CanaryPassed", f"canary healthy for {canary.soak_s:.0f}s: "
                           "the fleet follows"))  # fmt: skip
            rollout = replace(rollout, phase="fleet", since=now)
        else:
            deadline = rollout.since + canary.soak_s
            return RolloutDecision(
                rollout, allowed=allowed, events=tuple(events), deadline=deadline
            )
    if rollout.phase == "fleet":
        if nodes and all(n.current for n in nodes):
            done = Rollout("done", rollout.target, rollout.target, dict(target_spec), since=now)
            events.append(("Normal", "UpgradeComplete", f"driver settings {rollout.target} on "
                           f"all {len(nodes)} nodes"))  # fmt: skip
            return RolloutDecision(done, events=tuple(events))
        return _batch_soak(rollout, canary, nodes, now, events)
    if phase == "rollingBack":
        if all(n.current for n in members):  # (no member left: nothing to roll back)
            events.append(("Normal", "RolledBack", f"canary {', '.join(rollout.nodes)} back on "
                           f"driver settings {rollout.stable}; holding until the spec changes "
                           "or the retry annotation is set"))  # fmt: skip
            rollout = replace(rollout, phase="held", since=now)
            return RolloutDecision(rollout, True, frozenset(), tuple(events))
        return RolloutDecision(rollout, True, allowed, tuple(events))
    # held
    return RolloutDecision(rollout, rollout.stable_spec is not None, frozenset(), tuple(events))


def _canary_failure(
    members: Sequence[NodeProgress], rollout: Rollout, canary: CanaryPolicy, now: float
) -> Failure | None:
    for node in members:
        if node.state is State.FAILED:
            return Failure(node.name, _gate(node), _detail(node, "upgrade failed"))
    if now - rollout.since < canary.timeout_s:
        return None
    late = next((n for n in members if not n.current), None)
    if late is None:
        return None
    return Failure(
        late.name, _gate(late), _detail(late, f"not upgraded within {canary.timeout_s:.0f}s")
    )


def _gate(node: NodeProgress) -> str:
    return "validation" if node.state is State.VALIDATION else "driver"


def _detail(node: NodeProgress, what: str) -> str:
    detail = f"{what} ({node.state.value or 'not started'})"
    if node.driver_waiting:
        detail += f"; driver pod {node.driver_waiting}"
    return detail


def _fail(
    rollout: Rollout, failure: Failure, now: float, events: list[tuple[str, str, str]]
) -> RolloutDecision:
    back = rollout.stable_spec is not None
    message = f"node {failure.node}, gate {failure.gate}: {failure.reason}; " + (
        f"rolling the canary back to driver settings {rollout.stable}"
        if back
        else "no earlier settings known to roll back to: holding"
    )
    events.append(("Warning", "UpgradeFailed", message))
    phase: Phase = "rollingBack" if back else "held"
    failed = replace(rollout, phase=phase, since=now, failure=failure)
    allowed = frozenset(rollout.nodes) if back else frozenset()
    return RolloutDecision(failed, back, allowed, tuple(events))


def _batch_soak(
    rollout: Rollout,
    canary: CanaryPolicy | None,
    nodes: Sequence[NodeProgress],
    now: float,
    events: list[tuple[str, str, str]],
) -> RolloutDecision:
    """Between later batches, ``batchSoak`` after the last node finished before others start."""
    pause = canary.batch_soak_s if canary else 0.0
    busy = any(
        n.state not in (State.UNKNOWN, State.DONE, State.REQUIRED, State.FAILED) for n in nodes
    )
    if pause <= 0 or busy:
        return RolloutDecision(rollout, events=tuple(events))
    finished = [
        n.since for n in nodes if n.state is State.DONE and n.since and n.since >= rollout.since
    ]
    last = max(finished, default=None)
    if last is not None and now - last < pause:
        moving = frozenset(n.name for n in nodes if n.state is not State.REQUIRED and not n.current)
        return RolloutDecision(rollout, allowed=moving, events=tuple(events), deadline=last + pause)
    return RolloutDecision(rollout, events=tuple(events))
