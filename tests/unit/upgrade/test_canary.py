"""Canary-gated rollouts: the rollout's decisions case by case, then random fleets run to the
end on the simulated World (a failed version never reaches a node outside the canary; rolling
back keeps to the upgrade's limits; a good version reaches every node)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_operator.testenv.fleetsim import NEW_HASH, OLD_HASH, SimConfig, World
from gpu_operator.upgrade.canary import (
    CanaryPolicy,
    Failure,
    Rollout,
    choose_canary,
    decide_rollout,
    settings_digest,
)
from gpu_operator.upgrade.model import IN_PROGRESS, Policy, State
from gpu_operator.upgrade.planner import NodeProgress, plan, progress
from gpu_operator.views import GpuHealth

OLD = {"version": "580.95.05"}
NEW = {"version": "580.105.08"}
CANARY = CanaryPolicy(nodes=1, soak_s=60, timeout_s=300)
SETTLED = Rollout("done", settings_digest(OLD), settings_digest(OLD), OLD)


def node(
    name: str, state: State = State.UNKNOWN, *, current: bool = False, **kw: object
) -> NodeProgress:
    return NodeProgress(name, state, current, True, dict(kw.pop("labels", {}) or {}), 0.0)  # type: ignore[arg-type]


def test_a_new_version_starts_on_the_canary_only_and_nothing_else_is_allowed() -> None:
    nodes = [node("b"), node("a"), node("c")]
    decision = decide_rollout(SETTLED, CANARY, NEW, nodes, {}, retry=False, now=100)
    assert decision.rollout.phase == "canary" and decision.rollout.nodes == ("a",)
    assert decision.allowed == frozenset({"a"}) and not decision.render_stable
    assert decision.rollout.stable == settings_digest(OLD) and decision.rollout.stable_spec == OLD
    assert [e[1] for e in decision.events] == ["CanaryStarted"]


def test_no_canary_keeps_nvidias_behaviour_every_node_allowed() -> None:
    decision = decide_rollout(SETTLED, None, NEW, [node("a"), node("b")], {}, retry=False, now=1)
    assert decision.rollout.phase == "fleet" and decision.allowed is None


def test_percent_and_selector_choose_the_canary() -> None:
    nodes = [node(f"n{i}", labels={"pool": "canary" if i == 3 else "x"}) for i in range(10)]
    assert choose_canary(nodes, CanaryPolicy(nodes="20%")) == ("n0", "n1")
    assert choose_canary(nodes, CanaryPolicy(selector={"pool": "canary"})) == ("n3",)


def test_the_canary_soaks_then_the_fleet_follows_then_it_is_done() -> None:
    started = decide_rollout(SETTLED, CANARY, NEW, [node("a"), node("b")], {}, retry=False, now=0)
    rollout = started.rollout
    upgraded = [node("a", State.DONE, current=True), node("b")]
    soaking = decide_rollout(rollout, CANARY, NEW, upgraded, {}, retry=False, now=50)
    assert soaking.rollout.phase == "soaking" and soaking.allowed == frozenset({"a"})
    early = decide_rollout(soaking.rollout, CANARY, NEW, upgraded, {}, retry=False, now=80)
    assert early.rollout.phase == "soaking" and early.deadline == 110
    fleet = decide_rollout(soaking.rollout, CANARY, NEW, upgraded, {}, retry=False, now=111)
    assert fleet.rollout.phase == "fleet" and fleet.allowed is None
    everyone = [node("a", State.DONE, current=True), node("b", State.DONE, current=True)]
    done = decide_rollout(fleet.rollout, CANARY, NEW, everyone, {}, retry=False, now=200)
    assert done.rollout.phase == "done" and done.rollout.stable == settings_digest(NEW)


def test_a_canary_not_done_by_its_timeout_fails_naming_node_gate_and_why() -> None:
    rollout = decide_rollout(SETTLED, CANARY, NEW, [node("a"), node("b")], {}, retry=False, now=0)
    stuck = replace(node("a", State.POD_RESTART), driver_waiting="ImagePullBackOff")
    decision = decide_rollout(
        rollout.rollout, CANARY, NEW, [stuck, node("b")], {}, retry=False, now=301
    )
    failure = decision.rollout.failure
    assert failure is not None and (failure.node, failure.gate) == ("a", "driver")
    assert "ImagePullBackOff" in failure.reason
    assert decision.rollout.phase == "rollingBack" and decision.render_stable
    assert decision.allowed == frozenset({"a"})  # only the canary goes back
    (event,) = decision.events
    assert event[:2] == ("Warning", "UpgradeFailed") and "node a, gate driver" in event[2]


def test_a_canary_that_turns_unhealthy_while_soaking_fails_the_gpuhealthy_gate() -> None:
    soaking = Rollout("soaking", settings_digest(NEW), settings_digest(OLD), OLD, ("a",), 10.0)
    sick = {"a": GpuHealth("False", "GPUXid", "GPU 0 GPU-x: XID 79", 20.0)}
    nodes = [node("a", State.DONE, current=True), node("b")]
    decision = decide_rollout(soaking, CANARY, NEW, nodes, sick, retry=False, now=30)
    assert decision.rollout.failure == Failure("a", "GPUHealthy", "GPUXid: GPU 0 GPU-x: XID 79")


def test_rolled_back_it_holds_until_the_spec_changes_or_a_retry() -> None:
    failure = Failure("a", "driver", "x")
    back = Rollout(
        "rollingBack", settings_digest(NEW), settings_digest(OLD), OLD, ("a",), 5.0, failure
    )
    on_old = [node("a", State.DONE, current=True), node("b", current=True)]
    held = decide_rollout(back, CANARY, NEW, on_old, {}, retry=False, now=10)
    assert held.rollout.phase == "held" and held.render_stable and held.allowed == frozenset()
    still = decide_rollout(held.rollout, CANARY, NEW, on_old, {}, retry=False, now=99)
    assert still.rollout == held.rollout and still.allowed == frozenset() and not still.events
    retried = decide_rollout(held.rollout, CANARY, NEW, on_old, {}, retry=True, now=100)
    assert retried.rollout.phase == "canary" and retried.consume_retry and not retried.render_stable
    newer = {"version": "580.126.09"}
    # (the pass that sees the new spec renders it: the cluster does not show it yet)
    moved = decide_rollout(
        held.rollout, CANARY, newer, on_old, {}, retry=False, now=100, synced=False
    )
    assert moved.rollout.phase == "canary" and moved.rollout.target == settings_digest(newer)
    assert moved.rollout.stable_spec == OLD


def test_a_first_install_is_not_gated_and_settles_with_its_settings_as_stable() -> None:
    first = decide_rollout(None, CANARY, NEW, [node("a"), node("b")], {}, retry=False, now=0)
    assert first.rollout.phase == "fleet" and first.allowed is None
    on_new = [node("a", State.DONE, current=True), node("b", current=True)]
    done = decide_rollout(first.rollout, CANARY, NEW, on_new, {}, retry=False, now=9)
    assert done.rollout.phase == "done" and done.rollout.stable_spec == NEW


def test_without_earlier_settings_a_failure_holds_without_rolling_back() -> None:
    unknown = Rollout("fleet", settings_digest(OLD))  # it never settled: no stable settings
    first = decide_rollout(unknown, CANARY, NEW, [node("a"), node("b")], {}, retry=False, now=0)
    assert first.rollout.phase == "canary" and first.rollout.stable_spec is None
    nodes = [node("a", State.FAILED), node("b")]
    failed = decide_rollout(first.rollout, CANARY, NEW, nodes, {}, retry=False, now=1)
    assert failed.rollout.phase == "held" and not failed.render_stable


def test_nothing_moves_while_the_cluster_does_not_show_the_rendered_driver_yet() -> None:
    rollout = Rollout("canary", settings_digest(NEW), settings_digest(OLD), OLD, ("a",), 0.0)
    current = [node("a", State.DONE, current=True), node("b", current=True)]
    decision = decide_rollout(rollout, CANARY, NEW, current, {}, retry=False, now=10, synced=False)
    assert decision.rollout == rollout and decision.allowed == frozenset({"a"})


def test_the_status_form_round_trips() -> None:
    failure = Failure("a", "GPUHealthy", "r")
    rollout = Rollout("held", "t", "s", {"version": "1"}, ("a", "b"), 1_800_000_000.0, failure)
    from gpu_operator.events import iso_time

    assert Rollout.from_status(rollout.to_status(iso_time)) == rollout


# -- random fleets on the simulated World -------------------------------------------------


def run(
    world: World,
    policy: Policy,
    canary: CanaryPolicy,
    until: float,
    kills: frozenset[int] = frozenset(),
) -> tuple[Rollout, list[int]]:
    """The operator's loop around the World with a canary: the rollout picks the template the
    DaemonSet carries (NEW, or OLD again while rolling back or held) and the nodes the planner
    may touch. On a pass in ``kills`` the operator dies after applying the DaemonSet and half of
    the pass's node writes: the rollout's new status is lost, the next pass starts from the old."""
    rollout = SETTLED
    in_progress: list[int] = []
    now = 0.0
    passes = 0
    while now <= until:
        world.advance(now)
        decision = decide_rollout(
            rollout, canary, NEW, progress(world.observe()), {}, retry=False, now=now
        )
        world.newest = OLD_HASH if decision.render_stable else NEW_HASH
        fleet = world.observe()
        step = plan(fleet, policy, now, decision.allowed)
        if passes in kills:
            world.apply(step.actions[: len(step.actions) // 2])
        else:
            world.apply(step.actions)
            rollout = decision.rollout
        passes += 1
        in_progress.append(
            sum(1 for n in world.nodes.values() if n.state_label in {s.value for s in IN_PROGRESS})
        )
        wakes = [now + 30.0]
        if step.actions or decision.events:
            wakes.append(now + 1.0)
        for when in (world.next_timer(), step.next_deadline, decision.deadline):
            if when is not None:
                wakes.append(max(now + 0.5, when))
        if not step.actions and world.next_timer() is None and rollout.phase in ("done", "held"):
            break
        now = min(wakes)
    return rollout, in_progress


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[World, Policy, CanaryPolicy, set[str]]:
    size = draw(st.integers(2, 8))
    names = [f"n{i}" for i in range(size)]
    canary = CanaryPolicy(nodes=draw(st.sampled_from([1, 2, "30%"])), soak_s=60, timeout_s=400)
    chosen = set(choose_canary([node(n) for n in names], canary))
    broken = draw(st.sets(st.sampled_from(names), max_size=3))
    world = World(
        SimConfig(restart_s=30, termination_s=1, validator_s=5, latency_s=0.5),
        seed=draw(st.integers(0, 9)),
    )
    kinds = st.sampled_from(["pending", "crashloop", "validator"])
    for name in names:
        world.add_node(name, broken=draw(kinds) if name in broken else None)
    parallel = draw(st.integers(1, 3))
    policy = Policy(
        auto_upgrade=True,
        max_parallel_upgrades=parallel,
        max_unavailable="100%",
        restart_timeout_s=600,
        validation_timeout_s=600,
    )
    return world, policy, canary, broken & chosen


@settings(max_examples=60, deadline=None)
@given(scenarios(), st.frozensets(st.integers(0, 80), max_size=6))
def test_a_failed_version_never_leaves_the_canary_and_a_good_one_reaches_every_node(
    scenario: tuple[World, Policy, CanaryPolicy, set[str]], kills: frozenset[int]
) -> None:
    """Also with the operator killed mid-pass at random passes (any phase: canary, soaking,
    rolling back, held), its status write lost."""
    world, policy, canary, broken_canary = scenario
    canary_nodes = set(choose_canary([node(n) for n in world.nodes], canary))
    rollout, in_progress = run(world, policy, canary, until=20_000, kills=kills)
    assert max(in_progress) <= policy.max_parallel_upgrades
    if broken_canary:
        assert rollout.phase == "held" and rollout.failure is not None
        assert rollout.failure.node in canary_nodes
        outside = {n: c for n, c in world.new_drivers.items() if n not in canary_nodes}
        assert not outside, f"the failed version reached {outside}"
        for name in canary_nodes:  # back on the old driver, in service
            pods = [p for p in world.drivers.values() if p.node == name and not p.deleting]
            assert [p.revision_hash for p in pods] == [OLD_HASH], (name, pods)
            assert not world.nodes[name].unschedulable, name
    else:
        assert rollout.phase in ("done", "fleet"), rollout
        healthy = [n for n in world.nodes if n not in world.broken]
        for name in healthy:
            pods = [p for p in world.drivers.values() if p.node == name and not p.deleting]
            assert [p.revision_hash for p in pods] == [NEW_HASH], (name, rollout)


def test_default_settings_round_trip_too_so_a_settled_status_is_not_rewritten() -> None:
    from gpu_operator.events import iso_time

    done = Rollout("done", settings_digest({}), settings_digest({}), {}, since=1_800_000_000.0)
    assert Rollout.from_status(done.to_status(iso_time)) == done
