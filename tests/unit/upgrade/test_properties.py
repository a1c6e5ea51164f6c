"""Property tests: random fleets, policies and event orders, played by the simulated cluster.

Every pass is checked against the budget rules, and every finished run against what must have
happened: all nodes that can be upgraded are, nodes cordoned by someone else stay cordoned, a
broken node does not stop the others, and an operator killed in the middle of a pass (its
remaining actions lost) never upgrades a node twice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.labels import (
    UPGRADE_DRAIN_SKIP,
    UPGRADE_STATE,
)
from gpu_operator.nodeops.operations import Cordon, Uncordon
from gpu_operator.testenv.fleetsim import Broken, Pass, SimConfig, Simulation, World
from gpu_operator.upgrade import (
    IN_PROGRESS,
    Fleet,
    Policy,
    Selector,
    SetState,
    State,
    UpgradePlan,
    plan,
    scaled_max_unavailable,
)

FOREVER = float("inf")
BROKEN_KINDS: tuple[Broken, ...] = ("pending", "crashloop", "late", "validator")


@dataclass
class Scenario:
    """What the test knows up front about a random fleet."""

    world: World
    policy: Policy
    managed: set[str]
    needs: set[str]  # managed nodes that need an upgrade
    pre_cordoned: set[str]  # every node cordoned before the run, managed or not
    never_ready: set[str]
    doomed: set[str] = field(default_factory=set)  # must fail if started and never recover
    # requested on a current driver, but its pods cannot leave: fails, then recovers at once
    # (the driver it runs is the newest and Ready), so it finishes without a restart
    unrestarted: set[str] = field(default_factory=set)

    @property
    def max_unavailable(self) -> int:
        return scaled_max_unavailable(self.policy.max_unavailable, len(self.managed))


@st.composite
def scenarios(draw: st.DrawFn, *, broken: bool) -> Scenario:
    count = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    policy = Policy(
        auto_upgrade=True,
        max_parallel_upgrades=draw(st.sampled_from([0, 1, 2, 3, 5])),
        max_unavailable=draw(
            st.one_of(
                st.integers(0, 12),
                st.sampled_from(["0%", "10%", "25%", "34%", "50%", "100%", "3"]),
            )
        ),
        pod_deletion_force=draw(st.booleans()),
        pod_deletion_timeout_s=draw(st.sampled_from([60, 300])),
        pod_deletion_delete_empty_dir=draw(st.booleans()),
        wait_selector=draw(st.sampled_from([None, Selector.parse("job=train")])),
        wait_timeout_s=draw(st.sampled_from([0, 120])),
        drain_enable=draw(st.booleans()),
        drain_force=draw(st.booleans()),
        drain_timeout_s=draw(st.sampled_from([60, 300])),
        drain_delete_empty_dir=draw(st.booleans()),
    )
    p_cordoned = draw(st.sampled_from([0.0, 0.1, 0.3]))
    p_not_ready = draw(st.sampled_from([0.0, 0.1, 0.2]))
    p_skip = draw(st.sampled_from([0.0, 0.1]))
    p_broken = draw(st.sampled_from([0.1, 0.25])) if broken else 0.0
    config = SimConfig(
        restart_s=draw(st.sampled_from([30.0, 120.0])),
        restart_jitter_s=draw(st.sampled_from([0.0, 60.0])),
        termination_s=draw(st.sampled_from([1.0, 10.0])),
        validator_s=draw(st.sampled_from([1.0, 20.0])),
        validator_follows_driver=draw(st.booleans()),
        latency_s=draw(st.sampled_from([0.5, 2.0])),
        latency_jitter_s=draw(st.sampled_from([0.0, 5.0])),
        resync_s=draw(st.sampled_from([30.0, 600.0])),
    )
    return build(count, seed, policy, config, p_cordoned, p_not_ready, p_skip, p_broken)


def build(
    count: int,
    seed: int,
    policy: Policy,
    config: SimConfig,
    p_cordoned: float,
    p_not_ready: float,
    p_skip: float,
    p_broken: float,
) -> Scenario:
    rng = random.Random(seed)
    world = World(config, seed)
    s = Scenario(world, policy, set(), set(), set(), set())
    for i in range(count):
        name = f"node-{i:02d}"
        cordoned = rng.random() < p_cordoned
        ready = rng.random() >= p_not_ready
        heal_at = None if ready or rng.random() < 0.3 else rng.uniform(0, 3000)
        skip = rng.random() < p_skip
        current = rng.random() < 0.15
        requested = current and rng.random() < 0.5
        kind = rng.choice(BROKEN_KINDS) if rng.random() < p_broken else None
        world.add_node(
            name,
            cordoned=cordoned,
            ready=ready,
            heal_at=heal_at,
            skip=skip,
            current=current,
            requested=requested,
            broken=kind,
            late_at=rng.uniform(0, 5000),
        )
        if cordoned:
            s.pre_cordoned.add(name)
        if skip:
            continue
        s.managed.add(name)
        if not current or requested:
            s.needs.add(name)
        if not ready and heal_at is None:
            s.never_ready.add(name)
        if kind in ("pending", "crashloop", "validator"):
            s.doomed.add(name)
        stuck_pods = [
            add_pod(world, policy, rng, name, f"{name}-pod{j}") for j in range(rng.randint(0, 3))
        ]
        if any(stuck_pods) and current:
            # fails before its driver restarts, then recovers: whatever the driver would do
            s.unrestarted.add(name)
            s.doomed.discard(name)
        elif any(stuck_pods):
            s.doomed.add(name)
    s.doomed &= s.needs  # a node that is never started cannot fail
    return s


def add_pod(world: World, policy: Policy, rng: random.Random, node: str, name: str) -> bool:
    """Add a random pod; True when the policy cannot get it off the node (the node must fail)."""
    kind = rng.choice(["gpu", "gpu", "job", "web", "web-skip", "ds", "scratch", "pdb"])
    gpu = rng.random() < 0.5
    if kind == "job":
        finishes = rng.uniform(0, 2000)
        world.add_pod(node, name, gpu=True, labels={"job": "train"}, finishes_at=finishes)
        return False
    if kind == "ds":
        world.add_pod(node, name, gpu=gpu, daemonset=True)
        return False
    if kind == "web-skip":
        world.add_pod(node, name, labels={UPGRADE_DRAIN_SKIP: "true"})
        return False
    if kind == "scratch":
        world.add_pod(node, name, gpu=gpu, empty_dir=True)
        if gpu:
            return not policy.pod_deletion_delete_empty_dir
        return policy.drain_enable and not policy.drain_delete_empty_dir
    if kind == "pdb":
        world.add_pod(node, name, gpu=gpu, pdb_until=FOREVER)
        if gpu:
            return not policy.pod_deletion_force
        return policy.drain_enable and not policy.drain_force
    world.add_pod(node, name, gpu=kind == "gpu")
    return False


def reserved(fleet: Fleet, managed: set[str]) -> set[str]:
    """Managed nodes counted against maxUnavailable, as the rules define them."""
    return {
        n.name
        for n in fleet.nodes
        if n.name in managed
        and (n.unschedulable or not n.ready or n.labels.get(UPGRADE_STATE, "") in IN_PROGRESS)
    }


class Checker:
    """Invariants that must hold at every pass."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.initially_unavailable = reserved(s.world.observe(), s.managed)
        self.passes = 0

    def __call__(self, p: Pass) -> None:
        s, fleet, result = self.s, p.fleet, p.plan
        self.passes += 1
        assert plan(fleet, s.policy, p.now) == result, "same fleet, different plan"
        nodes = {n.name: n for n in fleet.nodes}
        states = {n.name: n.labels.get(UPGRADE_STATE, "") for n in fleet.nodes}
        in_progress = {n for n in s.managed if states[n] in IN_PROGRESS}
        limit = s.policy.max_parallel_upgrades
        assert not limit or len(in_progress) <= limit, f"{len(in_progress)} in progress > {limit}"

        before = reserved(fleet, s.managed)
        bound = max(s.max_unavailable, len(self.initially_unavailable))
        assert len(before) <= bound, f"{len(before)} unavailable > {bound}"
        entering = {
            a.node
            for a in result.actions
            if isinstance(a, SetState)
            and a.state in IN_PROGRESS
            and states[a.node] not in IN_PROGRESS
        }
        started = len(entering - before)
        if started:
            assert len(before) + started <= s.max_unavailable, "started beyond maxUnavailable"
        if limit:
            assert len(in_progress) + len(entering) <= limit, "started beyond maxParallelUpgrades"

        for a in result.actions:
            assert a.node in s.managed, f"action on an unmanaged node: {a}"
            if isinstance(a, Cordon):
                assert states[a.node] == State.CORDON, a
            if isinstance(a, Uncordon):
                assert nodes[a.node].was_cordoned is False, a
            if isinstance(a, SetState) and a.state is State.UNCORDON:
                assert validated_after_new_driver(fleet, a.node), f"{a.node} not validated"


