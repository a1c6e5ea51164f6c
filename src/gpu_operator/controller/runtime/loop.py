"""The shape every reconcile loop shares: wait to be woken (or for a requeue time, or the
safety-net resync), let a burst of events settle, run one pass, and retry a failed pass soon.

While events keep coming (hundreds of pods rolling out), the settling time grows with what the
last pass cost, so passes take at most ``PASS_CPU_SHARE`` of a CPU and each one folds in
everything that changed meanwhile, instead of deciding the whole fleet again per event. An
urgent change (a node to label, an edited policy) cuts the settling short.

A pass is ``observe -> decide -> execute -> remember``; this module only schedules passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.metrics import PrometheusMetrics

log = logging.getLogger(__name__)

FAILED_PASS_RETRY_S = 2.0
MIN_WAIT_S = 1.0
PASS_CPU_SHARE = 0.02
ROLLOUT_SETTLE_S = 3.0  # at least, between passes while only pods and DaemonSets move
MAX_SETTLE_S = 30.0  # the status of a 5,000-node rollout moves at least this often
REFUSED_RETRY_S = 1.0  # a pass with refused writes looks again this soon, doubling while they go on
MAX_REFUSED_RETRY_S = 30.0

# A pass gets whether it is the safety-net resync; it returns when to look again (unix
# seconds) even if nothing changes, or None.
Pass = Callable[[bool], Awaitable[float | None]]


@dataclass
class Refusals:
    """When a pass whose writes were refused looks again.

    A refused write brings no watch event (it changed nothing), so without this the next try
    waits for some unrelated change or the resync, minutes later. Most refusals pass (a
    conflict, a throttle, a flaky link): the first retry comes at once; while passes go on
    being refused (a missing RBAC rule, an admission webhook) the retries thin out, so a
    standing refusal does not become a request a second."""

    in_a_row: int = 0

    def retry_at(self, refused: bool, now: float) -> float | None:
        """After a pass: when to look again because of its refusals (unix seconds), or None."""
        if not refused:
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        return now + min(MAX_REFUSED_RETRY_S, REFUSED_RETRY_S * 2.0 ** (self.in_a_row - 1))


def earliest(*times: float | None) -> float | None:
    """The first of some requeue times, None when there are none."""
    known = [t for t in times if t is not None]
    return min(known) if known else None


class Loop:
    """Runs one reconciler's pass whenever something it watches changes, and never two at
    once: events gather into one pass (a settle time that grows with the last pass's CPU,
    cut short by an urgent event, then the debounce), a failed pass is retried, and a full
    resync bounds what a lost event could hide. Liveness reads ``pass_started``."""

    def __init__(
        self, name: str, run_pass: Pass, config: OperatorConfig, metrics: PrometheusMetrics
    ) -> None:
        self.name = name
        self.run_pass = run_pass
        self.config = config
        self.metrics = metrics
        self.wake = asyncio.Event()
        self.urgent = asyncio.Event()  # with wake: pass after the debounce, not the settling
        self.ready = asyncio.Event()  # set once what the passes read is filled
        self.passes = 0
        self.pass_started: float | None = None  # monotonic, while a pass runs (liveness)
        self.failing_since: float | None = None  # monotonic, first of the failing passes
        self.settle_s = config.debounce_seconds  # before the next pass
        self.refusals = Refusals()  # the pass tells it whether its writes were refused

    async def run(self) -> None:
        await self.ready.wait()
        next_resync = time.monotonic() + self.config.resync_seconds
        requeue_at: float | None = None
        while True:
            timeout = next_resync - time.monotonic()
            if requeue_at is not None:
                timeout = min(timeout, requeue_at - time.time())
            with contextlib.suppress(TimeoutError):  # woken by an event, or it is time
                await asyncio.wait_for(self.wake.wait(), timeout=max(MIN_WAIT_S, timeout))
            resync = time.monotonic() >= next_resync
            if resync:
                next_resync = time.monotonic() + self.config.resync_seconds
            if not self.urgent.is_set():  # let a burst settle
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.urgent.wait(), timeout=self.settle_s)
            await asyncio.sleep(self.config.debounce_seconds)
            self.wake.clear()
            self.urgent.clear()
            started = self.pass_started = time.monotonic()
            cpu_started = time.thread_time()
            self.metrics.reconciles.inc()
            try:
                requeue_at = await self.run_pass(resync)
                self.failing_since = None
            except asyncio.CancelledError:
                raise
            except Exception:
                if self.failing_since is None:
                    self.failing_since = started
                self.metrics.reconcile_errors.inc()
                log.exception("%s pass failed; retrying", self.name)
                await asyncio.sleep(FAILED_PASS_RETRY_S)
                self.wake.set()
            finally:
                self.pass_started = None
                self.passes += 1
                self.settle_s = settle_time(time.thread_time() - cpu_started, self.config)
                elapsed = time.monotonic() - started
                self.metrics.reconcile_seconds.observe(elapsed)
                log.debug("%s pass %d took %.2fs", self.name, self.passes, elapsed)


def settle_time(pass_cpu_s: float, config: OperatorConfig) -> float:
    """How long to let non-urgent events gather after a pass that cost ``pass_cpu_s`` of CPU
    (the debounce follows)."""
    spread = pass_cpu_s * (1 / PASS_CPU_SHARE - 1)
    return min(MAX_SETTLE_S, max(ROLLOUT_SETTLE_S, spread))
