"""One fault at a time while the operator reconciles a policy change, a new GPU node and a
driver upgrade on a converged 6-node cluster. After each fault the cluster reaches
the fault-free end state: no managed object lost or duplicated, no node upgraded twice, the
user's labels and taint (and a deploy label set to false) untouched, API writes within twice
the fault-free run; the time from the end of the fault to convergence is printed.

Each scenario is bounded: faults last seconds (Toxiproxy toxics and fault-proxy faults end by
themselves), convergence waits are bounded. Figures (medians of 3) come from
benchmarks/bench_chaos.py, not from here.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.harness import (
    FAULTS,
    SLOW_LINK,
    ChaosEnv,
    Outcome,
    compare,
    kill_at_every_upgrade_state,
    leader_network_cut,
)


@pytest.fixture(scope="module")
def baseline(env: ChaosEnv) -> tuple[Outcome, dict[str, Any]]:
    """The fault-free run: its writes and end state are what faulty runs are held to."""
    outcome = env.run("no fault", None)
    return outcome, env.fingerprint()


def judge(env: ChaosEnv, outcome: Outcome, baseline: tuple[Outcome, dict[str, Any]]) -> None:
    reference, end_state = baseline
    compare(outcome, end_state, env.fingerprint())
    print(
        f"\n{outcome.fault}: converged {outcome.converge_s}s after the fault, "
        f"{outcome.writes} writes (fault-free {reference.writes}), exits {outcome.exits} "
        f"{' '.join(outcome.notes)}"
    )
    assert outcome.lost == [], f"objects lost: {outcome.lost}"
    assert outcome.duplicated == [], f"objects duplicated: {outcome.duplicated}"
    assert outcome.upgraded_twice == [], f"nodes upgraded twice: {outcome.upgraded_twice}"
    assert outcome.user_changes == [], f"user's labels or taints touched: {outcome.user_changes}"
    assert outcome.writes <= 2 * reference.writes, (
        f"{outcome.writes} writes, more than twice the fault-free {reference.writes}"
    )


@pytest.mark.parametrize("name", list(FAULTS))
def test_the_operator_recovers_from(
    env: ChaosEnv, baseline: tuple[Outcome, dict[str, Any]], name: str
) -> None:
    outcome = env.run(name, lambda: FAULTS[name](env))
    judge(env, outcome, baseline)
    if name == SLOW_LINK:
        # A renewal is one round trip, spaced from the renew time written: 2 s per request
        # stays inside half the renew deadline (6 s of the 9 s Lease).
        assert outcome.exits == [], f"a slow link cost the operator its Lease: {outcome.exits}"


def test_operator_sigkill_at_every_upgrade_state(
    env: ChaosEnv, baseline: tuple[Outcome, dict[str, Any]]
) -> None:
    """Killed (no goodbye) the first time any node is seen in each upgrade state; the next
    process finishes without repeating a node."""
    outcome, killed_at = kill_at_every_upgrade_state(env)
    assert killed_at, "no upgrade state was ever seen"
    judge(env, outcome, baseline)


def test_leader_network_cut_moves_leadership_and_the_old_leader_stops_first(
    env: ChaosEnv, baseline: tuple[Outcome, dict[str, Any]]
) -> None:
    outcome, handover = leader_network_cut(env)
    judge(env, outcome, baseline)
    print(f"leader hand-over: {handover}")
    assert handover.new_leader_writes, "the standby never wrote"
    # From the audit log: the old leader's last write landed before the new leader's first.
    assert handover.old_leader_writes_after == 0
    assert outcome.exits and outcome.exits[0] != 0, "the old leader did not exit non-zero"
