"""The API server down for 5 minutes, longer than kopf's 9 request attempts: the
operator keeps retrying or exits non-zero and is restarted, never stays alive but deaf, and
``/healthz`` says which.

A scenario of its own (its own cluster, about 9 minutes, mostly waiting: ``make test`` runs it on
a worker of its own beside the rest). ``CHAOS_OUTAGE_S`` shortens the outage for a quick local
run (default 300 s).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.chaos.harness import AFTER_OUTAGE_S, ChaosEnv

OUTAGE_S = float(os.environ.get("CHAOS_OUTAGE_S") or 300)


@pytest.mark.timeout(OUTAGE_S + AFTER_OUTAGE_S + 600)
def test_five_minutes_without_an_api_server(env: ChaosEnv) -> None:
    operator = env.operators["a"]
    samples: list[tuple[int, str]] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.wait(2.0):
            code, body = operator.healthz()
            samples.append((code, str(body.get("status", ""))))

    def outage() -> None:
        thread = threading.Thread(target=probe, daemon=True)
        thread.start()
        try:
            env.cluster.restart_apiserver(down_s=OUTAGE_S)
        finally:
            stop.set()
            thread.join(10)

    # A first round moves the driver to the other version, so that the outage's round rolls it
    # back: kcm's DaemonSet controller must then bump an old ControllerRevision, the step that
    # fails on a stale cache (the failures this scenario used to have, under load).
    env.run("a round before the outage", None)
    started = time.monotonic()
    outcome = env.run(f"apiserver down {OUTAGE_S:.0f}s", outage, AFTER_OUTAGE_S)
    print(
        f"\noutage of {OUTAGE_S:.0f}s: converged {outcome.converge_s}s after it, exits "
        f"{outcome.exits}, /healthz samples {sorted(set(samples))} "
        f"({time.monotonic() - started:.0f}s in all)"
    )
    answered = [s for s in samples if s[0]]
    # Every answer says what the operator is doing: retrying (200), deaf (503, then it exits),
    # or a restarted process waiting as a standby / leading again.
    assert all(status in ("ok", "retrying", "deaf") for _, status in answered), samples
    assert all((code == 503) == (status == "deaf") for code, status in answered), samples
    deaf = any(status == "deaf" for _, status in answered)
    if deaf:
        assert any(code != 0 for code in outcome.exits), "deaf but never exited non-zero"
    assert all(code != 0 for code in outcome.exits), f"an exit reported success: {outcome.exits}"
    assert outcome.user_changes == []
