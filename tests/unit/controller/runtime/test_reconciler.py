"""The generic pass every loop runs: observe -> decide -> execute -> remember, the writes'
tallies, and the quick retry after refused writes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from gpu_operator.controller.runtime.actions import Create, Outcome, Patch
from gpu_operator.controller.runtime.loop import MAX_REFUSED_RETRY_S, REFUSED_RETRY_S, Loop
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.controller.runtime.reconciler import run_pass
from tests.unit.controller.builders import CONFIG

TALLIED = Create({"kind": "Event"}, tally=("rollout_failures", "validator"))
LABELS = Patch("Node", "gpu-1", {"metadata": {}}, "labels")


@dataclass(frozen=True)
class Decision:
    requeue_at: float | None = None


@dataclass
class Script:
    """A reconciler whose writes come out as told, recording what the pass asked of it."""

    outcomes: list[Outcome] = field(default_factory=list)
    requeue_at: float | None = None
    fail: bool = False
    calls: list[str] = field(default_factory=list)
    loop: Loop = field(init=False)

    def __post_init__(self) -> None:
        self.loop = Loop(
            "script", lambda resync: run_pass(self, resync), CONFIG, PrometheusMetrics()
        )

    async def observe(self, resync: bool) -> str:
        self.calls.append(f"observe resync={resync}")
        return "snapshot"

    def decide(self, snapshot: str) -> Decision:
        self.calls.append(f"decide {snapshot}")
        return Decision(self.requeue_at)

    async def execute(self, decision: Decision) -> list[Outcome]:
        self.calls.append("execute")
        if self.fail:
            raise RuntimeError("the API server went away")
        return self.outcomes

    def remember(self, decision: Decision, outcomes: list[Outcome]) -> None:
        self.calls.append(f"remember {len(outcomes)}")


def tallied(script: Script) -> float:
    registry = script.loop.metrics.registry
    name = "gpu_operator_driver_rollout_failures_total"
    return registry.get_sample_value(name, {"gate": "validator"}) or 0.0


def test_a_pass_runs_the_steps_in_order_and_returns_the_decisions_requeue() -> None:
    script = Script([Outcome(TALLIED), Outcome(LABELS)], requeue_at=1234.5)
    assert asyncio.run(run_pass(script, True)) == 1234.5
    assert script.calls == ["observe resync=True", "decide snapshot", "execute", "remember 2"]
    assert tallied(script) == 1  # the successful write's tally, once
    assert script.loop.refusals.in_a_row == 0


def test_refused_writes_are_retried_soon_and_less_often_while_refused() -> None:
    """No watch event follows a refused write: the pass itself asks to look again."""
    script = Script(
        [Outcome(TALLIED, 403, "forbidden"), Outcome(LABELS)], requeue_at=time.time() + 3600
    )
    start = time.time()
    first = asyncio.run(run_pass(script, False))
    second = asyncio.run(run_pass(script, False))
    end = time.time()
    assert first is not None and start + REFUSED_RETRY_S <= first <= end + REFUSED_RETRY_S
    assert second is not None and second - end <= min(MAX_REFUSED_RETRY_S, 2 * REFUSED_RETRY_S)
    assert second > first and tallied(script) == 0  # a refused write counts nothing
    script.outcomes = [Outcome(LABELS)]
    assert asyncio.run(run_pass(script, False)) == script.requeue_at
    assert script.loop.refusals.in_a_row == 0


def test_a_failed_execution_remembers_nothing() -> None:
    """The loop retries the whole pass; what was half-written is read again, not assumed."""
    script = Script(fail=True)
    with pytest.raises(RuntimeError):
        asyncio.run(run_pass(script, False))
    assert script.calls == ["observe resync=False", "decide snapshot", "execute"]
