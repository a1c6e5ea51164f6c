"""One fault at a time while the operator reconciles a policy change, a new GPU node and a
driver upgrade on a converged 6-node cluster (issue 16). After each fault the cluster reaches
the fault-free end state: no managed object lost or duplicated, no node upgraded twice, the
user's labels and taint (and a deploy label set to false) untouched, API writes within twice
the fault-free run; the time from the end of the fault to convergence is printed.

Each scenario is bounded: faults last seconds (Toxiproxy toxics and fault-proxy faults end by
themselves), convergence waits are bounded. Figures (medians of 3) come from
benchmarks/bench_chaos.py, not from here.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from gpu_operator.testenv.faults import Fault
from tests.chaos.harness import (
    IN_PROGRESS,
    LEASE_SECONDS,
    STATE,
    ChaosEnv,
    Outcome,
    compare,
    stamp,
)
from tests.e2e.support import wait_for

FAULT_S = 20.0  # how long the HTTP-level faults and the latency last


def sigkill_apiserver(env: ChaosEnv) -> None:
    env.cluster.restart_apiserver(down_s=3.0)


def sigstop_apiserver(env: ChaosEnv) -> None:
    env.cluster.signal_apiserver(signal.SIGSTOP)
    try:
        time.sleep(LEASE_SECONDS * 2)  # longer than the Lease
    finally:
        env.cluster.signal_apiserver(signal.SIGCONT)


def toxic(kind: str, seconds: float, **attributes: int) -> Callable[[ChaosEnv], None]:
    def fault(env: ChaosEnv) -> None:
        with env.toxiproxy.toxic("op-a", kind, **attributes):
            time.sleep(seconds)

    return fault


def http_fault(fault: Fault) -> Callable[[ChaosEnv], None]:
    def run(env: ChaosEnv) -> None:
        env.proxy.inject(fault)
        try:
            wait_for(
                "the fault to end", lambda: not env.proxy.active, timeout=fault.duration_s + 30
            )
        finally:
            env.proxy.clear()

    return run


FAULTS: dict[str, Callable[[ChaosEnv], None]] = {
    "apiserver SIGKILL + restart": sigkill_apiserver,
    f"apiserver SIGSTOP {LEASE_SECONDS * 2}s (Lease {LEASE_SECONDS}s)": sigstop_apiserver,
    "30s of connection resets": toxic("reset_peer", 30.0, timeout=0),
    "2s latency on every request": toxic("latency", FAULT_S, latency=2000),
    "20% of writes 409": http_fault(Fault(409, 0.2, writes_only=True, duration_s=FAULT_S)),
    "10% of requests 429 + Retry-After": http_fault(
        Fault(429, 0.1, retry_after_s=1, duration_s=FAULT_S)
    ),
    "every watch ended with 410 Gone": http_fault(
        Fault(410, 1.0, watches_only=True, duration_s=FAULT_S)
    ),
}


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
        f"{outcome.writes} writes (fault-free {reference.writes}), exits {outcome.exits}"
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


def test_operator_sigkill_at_every_upgrade_state(
    env: ChaosEnv, baseline: tuple[Outcome, dict[str, Any]]
) -> None:
    """The operator is killed (no goodbye) the first time any node is seen in each upgrade
    state; a new process (after the Lease expired) finishes without repeating a node."""
    killed_at: list[str] = []
    stop = threading.Event()

    def killer() -> None:
        operator = env.operators["a"]
        while not stop.is_set():
            try:
                nodes = env.kube.list_objects("Node")
            except Exception:
                time.sleep(0.2)
                continue
            states = {n["metadata"].get("labels", {}).get(STATE) for n in nodes}
            for state in IN_PROGRESS:
                if state in states and state not in killed_at:
                    killed_at.append(state)
                    operator.kill(signal.SIGKILL)
                    break
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)

    def fault() -> None:
        thread.start()

    try:
        outcome = env.run("operator SIGKILL at every upgrade state", fault)
    finally:
        stop.set()
        thread.join(10)
    print(f"\nkilled at: {killed_at}")
    assert killed_at, "no upgrade state was ever seen"
    judge(env, outcome, baseline)


def test_leader_network_cut_moves_leadership_and_the_old_leader_stops_first(
    env: ChaosEnv, baseline: tuple[Outcome, dict[str, Any]]
) -> None:
    standby = env.start_operator("b")
    wait_for("the standby is up", lambda: standby.healthz()[1].get("role") == "standby")
    cut: dict[str, datetime] = {}

    def fault() -> None:
        from datetime import UTC

        cut["start"] = datetime.now(UTC)
        with env.toxiproxy.toxic("op-a", "timeout", both=True, timeout=0):
            wait_for(
                "the standby to lead",
                lambda: standby.healthz()[1].get("role") == "leader",
                timeout=LEASE_SECONDS * 6,
            )
            time.sleep(LEASE_SECONDS)
        cut["end"] = datetime.now(UTC)

    try:
        outcome = env.run("leader network cut, standby healthy", fault)
        judge(env, outcome, baseline)
        writes = env.writes({env.user("a"), env.user("b")}, cut["start"], cut["end"])
        a = [e for e in writes if e["user"]["username"] == env.user("a")]
        b = [e for e in writes if e["user"]["username"] == env.user("b")]
        assert b, "the standby never wrote"
        first_b = min(stamp(e) for e in b)
        # The old leader's last write landed before the new leader's first: never two writers.
        assert all(stamp(e) < first_b for e in a), "the old leader wrote after the new one began"
        handover = (first_b - cut["start"]).total_seconds()
        print(f"leader hand-over: {handover:.1f}s after the cut (Lease {LEASE_SECONDS}s)")
        assert env.operators["a"].exits and env.operators["a"].exits[0] != 0
    finally:
        standby.stop()
        del env.operators["b"]
