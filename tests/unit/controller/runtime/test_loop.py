"""When passes run: woken, requeued, resynced, retried after a failure, never before ready."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from gpu_operator.controller.runtime import loop as loop_module
from gpu_operator.controller.runtime.loop import Loop, Refusals, earliest
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from tests.unit.controller.builders import CONFIG

Script = Callable[[int, bool], Awaitable[float | None]]


class Recorder:
    """A pass that records its ``resync`` flags, follows a script, and says when it ran n times."""

    def __init__(self, script: Script | None = None) -> None:
        self.calls: list[bool] = []
        self.script = script
        self.changed = asyncio.Event()

    async def __call__(self, resync: bool) -> float | None:
        self.calls.append(resync)
        self.changed.set()
        if self.script is None:
            return None
        return await self.script(len(self.calls), resync)

    async def until(self, n: int) -> None:
        while len(self.calls) < n:
            self.changed.clear()
            await self.changed.wait()


def scenario(
    body: Callable[[Loop, Recorder], Awaitable[None]],
    *,
    script: Script | None = None,
    resync_seconds: float = 3600.0,
) -> tuple[Recorder, PrometheusMetrics]:
    metrics = PrometheusMetrics()

    async def main() -> Recorder:
        recorder = Recorder(script)
        config = replace(CONFIG, resync_seconds=resync_seconds, debounce_seconds=0.0)
        loop = Loop("test", recorder, config, metrics)
        task = asyncio.create_task(loop.run())
        try:
            await asyncio.wait_for(body(loop, recorder), timeout=30)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert loop.passes == len(recorder.calls)
        return recorder

    return asyncio.run(main()), metrics


def count(metrics: PrometheusMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_no_pass_runs_before_the_indexes_are_filled() -> None:
    async def body(loop: Loop, passes: Recorder) -> None:
        loop.wake.set()
        for _ in range(20):
            await asyncio.sleep(0)  # let the loop run as far as it can
        assert passes.calls == []
        loop.ready.set()
        await passes.until(1)

    passes, metrics = scenario(body)
    assert passes.calls == [False]
    assert count(metrics, "gpu_operator_reconcile_total") == 1
    assert count(metrics, "gpu_operator_reconcile_duration_seconds_count") == 1


def test_each_wake_runs_a_pass() -> None:
    async def body(loop: Loop, passes: Recorder) -> None:
        loop.ready.set()
        for n in (1, 2, 3):
            loop.wake.set()
            await passes.until(n)

    passes, _ = scenario(body)
    assert passes.calls == [False, False, False]


def test_the_resync_is_flagged_when_it_is_due() -> None:
    async def body(loop: Loop, passes: Recorder) -> None:
        loop.ready.set()
        loop.wake.set()
        await passes.until(1)

    passes, _ = scenario(body, resync_seconds=0.0)
    assert passes.calls == [True]


def test_a_requeue_time_runs_a_pass_unwoken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_module, "MIN_WAIT_S", 0.0)

    async def due_now(n: int, resync: bool) -> float | None:
        return time.time() if n == 1 else None

    async def body(loop: Loop, passes: Recorder) -> None:
        loop.ready.set()
        loop.wake.set()
        await passes.until(2)  # the second pass came from the requeue alone

    passes, _ = scenario(body, script=due_now)
    assert passes.calls == [False, False]


def test_a_failed_pass_is_counted_and_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_module, "FAILED_PASS_RETRY_S", 0.0)

    async def fails_once(n: int, resync: bool) -> float | None:
        if n == 1:
            raise RuntimeError("API server gone")
        return None

    async def body(loop: Loop, passes: Recorder) -> None:
        loop.ready.set()
        loop.wake.set()
        await passes.until(2)

    _, metrics = scenario(body, script=fails_once)
    assert count(metrics, "gpu_operator_reconcile_errors_total") == 1
    assert count(metrics, "gpu_operator_reconcile_total") == 2


def test_a_cancelled_pass_stops_the_loop() -> None:
    async def cancelled(n: int, resync: bool) -> float | None:
        raise asyncio.CancelledError

    async def body(loop: Loop, passes: Recorder) -> None:
        loop.ready.set()
        loop.wake.set()
        await passes.until(1)

    _, metrics = scenario(body, script=cancelled)
    assert count(metrics, "gpu_operator_reconcile_errors_total") == 0


def test_refused_passes_retry_at_once_then_thin_out_and_a_clean_pass_resets() -> None:
    refusals = Refusals()
    delays = [refusals.retry_at(True, 100.0) for _ in range(8)]
    assert [d - 100.0 for d in delays if d is not None] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
        30.0,
    ]
    assert refusals.retry_at(False, 100.0) is None
    assert refusals.retry_at(True, 100.0) == 101.0


def test_earliest_of_requeue_times() -> None:
    assert earliest(None, None) is None
    assert earliest(5.0, None, 3.0) == 3.0
