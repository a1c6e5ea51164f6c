"""Random fault sequences on a small fleet, every write applied: the limit always holds, a
person's cordon and taints are never undone, and every node comes back after the quiet
period."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_operator.labels import HEALTH_STATE, UNHEALTHY_TAINT
from gpu_operator.remediation import HealthPolicy, plan_health
from gpu_operator.upgrade.model import scaled_max_unavailable
from tests.unit.remediation.cluster import apply, health_nodes, node, set_health

T0 = 2_000_000.0
USER_TAINTS = [
    {"key": UNHEALTHY_TAINT, "value": "by-hand", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "ml", "effect": "NoExecute"},
]


@st.composite
def fleets(draw: st.DrawFn) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    size = draw(st.integers(2, 10))
    objs: dict[str, dict[str, Any]] = {}
    users: dict[str, Any] = {}
    for i in range(size):
        name = f"n{i}"
        taints = draw(st.lists(st.sampled_from(USER_TAINTS), max_size=2, unique_by=str))
        cordoned = draw(st.booleans())
        objs[name] = node(name, taints=taints, unschedulable=cordoned)
        users[name] = (taints, cordoned)
    return objs, users


limits = st.one_of(st.integers(0, 4), st.sampled_from(["10%", "20%", "50%", "100%"]))
# Each step: seconds later, then these nodes' GPUHealthy flips.
steps = st.lists(
    st.tuples(st.integers(1, 120), st.lists(st.integers(0, 9), max_size=4)), max_size=25
)


def _users_kept(objs: dict[str, dict[str, Any]], users: dict[str, Any]) -> None:
    for name, (taints, cordoned) in users.items():
        spec = objs[name]["spec"]
        for taint in taints:
            assert taint in (spec.get("taints") or []), f"{name} lost {taint}"
        if cordoned:
            assert spec.get("unschedulable") is True, f"{name} was uncordoned"


@settings(max_examples=150, deadline=None)
@given(fleets(), limits, steps, st.integers(0, 300), st.booleans())
def test_random_faults_never_exceed_the_limit_or_undo_a_person_and_always_recover(
    fleet: tuple[dict[str, dict[str, Any]], dict[str, Any]],
    limit: int | str,
    sequence: list[tuple[int, list[int]]],
    recovery_s: int,
    enabled: bool,
) -> None:
    objs, users = fleet
    policy = HealthPolicy(
        enabled=enabled,
        max_unavailable=limit,
        recovery_delay_s=recovery_s,
        actions=("resetGPU", "external"),
        action_timeout_s=60,
    )
    cap = scaled_max_unavailable(limit, len(objs))
    healthy = dict.fromkeys(objs, True)
    now = T0
    for dt, flips in sequence:
        now += dt
        for i in flips:
            name = f"n{i}"
            if name in objs:
                healthy[name] = not healthy[name]
                set_health(objs[name], healthy[name], now)
        apply(
            objs, plan_health(health_nodes(objs.values()), policy, now, gpu_nodes=len(objs)).actions
        )
        held = [n for n, o in objs.items() if HEALTH_STATE in (o["metadata"].get("labels") or {})]
        assert len(held) <= cap
        if not enabled:
            assert not held
        _users_kept(objs, users)

    # Every GPU healthy again: after the recovery delay every node is back as it was.
    for name in objs:
        if not healthy[name]:
            set_health(objs[name], True, now)
    for later in (now + recovery_s, now + recovery_s + 1):
        apply(
            objs,
            plan_health(health_nodes(objs.values()), policy, later, gpu_nodes=len(objs)).actions,
        )
    for name, obj in objs.items():
        taints, cordoned = users[name]
        assert HEALTH_STATE not in (obj["metadata"].get("labels") or {})
        assert (obj["spec"].get("taints") or []) == taints
        assert bool(obj["spec"].get("unschedulable")) == cordoned
