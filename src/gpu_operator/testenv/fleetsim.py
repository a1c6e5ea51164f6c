"""A small simulated cluster around the upgrade planner, for property tests and the benchmark.

The ``World`` plays the API server, the DaemonSet controller and the kubelets: it applies the
planner's actions (node patches, evictions, deletions), replaces a deleted driver pod with one on
the newest template that becomes Ready after a delay (or never, on a *broken* node), terminates
evicted pods, and brings validators back after the driver. ``Simulation`` runs the operator's
loop on simulated time: observe, plan, apply, and pass again after a watch event or a resync.

Everything the planner needs lives in the World, as in a real cluster; the only state outside it
is the loop's clock, so an operator restart is modelled by applying a pass only in part.
Part of testenv: it never runs in a pod, and the image's wheel leaves it out (setup.py).
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpu_operator.labels import (
    UPGRADE_REQUESTED,
    UPGRADE_SKIP,
    UPGRADE_STATE,
    VALIDATOR_APP,
)
from gpu_operator.nodeops.operations import Cordon, DeletePod, Event, Evict, Uncordon
from gpu_operator.nodeops.pods import Pod
from gpu_operator.upgrade.model import (
    Action,
    Fail,
    Fleet,
    Node,
    Policy,
    SetState,
    UpgradePlan,
)
from gpu_operator.upgrade.planner import plan

DRIVER_DS = "nvidia-driver-daemonset"
OLD_HASH = "old"
NEW_HASH = "new"
NAMESPACE = "gpu-operator"

# How a node's new driver misbehaves: never scheduled, crash-looping, Ready only at
# ``late_at`` (so the node fails, then recovers), or driver fine but validator never Ready.
Broken = Literal["pending", "crashloop", "late", "validator"]


@dataclass(frozen=True)
class SimConfig:
    restart_s: float = 120.0  # DeletePod of the old driver pod -> new driver pod Ready
    restart_jitter_s: float = 0.0  # uniform extra on top of restart_s
    termination_s: float = 5.0  # an evicted or deleted pod terminates for this long
    validator_s: float = 10.0  # the validator is Ready this long after the driver
    # A real validator goes NotReady with its driver and re-validates the new one; False plays
    # one that stays Ready through the restart (as kwok's pods do), which must be restarted.
    validator_follows_driver: bool = True
    latency_s: float = 1.0  # the operator passes again this long after a change
    latency_jitter_s: float = 0.0
    resync_s: float = 30.0  # and at least this often
    crash_period_s: float = 30.0  # a crash-looping driver restarts this often
    max_crashes: int = 12


@dataclass
class World:
    config: SimConfig = field(default_factory=SimConfig)
    seed: int = 0
    now: float = 0.0
    nodes: dict[str, Node] = field(default_factory=dict)
    drivers: dict[str, Pod] = field(default_factory=dict)  # by pod name
    workloads: dict[str, Pod] = field(default_factory=dict)
    validators: dict[str, Pod] = field(default_factory=dict)  # by node
    # The driver DaemonSet's newest template: NEW_HASH, or OLD_HASH again after a rollback.
    newest: str = NEW_HASH
    broken: dict[str, Broken] = field(default_factory=dict)  # how the NEW_HASH driver fails
    late_at: dict[str, float] = field(default_factory=dict)
    pdb_until: dict[str, float] = field(default_factory=dict)  # pod -> evictions refused until
    # records for assertions and figures
    driver_deletions: Counter[str] = field(default_factory=Counter, init=False)
    new_drivers: Counter[str] = field(default_factory=Counter, init=False)  # NEW_HASH pods made
    transitions: dict[str, list[tuple[float, str]]] = field(default_factory=dict, init=False)
    events: list[Event] = field(default_factory=list, init=False)
    rng: random.Random = field(init=False)
    _timers: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list, init=False)
    _seq: itertools.count[int] = field(default_factory=itertools.count, init=False)
    _generation: Counter[str] = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # ---- building ----
    def add_node(
        self,
        name: str,
        *,
        cordoned: bool = False,
        ready: bool = True,
        heal_at: float | None = None,
        skip: bool = False,
        current: bool = False,
        requested: bool = False,
        broken: Broken | None = None,
        late_at: float = 0.0,
        validator: bool = True,
    ) -> None:
        labels = {UPGRADE_SKIP: "true"} if skip else {}
        annotations = {UPGRADE_REQUESTED: "true"} if requested else {}
        self.nodes[name] = Node(name, labels, annotations, unschedulable=cordoned, ready=ready)
        if heal_at is not None and not ready:
            self._at(heal_at, lambda: self._set_node(name, ready=True))
        self._new_driver(name, NEW_HASH if current else OLD_HASH, ready=True, created=-1000.0)
        if broken:
            self.broken[name] = broken
            self.late_at[name] = late_at
        if validator:
            self.validators[name] = Pod(
                f"validator-{name}",
                NAMESPACE,
                name,
                {"app": VALIDATOR_APP},
                owner="nvidia-operator-validator",
                is_daemonset_pod=True,
                created=-1000.0,
                ready_since=-1000.0,
            )

    def add_pod(
        self,
        node: str,
        name: str,
        *,
        gpu: bool = False,
        empty_dir: bool = False,
        labels: Mapping[str, str] | None = None,
        daemonset: bool = False,
        pdb_until: float = 0.0,
        finishes_at: float | None = None,
    ) -> None:
        self.workloads[name] = Pod(
            name,
            "work",
            node,
            dict(labels or {}),
            owner="DaemonSet/x" if daemonset else "ReplicaSet/x",
            uses_gpu=gpu,
            is_daemonset_pod=daemonset,
            uses_empty_dir=empty_dir,
        )
        if pdb_until:
            self.pdb_until[name] = pdb_until
        if finishes_at is not None:
            self._at(finishes_at, lambda: self._finish(name))

    # ---- observing ----
    def observe(self) -> Fleet:
        return Fleet(
            tuple(self.nodes.values()),
            tuple(self.drivers.values()),
            tuple(self.workloads.values()),
            tuple(self.validators.values()),
            {DRIVER_DS: self.newest},
        )

    def next_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def advance(self, to: float) -> None:
        """Play every world event due by ``to``, in time order."""
        while self._timers and self._timers[0][0] <= to:
            at, _, fn = heapq.heappop(self._timers)
            self.now = max(self.now, at)
            fn()
        self.now = max(self.now, to)

    # ---- the executor: apply actions; report nothing back ----
    def apply(self, actions: tuple[Action, ...] | list[Action]) -> None:
        failed_nodes: set[str] = set()
        for action in actions:
            if action.node in failed_nodes:
                continue
            if isinstance(action, (SetState, Fail, Cordon, Uncordon)):
                if action.node not in self.nodes:
                    failed_nodes.add(action.node)
                    continue
                self._patch_node(action.node, action.patch())
                if isinstance(action, Fail):
                    self.events.append(
                        Event(action.node, "Warning", "UpgradeFailed", action.reason)
                    )
            elif isinstance(action, Evict):
                self._evict(action.pod)
            elif isinstance(action, DeletePod):
                self._delete(action.pod, action.node, action.force)
            else:
                self.events.append(action)

    # ---- internals ----
    def _at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), fn))

    def _set_node(self, name: str, **changes: Any) -> None:
        self.nodes[name] = replace(self.nodes[name], **changes)

    def _patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        node = self.nodes[name]
        meta = patch.get("metadata") or {}
        labels = _merge(node.labels, meta.get("labels") or {})
        annotations = _merge(node.annotations, meta.get("annotations") or {})
        unschedulable = node.unschedulable
        if "unschedulable" in (patch.get("spec") or {}):
            unschedulable = bool(patch["spec"]["unschedulable"])
        before = node.labels.get(UPGRADE_STATE, "")
        self.nodes[name] = replace(
            node, labels=labels, annotations=annotations, unschedulable=unschedulable
        )
        after = labels.get(UPGRADE_STATE, "")
        if after != before:
            self.transitions.setdefault(name, []).append((self.now, after))

    def _new_driver(self, node: str, revision: str, *, ready: bool, created: float) -> Pod:
        self._generation[node] += 1
        if revision == NEW_HASH and created >= 0:
            self.new_drivers[node] += 1
        pod = Pod(
            f"driver-{node}-{self._generation[node]}",
            NAMESPACE,
            node,
            {"app": "nvidia-driver-daemonset"},
            owner=DRIVER_DS,
            revision_hash=revision,
            ready=ready,
            phase="Running" if ready else "Pending",
            is_daemonset_pod=True,
            created=created,
        )
        self.drivers[pod.name] = pod
        return pod

    def _evict(self, name: str) -> None:
        pod = self.workloads.get(name)
        if pod is None or pod.deleting:
            return
        if self.pdb_until.get(name, 0.0) > self.now:
            return  # 429 from the Eviction API: the planner sees the pod again next pass
        self.workloads[name] = replace(pod, deleting=True)
        self._at(self.now + self.config.termination_s, lambda: self._gone(name))

    def _gone(self, name: str) -> None:
        self.workloads.pop(name, None)

    def _finish(self, name: str) -> None:
        pod = self.workloads.get(name)
        if pod is not None:
            self.workloads[name] = replace(pod, phase="Succeeded", ready=False)

    def _delete(self, name: str, node: str, force: bool) -> None:
        validator = self.validators.get(node)
        if validator is not None and validator.name == name:
            self._delete_validator(validator)
            return
        if name in self.workloads:
            if force:
                self.workloads.pop(name)
            elif not self.workloads[name].deleting:
                self.workloads[name] = replace(self.workloads[name], deleting=True)
                self._at(self.now + self.config.termination_s, lambda: self._gone(name))
            return
        pod = self.drivers.get(name)
        if pod is None or pod.deleting:
            return
        self.driver_deletions[pod.node] += 1
        self.drivers[name] = replace(pod, deleting=True, ready=False)
        node = pod.node
        validator = self.validators.get(node)
        if validator is not None and self.config.validator_follows_driver:
            self.validators[node] = replace(validator, ready=False, phase="Pending")
        delay = 0.0 if force else self.config.termination_s
        ready_after = self.config.restart_s + self.rng.uniform(0, self.config.restart_jitter_s)
        deleted_at = self.now

        def replaced() -> None:
            self.drivers.pop(name, None)
            new = self._new_driver(node, self.newest, ready=False, created=self.now)
            kind = self.broken.get(node) if self.newest == NEW_HASH else None
            if kind == "pending":
                return
            if kind == "crashloop":
                self.drivers[new.name] = replace(new, phase="Running")
                self._crash(new.name)
                return
            at = deleted_at + max(ready_after, delay)
            if kind == "late":
                at = max(at, self.late_at.get(node, 0.0))
            self._at(at, lambda: self._driver_ready(new.name))

        self._at(self.now + delay, replaced)

    def _crash(self, name: str) -> None:
        pod = self.drivers.get(name)
        if pod is None or pod.restart_count >= self.config.max_crashes:
            return

        def crash() -> None:
            current = self.drivers.get(name)
            if current is not None:
                self.drivers[name] = replace(current, restart_count=current.restart_count + 1)
                self._crash(name)

        self._at(self.now + self.config.crash_period_s, crash)

    def _driver_ready(self, name: str) -> None:
        pod = self.drivers.get(name)
        if pod is None:
            return
        self.drivers[name] = replace(pod, ready=True, phase="Running")
        validator = self.validators.get(pod.node)
        if validator is not None and not validator.ready and not validator.deleting:
            self._validate(pod.node)

    def _validate(self, node: str) -> None:
        """The node's validator turns Ready ``validator_s`` from now (unless it is broken)."""
        on_new = any(p.node == node and p.revision_hash == NEW_HASH for p in self.drivers.values())
        if node not in self.validators or (on_new and self.broken.get(node) == "validator"):
            return
        name = self.validators[node].name

        def validated() -> None:
            validator = self.validators.get(node)
            if validator is not None and validator.name == name and not validator.deleting:
                self.validators[node] = replace(
                    validator, ready=True, phase="Running", ready_since=self.now
                )

        self._at(self.now + self.config.validator_s, validated)

    def _delete_validator(self, pod: Pod) -> None:
        """Its DaemonSet recreates it; the new one validates once the node's driver is Ready."""
        if pod.deleting:
            return
        node = pod.node
        self.validators[node] = replace(pod, deleting=True, ready=False)
        self._generation[f"validator/{node}"] += 1
        generation = self._generation[f"validator/{node}"]

        def recreated() -> None:
            self.validators[node] = replace(
                pod,
                name=f"validator-{node}-{generation}",
                deleting=False,
                ready=False,
                phase="Pending",
                created=self.now,
                ready_since=self.now,
            )
            if any(p.node == node and p.ready and not p.deleting for p in self.drivers.values()):
                self._validate(node)

        self._at(self.now + self.config.termination_s, recreated)