def validated_after_new_driver(fleet: Fleet, node: str) -> bool:
    """Its validator turned Ready after its Ready new driver pod was created (or validation is
    not deployed anywhere)."""
    if not fleet.validator_pods:
        return True
    drivers = [p for p in fleet.driver_pods if p.node == node and p.ready and not p.deleting]
    validators = [p for p in fleet.validator_pods if p.node == node and p.ready]
    newest = max((p.created for p in drivers), default=None)
    return newest is not None and any(v.ready_since >= newest for v in validators)


def run(
    s: Scenario, *, crash_rng: random.Random | None = None
) -> tuple[Checker, UpgradePlan, bool]:
    checker = Checker(s)

    def applied(proposed: UpgradePlan) -> int:
        # The operator dies part way through a pass now and then; the rest of it is lost.
        if crash_rng is not None and proposed.actions and crash_rng.random() < 0.25:
            return crash_rng.randint(0, len(proposed.actions) - 1)
        return len(proposed.actions)

    result = Simulation(s.world, s.policy).run(
        until=200_000, max_passes=10_000, on_pass=checker, applied=applied
    )
    return checker, result.final, result.settled


def check_outcome(s: Scenario, settled: bool) -> None:
    world = s.world
    nodes = world.nodes
    state = {n: nodes[n].labels.get(UPGRADE_STATE, "") for n in nodes}
    history = {n: [st for _, st in world.transitions.get(n, [])] for n in nodes}

    for name in s.pre_cordoned:
        assert nodes[name].unschedulable, f"{name} was cordoned before and got uncordoned"
    for name in set(nodes) - s.needs:
        assert history[name] == [], f"{name} needed nothing but went {history[name]}"
    for name in s.needs:
        assert history[name].count(State.DONE) <= 1, f"{name} upgraded twice: {history[name]}"
        assert world.driver_deletions[name] <= 1, f"{name} driver deleted more than once"
        if State.DONE in history[name]:
            restarts = 0 if name in s.unrestarted else 1
            assert state[name] == State.DONE and world.driver_deletions[name] == restarts
            assert history[name][-1] == State.DONE
    for name in s.doomed:
        assert State.DONE not in history[name], f"{name} cannot be upgraded but was"

    # Nodes that stay out of service for good; if the budget still has room beside them, the
    # rest of the fleet must finish.
    stuck = (s.pre_cordoned & s.managed) | s.never_ready | s.doomed
    if len(stuck) < s.max_unavailable:
        assert settled, "the run never settled"
        for name in s.needs - s.never_ready - s.doomed:
            assert state[name] == State.DONE, f"{name} ended {state[name]!r}: {history[name]}"
            assert nodes[name].unschedulable == (name in s.pre_cordoned)


SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(scenarios(broken=False))
def test_healthy_fleets_finish_within_budget(s: Scenario) -> None:
    _, _, settled = run(s)
    check_outcome(s, settled)


@SETTINGS
@given(scenarios(broken=True))
def test_broken_nodes_do_not_stop_the_others(s: Scenario) -> None:
    _, _, settled = run(s)
    check_outcome(s, settled)
    for name in s.doomed:
        label = s.world.nodes[name].labels.get(UPGRADE_STATE, "")
        assert label in (State.FAILED, State.REQUIRED, ""), f"{name} ended {label!r}"


@SETTINGS
@given(scenarios(broken=True), st.integers(0, 2**32 - 1))
def test_operator_killed_mid_pass_never_repeats_a_node(s: Scenario, seed: int) -> None:
    _, _, settled = run(s, crash_rng=random.Random(seed))
    check_outcome(s, settled)


def test_simulation_example_upgrades_everything_and_reports_it() -> None:
    """One readable run, so a broken simulator cannot make the properties pass vacuously."""
    policy = Policy(auto_upgrade=True, max_parallel_upgrades=2, max_unavailable="50%")
    s = build(8, 7, policy, SimConfig(), 0.0, 0.0, 0.0, 0.0)
    checker, final, settled = run(s)
    assert settled and checker.passes > 8 * 6
    assert final.summary.done == 8 == final.summary.total
    assert all(s.world.driver_deletions[n] == 1 for n in s.needs)
    assert len(s.needs) >= 4