def _merge(current: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    """JSON merge patch on a string map: None removes the key."""
    out = dict(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@dataclass
class Pass:
    now: float
    fleet: Fleet
    plan: UpgradePlan
    applied: int  # how many of the plan's actions the executor applied


@dataclass
class Result:
    passes: int
    end: float  # simulated time when the loop stopped
    settled: bool  # nothing left that could change
    plan_seconds: list[float]  # wall time of each plan() call
    final: UpgradePlan


class Simulation:
    """The operator's loop on simulated time."""

    def __init__(self, world: World, policy: Policy, *, start: float = 0.0) -> None:
        self.world = world
        self.policy = policy
        self.now = start

    def run(
        self,
        *,
        until: float,
        max_passes: int = 1_000_000,
        on_pass: Callable[[Pass], None] | None = None,
        applied: Callable[[UpgradePlan], int] | None = None,
    ) -> Result:
        """Pass until nothing can change any more, ``until`` or ``max_passes``.

        Passes come ``latency_s`` after acting or after a world event (a watch), at the plan's
        ``next_deadline`` and at least every ``resync_s``.

        ``applied`` says how many of a pass's actions the executor gets through before the
        operator is killed (the rest are lost, as they would be); the next pass is a fresh
        operator that knows only what the World holds.
        """
        world, config = self.world, self.world.config
        timings: list[float] = []
        passes = 0
        current: UpgradePlan | None = None
        settled = False
        while self.now <= until and passes < max_passes:
            world.advance(self.now)
            fleet = world.observe()
            started = time.perf_counter()
            current = plan(fleet, self.policy, self.now)
            timings.append(time.perf_counter() - started)
            count = len(current.actions) if applied is None else applied(current)
            world.apply(current.actions[:count])
            passes += 1
            if on_pass is not None:
                on_pass(Pass(self.now, fleet, current, count))
            timer = world.next_timer()
            if current.actions:
                jitter = world.rng.uniform(0, config.latency_jitter_s)
                self.now += config.latency_s + jitter
                continue
            wakes = [self.now + config.resync_s]
            if timer is not None:
                wakes.append(max(self.now, timer) + config.latency_s)
            if current.next_deadline is not None:
                wakes.append(max(self.now, current.next_deadline))
            if timer is None and current.next_deadline is None:
                settled = True  # nothing in the world or the planner is waiting on time
                break
            self.now = min(wakes)
        assert current is not None, "the loop ran no pass"
        return Result(passes, self.now, settled, timings, current)
